"""MOP on Kubernetes, as plain data: the shape a cluster must hold (:mod:`.shape`), the values file of
the official Apache Airflow Helm chart with a Celery worker set per shard (:mod:`.helm_values`), and
the pod of a shard task for the KubernetesExecutor (:mod:`.pods`). Imports neither Airflow nor the
Kubernetes client; only :func:`mop_airflow.kubernetes.pods.executor_config` needs the client."""
