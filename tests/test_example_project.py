"""The copyable example project (``examples/my_project/``) works as a newcomer would use it: its data
loader writes the digits, its DAG folder imports into a DagBag with no import error, and its search runs
end to end through Airflow (``dag.test()``) with its own builder module, ranking every configuration."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import REPO

pytestmark = pytest.mark.integration

PROJECT = REPO / "examples" / "my_project"


def test_the_data_loader_writes_the_digits_without_a_download(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "train.parquet"
    done = subprocess.run([sys.executable, str(PROJECT / "make_data.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    table = pq.read_table(out)
    assert table.num_rows == 1797 and len(table.column_names) == 65
    digits = table.column("digit").to_pylist()
    assert sorted(set(digits)) == list(range(10))
    pixels = table.column("px20").to_pylist()
    assert 0.0 <= min(pixels) and max(pixels) <= 1.0


def test_the_example_project_imports_into_a_dagbag_and_its_search_runs_end_to_end(airflow_db, session_dir,
                                                                                 tmp_path, monkeypatch):
    from airflow.models.dagbag import DagBag

    sys.path.insert(0, str(PROJECT))
    try:
        from make_data import make_digits
    finally:
        sys.path.remove(str(PROJECT))
    data = make_digits(tmp_path / "data" / "digits.parquet")
    monkeypatch.setenv("MY_PROJECT_DATA", str(data))
    monkeypatch.setenv("MOP_HOME", str(tmp_path / "home"))  # the spec's default store goes here

    bag = DagBag(dag_folder=str(PROJECT / "dags"))
    assert bag.import_errors == {}
    assert list(bag.dag_ids) == ["my_selection"]

    # dag.test() runs the DAG from the session's DAG folder: the project's two files copied there, as a user
    # copies them into theirs; the builder module is found beside the DAG file, as on a worker
    folder = session_dir / "dags"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("my_selection.py", "my_models.py"):
        shutil.copy(PROJECT / "dags" / name, folder / name)
    monkeypatch.syspath_prepend(str(folder))
    dag = DagBag(dag_folder=str(folder / "my_selection.py")).get_dag("my_selection")
    assert len([t for t in dag.task_ids if t.startswith("train_shard_")]) == 3  # a train task per shard
    run = dag.test()
    assert run.state == "success"

    store = Store(f"file://{tmp_path / 'home' / 'store'}")
    layout = RunLayout(store, "my_selection", run.run_id)
    board = store.read_json(layout.report_uri("leaderboard.json"))
    rows = board["leaderboard"]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert sorted(r["learning_rate"] for r in rows) == [1e-3, 1e-2, 3e-2]
    assert all(r["outcome"] == "finished" for r in rows)
    assert rows[0]["val_accuracy"] > 0.5  # the digits learn in 2 passes; a broken hop would sit near 0.1
    summary = store.read_json(layout.report_uri("summary.json"))
    assert summary["model_hops"] == 3 * 3 * 2  # 3 configurations x 3 shards x 2 iterations
    assert store.exists(layout.report_uri("best_model.keras"))


def test_check_on_the_example_dag_file_says_what_would_run_in_a_few_readable_lines(tmp_path):
    """The README's step 3: `mop-airflow check my_dags/my_selection.py` as a newcomer types it, in a process of
    its own. Its output is the check's own lines: the 64 pixel columns shortened, and none of the lines the
    libraries log when imported (Great Expectations' registrations, TensorFlow's CPU notes)."""
    data = subprocess.run([sys.executable, str(PROJECT / "make_data.py"), "--out", str(tmp_path / "digits.parquet")],
                          capture_output=True, text=True, timeout=300)
    assert data.returncode == 0, data.stderr[-2000:]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run([str(Path(sys.executable).with_name("mop-airflow")), "check", str(PROJECT / "dags" / "my_selection.py")],
                          capture_output=True, text=True, timeout=300,
                          env={**env, "MY_PROJECT_DATA": str(tmp_path / "digits.parquet")})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("my_selection: spec valid; Grid search, 3 configurations")
    assert lines[1] == ("  would train 3 configuration(s) (1 builder(s)) on 3 shard(s) x 1 slot(s), 1 block(s) a DAG "
                        "run, 14 task(s) a DAG run")
    assert lines[2] == ("  data valid: 1797 row(s) in 1 file(s), 359 for validation; inputs px0, px1, px2, px3, px4, "
                        "..., px63 (64 in all); label digit (classification, 10 classes)")
    assert lines[3].startswith("  models: 1 distinct model(s) built and compiled, a step trained on 8 rows")
    assert len(lines) == 4
    both = done.stdout + done.stderr
    assert "Skipping registering function" not in both and "great_expectations" not in both
    assert "cpu_feature_guard" not in both
