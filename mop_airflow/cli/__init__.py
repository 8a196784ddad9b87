"""The ``mop-airflow`` command (:mod:`.main`): run the demo, plan and simulate, read runs, manage pools."""
