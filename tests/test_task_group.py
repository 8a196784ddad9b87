"""A model selection inside any DAG: MopTaskGroup's tasks, names, form fields and errors, and
whole runs (the example pipeline, two groups in one DAG, data from upstream) through dag.test()."""

from __future__ import annotations

import datetime as dt
import importlib.util

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import REPO
from tests.test_end_to_end import tiny_spec, write_digits
from tests.test_spec import spec_dict


def _dag(dag_id="pipe"):
    from airflow.sdk import DAG

    return DAG(dag_id, schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc))


def test_a_group_holds_a_whole_selection_with_prefixed_ids_and_ends_with_its_result():
    from airflow.sdk import task

    from mop_airflow import MopTaskGroup, build_mop_dag

    with _dag() as dag:
        @task
        def extract():
            return "/data/today"

        data = extract()
        spec = spec_dict()
        spec["data"]["source"] = data
        selection = MopTaskGroup(spec, group_id="model_selection")
    whole = build_mop_dag(spec_dict(), dag_id="whole")
    inside = {t.task_id for t in dag.tasks if t.task_id.startswith("model_selection.")}
    # the same tasks as a whole MOP DAG, each prefixed by the group id, and a last result task
    assert inside == {f"model_selection.{t}" for t in whole.task_ids} | {"model_selection.result"}
    assert "result" not in whole.task_ids  # nothing changes for a whole MOP DAG
    preflight = dag.get_task("model_selection.preflight")
    assert preflight.upstream_task_ids == {"extract"}  # the XComArg's task runs first
    assert preflight.data_templates == {"source": "{{ ti.xcom_pull(task_ids='extract', key='return_value') }}"}
    assert preflight.selection == "model_selection" and selection.selection_id == "pipe.model_selection"
    result = dag.get_task("model_selection.result")
    # downstream tasks run whether the winner was published (publish ran) or the champion stayed (skipped)
    assert result.upstream_task_ids == {"model_selection.publish"} and result.trigger_rule == "none_failed"
    assert selection.output.operator is result
    # the train tasks start after every stage task and the model check, prefix included
    train = dag.get_task("model_selection.train_shard_0")
    assert train.upstream_task_ids == {"model_selection.stage_shard_0", "model_selection.stage_shard_1",
                                       "model_selection.check_models"}
    assert selection.champion_asset.uri == "mop://pipe.model_selection/champion"
    # the trigger form: the group's fields under its id, in sections named after it
    keys = [k for k in dag.params.keys() if k.startswith("model_selection.")]
    assert "model_selection.learning_rate" in keys
    sections = {dag.params.get_param(k).schema.get("section") for k in keys}
    assert all(s.startswith("model_selection: ") for s in sections)


def test_two_groups_keep_their_own_ids_assets_and_shared_pools():
    from mop_airflow import MopTaskGroup

    with _dag("two") as dag:
        a = MopTaskGroup(spec_dict(), group_id="mlps")
        b = MopTaskGroup(spec_dict(), group_id="cnns")
    assert (a.selection_id, b.selection_id) == ("two.mlps", "two.cnns")
    assert a.champion_asset.uri != b.champion_asset.uri
    pools = {t.pool for t in dag.tasks if ".train_shard_" in t.task_id}
    assert pools == {"mop_shard_0", "mop_shard_1"}  # a pool is a shard's GPUs: both groups use it
    assert not {t for t in dag.task_ids if t.startswith("mlps.")} & {t for t in dag.task_ids if t.startswith("cnns.")}


def test_a_group_inside_another_task_group_is_named_by_its_full_id():
    from airflow.sdk import TaskGroup

    from mop_airflow import MopTaskGroup

    with _dag("nested") as dag:
        with TaskGroup("region_eu"):
            selection = MopTaskGroup(spec_dict(), group_id="sel")
    assert selection.selection_id == "nested.region_eu.sel"
    preflight = dag.get_task("region_eu.sel.preflight")
    assert preflight.selection == "region_eu.sel"  # it pulls and names everything with the full prefix
    assert "region_eu.sel.stage_shard_0" in dag.get_task("region_eu.sel.train_shard_0").upstream_task_ids
    assert "region_eu.sel.learning_rate" in dag.params


def test_group_errors_name_the_field_the_rule_and_the_fix():
    from mop_airflow import MopTaskGroup

    with pytest.raises(SpecError) as outside:
        MopTaskGroup(spec_dict(), group_id="model_selection")
    assert outside.value.field == "MopTaskGroup" and "outside a DAG" in str(outside.value)
    assert "with DAG(...)" in str(outside.value)
    with _dag("dup"):
        MopTaskGroup(spec_dict(), group_id="sel")
        with pytest.raises(SpecError) as duplicate:
            MopTaskGroup(spec_dict(), group_id="sel")
    assert duplicate.value.field == "MopTaskGroup.group_id" and "already used" in str(duplicate.value)
    assert "its own group_id" in str(duplicate.value)


def test_a_group_conf_is_the_groups_part_of_the_trigger_conf():
    from mop_airflow.records.selection import conf_of

    conf = {"sel.learning_rate": [0.1], "sel": {"batch_size": [8]}, "other.x": 1, "date": "2024-01-01"}
    assert conf_of(conf, "sel") == {"learning_rate": [0.1], "batch_size": [8]}
    assert conf_of(conf, None) is conf


def _dag_from_file(session_dir, name: str, text: str):
    """Write a DAG file into the test dags folder (dag.test() runs DAGs the dag-processor can find)."""
    folder = session_dir / "dags"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text)
    module_spec = importlib.util.spec_from_file_location(f"dagfile_{name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.dag


GROUPS_DAG = """
import datetime as dt, json
from airflow.sdk import DAG, task
from mop_airflow import MopTaskGroup

with DAG("two_groups", schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)) as dag:
    a = MopTaskGroup(json.loads(%(small)r), group_id="small")
    b = MopTaskGroup(json.loads(%(wide)r), group_id="wide")

    @task
    def compare(x: dict, y: dict) -> str:
        return max((x, y), key=lambda s: s["value"])["selection_id"]

    compare(a.output, b.output)
"""

NO_DATA_DAG = """
import datetime as dt, json
from airflow.sdk import DAG, task
from mop_airflow import MopTaskGroup

with DAG("no_data", schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
         default_args={"retries": 0}) as dag:
    @task
    def extract() -> str:
        return ""

    spec = json.loads(%(spec)r)
    spec["data"]["source"] = extract()
    MopTaskGroup(spec, group_id="sel")
"""


@pytest.mark.integration
def test_the_pipeline_example_trains_on_what_extract_wrote_and_deploys_the_winner(airflow_db, session_dir):
    from mop_airflow.config import default_home

    dag = _dag_from_file(session_dir, "mop_pipeline", (REPO / "dags" / "mop_pipeline.py").read_text())
    run = dag.test()
    assert run.state == "success"
    extracted = run.get_task_instance("extract").xcom_pull(task_ids="extract")
    summary = run.get_task_instance("model_selection.result").xcom_pull(task_ids="model_selection.result")
    deployed = run.get_task_instance("deploy").xcom_pull(task_ids="deploy")
    store = Store(f"file://{default_home()}/store")
    layout = RunLayout(store, "mop_pipeline.model_selection", run.run_id)
    record = store.read_json(layout.run_record_uri)
    assert record["spec"]["data"]["source"] == extracted  # the template was rendered before the run resolved
    assert record["dag_id"] == summary["selection_id"] == "mop_pipeline.model_selection"
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    assert summary["best_config_id"] == board[0]["config_id"] and summary["metric"] == "val_accuracy"
    assert summary["value"] == board[0]["val_accuracy"] and summary["run_folder"] == layout.run_uri
    assert summary["leaderboard_uri"] == layout.report_uri("leaderboard.json")
    assert summary["champion"]["publish"] is True  # the first run's winner becomes the champion
    assert deployed["config_id"] == summary["best_config_id"] and deployed["rows"] == 450
    assert deployed["accuracy"] > 0.5  # the winner, loaded from the store, scores fresh rows


@pytest.mark.integration
def test_two_groups_in_one_dag_train_side_by_side_and_keep_their_runs_apart(airflow_db, session_dir, tmp_path):
    import json

    write_digits(tmp_path / "digits.parquet")
    store_root = f"file://{tmp_path / 'store'}"
    mlps = tiny_spec(tmp_path / "digits.parquet", store_root, iterations=1)
    mlps["search"]["space"]["params"]["learning_rate"] = [3e-3]
    wider = tiny_spec(tmp_path / "digits.parquet", store_root, iterations=1)  # three learning rates
    dag = _dag_from_file(session_dir, "two_groups", GROUPS_DAG % {"small": json.dumps(mlps), "wide": json.dumps(wider)})
    run = dag.test(run_conf={"wide.learning_rate": [1e-2, 3e-2]})  # the form's key for the wide group's field
    assert run.state == "success"
    store = Store(store_root)
    boards = {g: store.read_json(RunLayout(store, f"two_groups.{g}", run.run_id).report_uri("leaderboard.json"))
              for g in ("small", "wide")}
    # each group trained its own grid: the conf narrowed the wide one to 2 learning rates, not the small one
    assert len(boards["small"]["leaderboard"]) == 1 and len(boards["wide"]["leaderboard"]) == 2
    registries = store.glob(store.uri("two_groups.*", "registry.json"))  # a champion registry per group
    assert {uri.split("/")[-2] for uri in registries} == {"two_groups.small", "two_groups.wide"}
    winner = run.get_task_instance("compare").xcom_pull(task_ids="compare")
    assert winner in ("two_groups.small", "two_groups.wide")


@pytest.mark.integration
def test_a_data_template_that_renders_to_nothing_fails_before_anything_trains(airflow_db, session_dir, tmp_path):
    import json

    store_root = f"file://{tmp_path / 'store'}"
    spec = tiny_spec(tmp_path / "unused.parquet", store_root, iterations=1)
    dag = _dag_from_file(session_dir, "no_data", NO_DATA_DAG % {"spec": json.dumps(spec)})
    run = dag.test()
    assert run.state == "failed"
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["extract"] == "success" and states["sel.preflight"] == "failed"
    assert all(state in ("upstream_failed", None) for task_id, state in states.items()
               if task_id.startswith("sel.") and task_id != "sel.preflight")
    assert not Store(store_root).glob(Store(store_root).uri("no_data.sel", "*"))  # nothing in the store


@pytest.mark.integration
@pytest.mark.slow
def test_the_pipeline_example_on_a_real_scheduler_and_under_airflow_dags_test(shared_airflow, tmp_path):
    """The example as users run it: the scheduler runs extract, the group's tasks on their shard pools and
    deploy, and `airflow dags test` runs it in one process; both end with the winner's scores."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pyarrow.parquet as pq

    from tests.conftest import airflow_part

    home = tmp_path / "mop"
    store = Store(f"file://{home / 'store'}")
    selection = "mop_pipeline.model_selection"
    with airflow_part(shared_airflow, tmp_path, "task_group") as af:
        af.write_dag("mop_pipeline", (REPO / "dags" / "mop_pipeline.py").read_text())  # with this test's home
        af.wait_for_dag("mop_pipeline")
        run_id = af.trigger("mop_pipeline", conf={"model_selection.learning_rate": [1e-2]})
        assert af.wait_for_run("mop_pipeline", run_id, timeout=600) == "success"
        tis = {ti["task_id"]: ti for ti in af.task_instances("mop_pipeline", run_id)}
        hops = [ti for ti in tis.values() if ".train_shard_" in ti["task_id"] and ti["state"] == "success"]
        assert hops and all(ti["pool"] == ti["queue"] == f"mop_shard_{ti['task_id'].rsplit('_', 1)[1]}"
                            for ti in hops)
        assert tis["deploy"]["state"] == tis["model_selection.result"]["state"] == "success"
        layout = RunLayout(store, selection, run_id)
        board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
        record = store.read_json(layout.run_record_uri)
        # the conf key under the group id narrowed the grid to one learning rate: 2 models x 1
        assert len(board) == 2 and {c["optimizer_params"]["learning_rate"] for c in record["configs"]} == {1e-2}
        scores = pq.read_table(os.path.join(record["spec"]["data"]["source"], "scores.parquet"))
        assert scores.num_rows == 450 and "response" in scores.column_names

        # the same DAG under `airflow dags test`, in one process, against the same Airflow home; paused
        # first, so that the running scheduler leaves the test's run to it
        af.api("PATCH", "/dags/mop_pipeline", json={"is_paused": True})
        tested = subprocess.run([str(Path(sys.executable).with_name("airflow")), "dags", "test", "mop_pipeline"],
                                env={**af.env, **af.dag_env}, capture_output=True, text=True)
        assert tested.returncode == 0, tested.stderr[-3000:]
    runs = [u for u in store.glob(store.uri(selection, "*", "report", "summary.json"))]
    assert len(runs) == 2  # the scheduler's run and the dags-test run, each in its own folder
