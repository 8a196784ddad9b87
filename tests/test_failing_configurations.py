"""Grid search through Airflow (dag.test) with configurations that fail: the others finish.

The builder ``tests.training.toys:narrow_only`` raises for ``units`` above 100, and SGD at a
learning rate of 1e12 drives the loss to NaN within the first hop. Of the four configurations of
``units [32, 200] x learning_rate [0.1, 1e12]`` one trains to the end: it wins, the other three are
marked failed or diverged with their reason. ``search.fail_fast`` fails the run at the first one.
"""

import pytest

from mop_airflow.errors import TrainingError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import RunRecord
from mop_airflow.results.report import write_report
from mop_airflow.config import MopSpec
from mop_airflow.store import Store
from tests.conftest import write_dag_file
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = pytest.mark.integration

NARROW = "tests.training.toys:narrow_only"


def failing_spec(source, root, *, learning_rates=(0.1, 1e12), units=(32, 200), fail_fast=False):
    spec = tiny_spec(source, root, iterations=1)
    spec["search"]["space"] = {"method": "grid", "params": {
        "model": [NARROW], "optimizer": ["sgd"], "learning_rate": list(learning_rates), "batch_size": [32],
        "hparams": {"units": list(units)}}}
    spec["search"]["fail_fast"] = fail_fast
    return spec


def by_params(spec):
    return {(c["hparams"]["units"], c["optimizer_params"]["learning_rate"]): c["config_id"]
            for c in MopSpec.from_dict(spec).configurations()}


def test_failing_configurations_are_marked_with_their_reason_and_the_rest_finish(airflow_db, tmp_path):
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    spec = failing_spec(source, root)
    ids = by_params(spec)
    dag_run = write_dag_file("mop_some_fail", spec).test()
    assert dag_run.state == "success"

    store = Store(root)
    layout = RunLayout(store, "mop_some_fail", dag_run.run_id)
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    rows = {row["config_id"]: row for row in board}
    winner = ids[(32, 0.1)]
    assert board[0]["config_id"] == winner and rows[winner]["status"] == "finished"
    assert rows[winner]["val_accuracy"] > 0.5

    diverged = rows[ids[(32, 1e12)]]
    assert diverged["status"] == "diverged" and diverged["val_accuracy"] is None
    assert diverged["outcome"].startswith("diverged at hop 0 (iteration 0, shard ")
    assert "loss=nan" in diverged["outcome"] and "Fix: lower the learning rate" in diverged["outcome"]
    for rate in (0.1, 1e12):
        failed = rows[ids[(200, rate)]]
        assert failed["status"] == "failed" and failed["rank"] > 2
        assert "ValueError: units=200 is too wide for this builder" in failed["outcome"]

    summary = store.read_json(layout.report_uri("summary.json"))
    assert summary["outcomes"] == {"finished": 1, "diverged": 1, "failed": 2}
    assert {f["config_id"] for f in summary["failed"]} == set(ids.values()) - {winner}
    assert summary["best"]["config_id"] == winner and store.exists(summary["best_model_uri"])

    # a failing configuration stops at its failing hop; the others train on, and no task failed
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances() if "train_shard_" in ti.task_id}
    assert "failed" not in set(states.values()) and len(states) == 2
    for cid in set(ids.values()) - {winner}:
        # its next hop, on the other shard, is settled where it was due (repeating the failure), never trained
        settled = store.read_json(layout.hop_record_uri(cid, 1))
        assert settled["dropped_after"] == 0 and settled["status"] == rows[cid]["status"]
        assert not store.exists(layout.hop_record_uri(cid, 2))


def test_fail_fast_fails_the_run_at_the_first_failing_configuration(airflow_db, tmp_path):
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    spec = failing_spec(source, root, units=(32,), fail_fast=True)
    dag_run = write_dag_file("mop_fail_fast", spec).test()
    assert dag_run.state == "failed"
    failed = [ti for ti in dag_run.get_task_instances() if ti.state == "failed"]
    # the train tasks that met the diverging configuration's first hop, not retried (a retry would diverge again)
    assert {(ti.task_id.startswith("train_shard_"), ti.try_number) for ti in failed} == {(True, 1)}
    layout = RunLayout(Store(root), "mop_fail_fast", dag_run.run_id)
    assert not layout.store.exists(layout.hop_record_uri(by_params(spec)[(32, 1e12)], 0))  # ended there
    report = next(ti for ti in dag_run.get_task_instances() if ti.task_id == "report")
    assert report.state == "upstream_failed"
    assert not Store(root).exists(RunLayout(Store(root), "mop_fail_fast", dag_run.run_id).report_uri("summary.json"))


def test_a_run_where_every_configuration_fails_fails_at_the_report_naming_each_reason(airflow_db, tmp_path):
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    spec = failing_spec(source, root, learning_rates=(1e12, 1e13), units=(32,))
    dag_run = write_dag_file("mop_all_fail", spec).test()
    assert dag_run.state == "failed"
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances() if "train_shard_" not in ti.task_id}
    assert states["report"] == "failed"

    store = Store(root)
    layout = RunLayout(store, "mop_all_fail", dag_run.run_id)
    assert not store.exists(layout.report_uri("summary.json"))
    run = RunRecord.read(store, layout.run_record_uri)
    with pytest.raises(TrainingError, match=r"no configuration of run .* finished with a val_accuracy: "
                                            r"c000-\w+ diverged at hop 0 .*loss=nan.*; c001-\w+ diverged"):
        write_report(layout, run, cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("fail_fast", [False, True])
def test_a_model_that_cannot_train_on_the_data_fails_the_run_before_any_hop(airflow_db, tmp_path, fail_fast):
    """A builder failing for all its configurations is a mistake in the DAG; with fail_fast, any failure is."""
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    spec = failing_spec(source, root, fail_fast=fail_fast)
    if not fail_fast:  # expects 5 features whatever the data has (digits has 64)
        spec["search"]["space"]["params"]["model"] = ["tests.training.toys:fixed_input"]
    dag_run = write_dag_file(f"mop_unfit_{int(fail_fast)}", spec).test()
    assert dag_run.state == "failed"
    states = {ti.task_id: (ti.state, ti.try_number) for ti in dag_run.get_task_instances()}
    assert states["check_models"] == ("failed", 1)
    assert not any(state == "success" for task, (state, _) in states.items() if "train_shard_" in task)
    layout = RunLayout(Store(root), f"mop_unfit_{int(fail_fast)}", dag_run.run_id)
    assert not Store(root).glob(layout.hops_glob)  # nothing trained
