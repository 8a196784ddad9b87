"""The ``mop-airflow`` command: :mod:`.main` assembles the parser from one module per command family."""
