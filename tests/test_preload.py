"""Keras is preloaded only where Airflow forks task processes."""

from mop_airflow.deployment.preload import is_task_host


def test_only_task_hosts_preload():
    assert is_task_host(["airflow", "celery", "worker", "--queues", "mop_shard_0"], "CeleryExecutor")
    assert is_task_host(["airflow", "scheduler"], "LocalExecutor")
    assert not is_task_host(["airflow", "scheduler"], "CeleryExecutor")  # Celery tasks never fork from it
    for service in ("api-server", "dag-processor", "triggerer"):
        assert not is_task_host(["airflow", service], "LocalExecutor")
    assert not is_task_host(["airflow", "celery", "flower"], "CeleryExecutor")
