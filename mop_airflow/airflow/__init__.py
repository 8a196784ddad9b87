"""The DAG factory: the task plan rendered into Airflow tasks (render.py), as a whole MOP DAG
(dag.py: ``build_mop_dag``) or as a ``MopTaskGroup`` inside any DAG (group.py), and the provider's
metadata Airflow lists (provider.py).

Running Airflow is not here: the embedded Airflow, the Celery, Helm and Kubernetes configuration and
the preload hook are :mod:`mop_airflow.deployment`, and following a run through the REST API is
:mod:`mop_airflow.monitor`. The old paths of the moved modules the documentation published
(``local``, ``preload``, ``shard_pods``) still import from here, with a ``DeprecationWarning``."""
