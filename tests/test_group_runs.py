"""Reading the runs of MopTaskGroups: `runs`, `status`, `report`, `predict`, `export-best` and `champion`
with ``--group``, from the store alone and through Airflow's REST API.

The stored runs are a real run (test_predict_cli's tiny digits run, made once with dag.test())
written again where a group's run lives, ``<store>/<dag_id>.<group>/<run_id>/``, with its records'
``dag_id`` the selection id, as the group's tasks write them: ``etl.model_selection`` finished, and
``etl.challenger`` still training (no report). Airflow's side is the plain data its REST API
answers (task lists, task instances, XCom entries) for a DAG holding two groups.
"""

import json
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from mop_airflow.monitor.run_status import RunRef, busy_of, dag_selections, find_run
from mop_airflow.serving.champion import read_registry, registry_uri
from mop_airflow.cli.main import OK, UNAVAILABLE, USAGE, main
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import HopRecord, Plan, RunRecord, SlotStatus
from mop_airflow.store import Store, safe_segment
from mop_airflow.results.runs import stored_selections
from tests.test_predict_cli import _expected, run  # noqa: F401 - the module-scoped tiny run

pytestmark = pytest.mark.integration

DAG, GROUP, OTHER = "etl", "model_selection", "challenger"


def as_group_run(layout: RunLayout, root: Path, selection: str, run_id: str | None = None) -> RunLayout:
    """Copy the run's folder (and its shards) to ``root/<selection>/`` as a group's tasks would have written
    it (as run ``run_id``, by default the same): every record naming the store, the DAG's folder, the
    DAG id or the run id names the selection's instead."""
    old_root, run_id = layout.store.local_path(layout.store.root), run_id or layout.run_id
    target = RunLayout(Store(f"file://{root}"), selection, run_id)
    new = target.store.local_path(target.run_uri)
    shutil.copytree(layout.store.local_path(layout.run_uri), new)
    shutil.copytree(f"{old_root}/{layout.dag_id}/shards", f"{root}/{selection}/shards", dirs_exist_ok=True)
    moves = [(layout.store.local_path(layout.run_uri) + "/", new + "/"),
             (f"{old_root}/{layout.dag_id}/", f"{root}/{selection}/"), (old_root, str(root))]
    for path in [*Path(new).rglob("*.json"), *Path(root, selection, "shards").rglob("*.json")]:
        text = path.read_text()
        for before, after in moves:
            text = text.replace(before, after)
        data = json.loads(text)
        if isinstance(data, dict) and data.get("dag_id") == layout.dag_id:
            data["dag_id"] = selection
        if isinstance(data, dict) and data.get("run_id") == layout.run_id:
            data["run_id"] = run_id
        path.write_text(json.dumps(data))
    return target


@pytest.fixture(scope="module")
def groups(run, tmp_path_factory):  # noqa: F811 - the imported fixture
    """A store with two groups of DAG etl: model_selection (reported) and challenger (training)."""
    tmp, source, layout = run
    root = tmp_path_factory.mktemp("group_runs") / "store"
    done = as_group_run(layout, root, f"{DAG}.{GROUP}")
    going = as_group_run(layout, root, f"{DAG}.{OTHER}")
    shutil.rmtree(going.store.local_path(going.report_uri("")))  # the report task has not run yet
    for uri in going.store.glob(going.hops_glob):  # and only the first iteration's first hop is done
        if HopRecord.read(going.store, uri).t > 0:
            Path(going.store.local_path(uri)).unlink()
    return tmp, source, root, done, going


def _cli(root, *args):
    return main([*args, "--store", str(root)])


def test_the_stored_groups_are_found_and_a_dag_of_groups_needs_group(groups, capsys):
    tmp, _, root, done, going = groups
    store = done.store
    assert stored_selections(store, DAG) == [OTHER, GROUP]
    assert stored_selections(store, f"{DAG}.{GROUP}") == [None]
    assert stored_selections(store, "mop_predict_cli") == []

    for command in (["runs", DAG], ["status", DAG, "--once"], ["report", DAG], ["champion", "list", DAG]):
        assert _cli(root, *command) == USAGE, command
        err = capsys.readouterr().err
        assert (f"--group=None: DAG '{DAG}' holds its model selections in the task groups {OTHER}, {GROUP} "
                f"(runs in the store {store.root}), not in the DAG as a whole. Fix: name the group: "
                f"--group {OTHER}") in err, command
    assert _cli(root, "runs", DAG, "--group", "nope") == USAGE
    assert f"--group='nope': is not a model selection group of DAG '{DAG}'" in capsys.readouterr().err
    # a whole MOP DAG's runs: --group is a mistake, and without it everything reads as before
    assert _cli(tmp / "store", "runs", "mop_predict_cli", "--group", GROUP) == USAGE
    assert "is a whole MOP DAG (build_mop_dag; runs in the store" in capsys.readouterr().err
    assert _cli(tmp / "store", "runs", "mop_predict_cli") == OK


def test_runs_status_and_report_read_the_groups_own_runs(groups, capsys, tmp_path):
    _, _, root, done, going = groups
    summary = done.store.read_json(done.report_uri("summary.json"))
    best = summary["best"]
    assert _cli(root, "runs", DAG, "--group", GROUP) == OK
    out = capsys.readouterr().out
    assert f"Runs of {DAG}.{GROUP} (the store at" in out
    row = next(line for line in out.splitlines() if line.startswith(done.run_id)).split()
    assert row[1:] == ["finished", best["config_id"], f"val_accuracy={best['val_accuracy']:.4f}"]

    assert _cli(root, "runs", DAG, "--group", OTHER) == OK
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(going.run_id)).split()
    assert row[1:] == ["unfinished", "-", "-"]

    # the group still training: one hop of 2 (1 configuration x 2 shards x 1 iteration) recorded
    plan = Plan.read(going.store, going.plan_uri)
    assert plan.model_hops_total == 2
    assert _cli(root, "status", DAG, "--once", "--group", OTHER) == OK
    assert "unfinished (no report yet" in (line := capsys.readouterr().out) and "model hops 1/2, iteration 1/1" in line

    assert _cli(root, "report", DAG, "--group", GROUP, "--out", str(tmp_path / "report")) == OK
    out = capsys.readouterr().out
    assert out.startswith(f"{DAG}.{GROUP} / {done.run_id}: finished")
    written = json.loads((tmp_path / "report" / "leaderboard.json").read_text())
    assert written == done.store.read_json(done.report_uri("leaderboard.json"))
    assert written["leaderboard"][0]["config_id"] == best["config_id"]


def test_predict_export_and_the_champion_registry_of_a_group(groups, capsys, tmp_path):
    tmp, source, root, done, _ = groups
    _, expected = _expected(tmp, source, done)
    assert _cli(root, "predict", DAG, done.run_id, "--group", GROUP, "--source", str(source),
                "--out", str(tmp_path / "p.parquet")) == OK
    assert f"of {DAG}.{GROUP} / {done.run_id}" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "p.parquet")["response"].to_pylist() == expected.argmax(axis=1).tolist()
    assert _cli(root, "export-best", DAG, "--group", GROUP, "--out", str(tmp_path / "export")) == OK
    assert (tmp_path / "export" / "best_model.keras").read_bytes() == \
        done.store.read_bytes(done.report_uri("best_model.keras"))
    assert _cli(root, "predict", DAG, done.run_id, "--source", str(source), "--out", str(tmp_path / "x")) == USAGE
    capsys.readouterr()

    # the registry is the selection's: <store>/etl.model_selection/registry.json, its entries name the selection
    store = done.store
    assert _cli(root, "champion", "publish", DAG, done.run_id, "--group", GROUP, "--no-event") == OK
    assert f"{DAG}.{GROUP}: champion is now version 1: " in capsys.readouterr().out
    assert registry_uri(store, f"{DAG}.{GROUP}") == store.uri(f"{DAG}.{GROUP}", "registry.json")
    (entry,) = read_registry(store, f"{DAG}.{GROUP}")
    assert (entry["dag_id"], entry["run_id"], entry["model_uri"]) == (
        f"{DAG}.{GROUP}", done.run_id, done.report_uri("best_model.keras"))
    assert not store.exists(registry_uri(store, DAG)) and read_registry(store, f"{DAG}.{OTHER}") == []
    assert _cli(root, "champion", "list", DAG, "--group", GROUP) == OK
    assert f"* current champion: version 1: {entry['config_id']} of run {done.run_id}" in capsys.readouterr().out
    assert _cli(root, "predict", DAG, "--champion", "--group", GROUP, "--source", str(source), "--out",
                str(tmp_path / "c.parquet")) == OK
    assert f"champion of {DAG}.{GROUP}: version 1" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "c.parquet")["response"].to_pylist() == expected.argmax(axis=1).tolist()


# ---------------------------------------------------------------- Airflow's side, as its REST API answers
TASKS = ["extract", "deploy", *(f"{g}.{name}" for g in (GROUP, OTHER) for name in (
    "preflight", "list_data", "shard", "plan", "stage_shard_0", "stage_shard_1", "train_shard_0",
    "train_shard_1", "report", "publish"))]


class RestData:
    """The answers of Airflow's REST API for one run of DAG etl with two groups (paths as AirflowAPI asks)."""

    base_url = "http://airflow.test"

    def __init__(self, records, running=(), tasks=TASKS):
        self.records, self.running, self.tasks, self.asked = records, list(running), tasks, []

    def get(self, path, **params):
        from mop_airflow.errors import AirflowApiError

        self.asked.append(path)
        if path == f"/dags/{DAG}/tasks":
            return {"tasks": [{"task_id": t} for t in self.tasks], "total_entries": len(self.tasks)}
        if path == f"/dags/{DAG}/dagRuns":
            return {"dag_runs": [{"dag_run_id": "r1", "state": "running"}], "total_entries": 1}
        if path == f"/dags/{DAG}/dagRuns/r1":
            return {"dag_run_id": "r1", "state": "running"}
        prefix = f"/dags/{DAG}/dagRuns/r1/taskInstances/"
        if path.startswith(prefix) and path.endswith("/xcomEntries/return_value"):
            task_id = path[len(prefix):-len("/xcomEntries/return_value")]
            if task_id in self.records:
                return {"key": "return_value", "value": json.dumps(self.records[task_id])}
        raise AirflowApiError(f"GET {path} -> 404", status=404)

    def paged(self, path, key, **params):
        # running: busy shards; queued: tasks waiting for a worker (none here)
        assert path == f"/dags/{DAG}/dagRuns/r1/taskInstances" and params in ({"state": ["running"]},
                                                                               {"state": ["queued"]})
        return iter(self.running if params["state"] == ["running"] else [])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _record(layout):
    return RunRecord.read(layout.store, layout.run_record_uri).to_dict()


def test_the_dags_selections_come_from_its_preflight_task_ids():
    assert dag_selections(RestData({}), DAG) == [OTHER, GROUP]
    assert dag_selections(RestData({}, tasks=["preflight", "plan", "train_shard_0"]), DAG) == [None]
    assert dag_selections(RestData({}, tasks=["extract", "preflight_check", "x.preflights"]), DAG) == []


def test_busy_shards_count_only_the_groups_own_train_tasks_named_by_the_hop_they_train():
    running = [  # what GET .../taskInstances?state=running lists: both groups share the shard pools
        {"task_id": f"{GROUP}.train_shard_0", "pool": "mop_shard_0", "rendered_map_index": None},
        {"task_id": f"{OTHER}.train_shard_1", "pool": "mop_shard_1", "rendered_map_index": None},
        {"task_id": f"{OTHER}.stage_shard_1", "pool": "mop_shard_1", "rendered_map_index": None},
        {"task_id": "extract", "pool": "default_pool", "rendered_map_index": None},
        {"task_id": f"{GROUP}.stage_shard_1", "pool": "default_pool", "rendered_map_index": None},
    ]
    # what the slots' status files say (mop_airflow.results.progress.training_now)
    training = {f"{GROUP}.train_shard_0": "c001 t=2", f"{OTHER}.train_shard_1": "waiting for hops"}
    group = RunRef(DAG, "r1", "running", None, GROUP)
    assert busy_of(running, group, 2, training) == {0: ["c001 t=2"]}
    assert busy_of(running, RunRef(DAG, "r1", "running", None, OTHER), 2, training) == {
        1: ["waiting for hops", f"{OTHER}.stage_shard_1"]}
    # a whole MOP DAG's run: every task on a shard pool is its own; without statuses, the task ids
    assert busy_of(running, RunRef(DAG, "r1", "running", None), 2) == {
        0: [f"{GROUP}.train_shard_0"], 1: [f"{OTHER}.train_shard_1", f"{OTHER}.stage_shard_1"]}
    assert group.selection_id == f"{DAG}.{GROUP}" and not group.owns(f"{GROUP}x.report")


def test_find_run_reads_the_groups_preflight_and_its_folder(groups):
    _, _, root, done, going = groups
    api = RestData({f"{GROUP}.preflight": _record(done), f"{OTHER}.preflight": _record(going)})
    ref = find_run(api, DAG, "r1", group=OTHER)
    assert (ref.dag_id, ref.run_id, ref.group, ref.record.dag_id) == (DAG, "r1", OTHER, f"{DAG}.{OTHER}")
    assert api.asked[-1] == f"/dags/{DAG}/dagRuns/r1/taskInstances/{OTHER}.preflight/xcomEntries/return_value"
    layout = ref.layout(str(root))
    assert layout.run_uri == f"file://{root}/{DAG}.{OTHER}/{safe_segment('r1')}"
    # the whole DAG's preflight does not exist here: the run is not resolved as a whole-DAG selection
    assert find_run(api, DAG, "r1").record is None


def test_status_and_report_through_airflow_ask_for_the_groups_tasks(groups, capsys, monkeypatch, tmp_path):
    _, _, root, done, going = groups
    records = {f"{GROUP}.preflight": {**_record(done), "run_id": "r1"},
               f"{OTHER}.preflight": {**_record(going), "run_id": "r1"}}
    # the REST API names the run r1; its folder is the copied run's: point r1 at it
    for layout in (done, going):
        target = Path(layout.store.local_path(layout.run_uri)).with_name("r1")
        if not target.exists():
            shutil.copytree(layout.store.local_path(layout.run_uri), target)
    running = [{"task_id": f"{OTHER}.train_shard_1", "pool": "mop_shard_1", "rendered_map_index": None},
               {"task_id": f"{GROUP}.train_shard_0", "pool": "mop_shard_0", "rendered_map_index": None}]
    # the slot of OTHER's train task on shard 1 says what it trains (a status file in the run's folder)
    SlotStatus(block="r1.other", shard=1, slot=0, state="running", heartbeat=time.time() + 60,
               task_id=f"{OTHER}.train_shard_1", training="c9 t=1").write(
        going.store, RunLayout(going.store, going.dag_id, "r1").slot_status_uri("r1.other", 1, 0))
    api = RestData(records, running)
    monkeypatch.setattr("mop_airflow.cli.runs.api", lambda args: nullcontext(api))

    assert main(["status", DAG, "r1", "--once"]) == USAGE
    err = capsys.readouterr().err
    assert f"in the task groups {OTHER}, {GROUP} (its tasks in Airflow at http://airflow.test)" in err
    assert f"Fix: name the group: --group {OTHER}" in err

    from mop_airflow.monitor.watch import snapshot

    ref = find_run(api, DAG, "r1", group=OTHER)
    progress = snapshot(api, ref)
    assert (progress.hops_done, progress.hops_total, dict(progress.busy)) == (1, 2, {1: ["c9 t=1"]})
    assert main(["status", DAG, "r1", "--once", "--group", OTHER]) == OK
    assert capsys.readouterr().out.startswith("running: model hops 1/2, iteration 1/1, no validation yet")

    assert main(["report", DAG, "r1", "--group", GROUP, "--out", str(tmp_path / "r")]) == OK
    assert capsys.readouterr().out.startswith(f"{DAG}.{GROUP} / r1: running")
    board = json.loads((tmp_path / "r" / "leaderboard.json").read_text())["leaderboard"]
    assert [row["config_id"] for row in board] == [
        row["config_id"] for row in done.store.read_json(done.report_uri("leaderboard.json"))["leaderboard"]]
    assert np.isfinite(board[0]["val_accuracy"])
    assert main(["report", DAG, "r1", "--group", "nope"]) == USAGE
    assert f"its groups: {OTHER}, {GROUP}" in capsys.readouterr().err


def test_with_airflow_unreachable_the_groups_runs_are_read_from_the_default_store(groups, capsys, tmp_path):
    from mop_airflow.deployment.local import free_port

    _, _, root, done, _ = groups
    home = tmp_path / "home"
    home.mkdir()
    (home / "store").symlink_to(root)  # the default store <home>/store is where the group's runs are
    offline = ["--api-url", f"http://127.0.0.1:{free_port()}", "--home", str(home)]
    assert main(["runs", DAG, "--group", GROUP, *offline]) == OK
    captured = capsys.readouterr()
    assert "Airflow not reachable at" in captured.err and "read the runs from the store at" in captured.err
    assert next(line for line in captured.out.splitlines() if line.startswith(done.run_id)).split()[1] == "finished"
    assert main(["status", DAG, "--once", *offline]) == USAGE
    assert f"--group {OTHER}" in capsys.readouterr().err
    assert main(["status", DAG, "no_such_run", "--once", "--group", GROUP, *offline]) == UNAVAILABLE
    assert f"has no run 'no_such_run' of DAG '{DAG}' (group '{GROUP}') to read instead" in capsys.readouterr().err


REAL_GROUPS_DAG = """
import datetime as dt, json
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG
from mop_airflow import MopTaskGroup

with DAG("real_groups", schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)) as dag:
    extract = EmptyOperator(task_id="extract")
    extract >> [MopTaskGroup(json.loads(%(spec)r), group_id=group, pools="off") for group in ("first", "second")]
"""


def test_a_real_dag_of_two_task_groups_is_read_back_group_by_group(airflow_db, session_dir, tmp_path, capsys):
    """Two MopTaskGroups run by dag.test(): every command reads each group's own run, registry and Asset."""
    import importlib.util

    from tests.test_end_to_end import tiny_spec, write_digits

    write_digits(tmp_path / "digits.parquet")
    spec = tiny_spec(tmp_path / "digits.parquet", f"file://{tmp_path / 'store'}", iterations=1)
    spec["search"]["space"]["params"]["learning_rate"] = [1e-2]
    path = session_dir / "dags" / "real_groups.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(REAL_GROUPS_DAG % {"spec": json.dumps(spec)})
    module_spec = importlib.util.spec_from_file_location("dagfile_real_groups", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    run = module.dag.test()
    assert run.state == "success"

    root = tmp_path / "store"
    assert stored_selections(Store(f"file://{root}"), "real_groups") == ["first", "second"]
    assert _cli(root, "runs", "real_groups") == USAGE
    assert "in the task groups first, second" in capsys.readouterr().err
    for group in ("first", "second"):
        layout = RunLayout(Store(f"file://{root}"), f"real_groups.{group}", run.run_id)
        best = layout.store.read_json(layout.report_uri("summary.json"))["best"]
        assert _cli(root, "runs", "real_groups", "--group", group) == OK
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(run.run_id)).split()
        assert row[1:] == ["finished", best["config_id"], f"val_accuracy={best['val_accuracy']:.4f}"]
        assert _cli(root, "status", "real_groups", "--once", "--group", group) == OK
        assert "finished: model hops 2/2, iteration 1/1" in capsys.readouterr().out
        assert _cli(root, "champion", "list", "real_groups", "--group", group) == OK
        out = capsys.readouterr().out
        assert f"first champion of real_groups.{group}: {best['config_id']}" in out
        assert layout.report_uri("best_model.keras") in out
