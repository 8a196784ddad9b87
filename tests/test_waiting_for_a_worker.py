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
