"""A tiny MOP DAG on a real Airflow: api-server, scheduler and dag-processor as processes.

Checks what dag.test() cannot: the pool check fails a run at once when the shard pools are missing
(instead of leaving it in "scheduled" for ever), and with `mop-airflow pools sync` the same DAG
runs to success with every training task on its shard's pool and queue, one mapped task instance
per configuration.
"""

import json
import subprocess
import sys

import pytest

from mop_airflow.layout import RunLayout
from mop_airflow.airflow.local import LocalAirflow
from mop_airflow.store import Store
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = pytest.mark.integration

DAG_ID = "mop_real_scheduler"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    dags = root / "dags"
    dags.mkdir()
    write_digits(root / "digits.parquet")
    spec = tiny_spec(root / "digits.parquet", f"file://{root / 'store'}")
    spec["schedule"]["iterations"] = 1
    spec["search"]["space"]["params"]["learning_rate"] = [3e-3, 1e-2]
    (dags / f"{DAG_ID}.py").write_text(
        "import json\nfrom mop_airflow import build_mop_dag\n"
        f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={DAG_ID!r})\n")
    with LocalAirflow(root / "airflow", dags, extra_env={"MOP_AIRFLOW_HOME": str(root / "mop")}) as af:
        af.wait_for_dag(DAG_ID)
        af.root = root
        yield af
    assert not any(af.alive().values())


def test_missing_pools_fail_the_run_fast_with_the_fix(airflow):
    run_id = airflow.trigger(DAG_ID)
    state = airflow.wait_for_run(DAG_ID, run_id, timeout=240)
    assert state == "failed"
    states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(DAG_ID, run_id)}
    assert states["preflight"] == "failed"
    assert states["list_data"] == "upstream_failed"
    log = airflow.task_log(DAG_ID, run_id, "preflight")
    assert "mop_shard_0" in log and "mop_shard_1" in log
    assert "mop-airflow pools sync --shards 2 --slots 1" in log


def test_run_with_pools_succeeds_on_shard_pools_and_queues(airflow):
    sync = subprocess.run([sys.executable, "-m", "mop_airflow.cli", "pools", "sync", "--shards", "2"],
                          env=airflow.env, capture_output=True, text=True)
    assert sync.returncode == 0, sync.stderr
    run_id = airflow.trigger(DAG_ID)
    assert airflow.wait_for_run(DAG_ID, run_id, timeout=420) == "success"
    tis = airflow.task_instances(DAG_ID, run_id)
    train = [ti for ti in tis if ".hop_" in ti["task_id"]]
    # 2 configurations x 2 hops, each configuration its own mapped task instance, named by its id
    assert len(train) == 4 and all(ti["state"] == "success" for ti in train)
    for ti in train:
        shard = ti["task_id"].rsplit("_", 1)[1]
        assert ti["pool"] == ti["queue"] == f"mop_shard_{shard}"
        assert ti["map_index"] >= 0 and ti["rendered_map_index"].startswith("c00")
    store = Store(f"file://{airflow.root / 'store'}")
    board = store.read_json(RunLayout(store, DAG_ID, run_id).report_uri("leaderboard.json"))
    assert len(board["leaderboard"]) == 2 and board["leaderboard"][0]["val_accuracy"] > 0.5
