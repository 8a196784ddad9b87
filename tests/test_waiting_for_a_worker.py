"""The results page says which task waits for a worker, and since when, where the progress line said
a time left: read from the metadata database by the page's API, as `mop-airflow status` reads it from
the REST API (a lost Celery worker's task, or a queue no worker serves)."""

import datetime as dt

import pytest

from tests.conftest import write_dag_file
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = pytest.mark.integration


def test_a_task_queued_with_no_worker_is_named_with_its_queue_and_since_when(airflow_db, tmp_path):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from mop_airflow.plugins.results_app import queued_without_worker

    source = tmp_path / "digits.parquet"
    write_digits(source)
    spec = tiny_spec(source, f"file://{tmp_path / 'store'}", iterations=1)
    run = write_dag_file("mop_waiting", spec).test()
    assert run.state == "success"
    now = dt.datetime.now(dt.timezone.utc)
    with create_session() as session:
        tis = {ti.task_id: ti for ti in session.scalars(select(TaskInstance).where(
            TaskInstance.dag_id == "mop_waiting", TaskInstance.run_id == run.run_id))}
        # shard 1's train task was handed to a worker that died 40 s ago; shard 0's was queued a moment ago
        for task_id, ago in (("train_shard_1", 40), ("train_shard_0", 3)):
            tis[task_id].state, tis[task_id].queued_dttm = "queued", now - dt.timedelta(seconds=ago)
            tis[task_id].queue = f"mop_shard_{task_id[-1]}"
        session.flush()
        waiting = queued_without_worker(session, "mop_waiting", run.run_id, None, now=now.timestamp())
        assert [(w["task_id"], w["queue"], round(now.timestamp() - w["since"])) for w in waiting] == [
            ("train_shard_1", "mop_shard_1", 40)]
        since = (now - dt.timedelta(seconds=40)).strftime("%H:%M:%S UTC")
        assert waiting[0]["line"] == f"train_shard_1 waiting for a worker on queue mop_shard_1 since {since} (40 s)"
        # another selection's tasks in the same DAG run are not this one's
        assert queued_without_worker(session, "mop_waiting", run.run_id, "other_group", now=now.timestamp()) == []
        session.rollback()


class _Config:
    """Airflow's configuration as the check reads it: the executor only."""

    def __init__(self, executor):
        self.executor = executor

    def get(self, section, key, fallback=None):
        assert (section, key) == ("core", "executor")
        return self.executor


def test_a_shard_queue_no_celery_worker_listens_on_is_refused_before_training(tmp_path):
    """A real Celery worker (on the Redis broker here) listening on shard 0's queue only: the check before
    training asks the workers which queues they listen on and refuses shard 1's, naming it and the fix;
    under another executor it asks nothing."""
    import subprocess
    import sys
    import time
    import uuid

    from celery import Celery

    from mop_airflow.errors import SpecError
    from mop_airflow.hooks.pools import check_queues_served

    token = uuid.uuid4().hex[:8]
    queues = [f"mop_shard_0_{token}", f"mop_shard_1_{token}"]  # unique: other workers on the broker serve others
    broker = "redis://127.0.0.1:6379/14"
    (tmp_path / "queue_app.py").write_text(f"from celery import Celery\napp = Celery('q', broker={broker!r})\n")
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "queue_app", "worker", "-Q", queues[0], "--pool",
                               "solo", "-n", f"w{token}@%h", "--without-gossip", "--without-mingle", "--loglevel",
                               "WARNING"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    app = Celery("q", broker=broker)
    try:
        def active():
            return app.control.inspect(timeout=2, destination=[f"w{token}@" + __import__("socket").gethostname()]
                                       ).active_queues()

        deadline = time.time() + 60
        while time.time() < deadline and not active():
            assert worker.poll() is None, worker.stderr.read().decode()[-2000:]
            time.sleep(0.5)
        check_queues_served(queues[:1], slots=2, config=_Config("CeleryExecutor"), active=active)  # served: passes
        with pytest.raises(SpecError) as refused:
            check_queues_served(queues, slots=2, config=_Config("CeleryExecutor"), active=active)
        message = str(refused.value)
        assert f"no Celery worker listens on queue(s) {queues[1]}" in message and queues[0] in message
        assert f"airflow celery worker --queues {queues[1]} --concurrency 2" in message
        check_queues_served(queues, slots=2, config=_Config("LocalExecutor"),
                            active=lambda: pytest.fail("asked the workers under a LocalExecutor"))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        app.close()
