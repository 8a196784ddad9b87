"""Running Airflow for MOP, beside the DAG files rather than in them:

- local.py: a real Airflow on this machine (``LocalAirflow``: SQLite and the LocalExecutor, or
  PostgreSQL with a Celery worker per shard; ``throwaway_postgres``, ``CeleryWorker``), for
  ``mop-airflow demo`` and ``up``, the tests and the benchmarks;
- preload.py: the hook a task host's ``airflow_local_settings.py`` calls, so Keras is imported once
  before Airflow forks the task processes;
- celery_config.py: a CeleryExecutor deployment's environment file (``mop-airflow celery config``);
- kubernetes_shape.py and helm_values.py: a cluster's shape checked, and the official chart's values
  (``mop-airflow k8s values``);
- shard_pods.py: ``ShardPods``, the shard tasks as Kubernetes pods, which the DAG factory takes
  (``build_mop_dag(..., kubernetes=ShardPods(...))``) and ``mop-airflow k8s volumes`` writes claims for.

The DAG factory (:mod:`mop_airflow.airflow`) imports ``ShardPods`` from here; nothing here imports the
DAG factory, and the core never imports this package."""
