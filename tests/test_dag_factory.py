"""The rendered DAG is exactly the pure task plan: one train task per shard slot per block on its
shard's pool and queue, reading every class's list; the example DAGs import cleanly."""

import json
import subprocess
import sys

import pytest

from mop_airflow.planning.task_plan import build_task_plan, shard_pool
from tests.conftest import REPO
from tests.test_spec import spec_dict


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def hops(dag):
    """The train tasks: one per shard slot per block."""
    return [t for t in dag.tasks if t.task_id.rsplit(".", 1)[-1].startswith("train_shard_")]


SELECTION_DAGS = {"mop_mnist1d", "mop_mnist1d_hyperband", "mop_mnist1d_asha", "mop_digits", "mop_digit_images", "mop_friedman",
                  "mop_digits_retrain"}


def selection_dags(dagbag):
    """The model-selection DAGs (built by build_mop_dag: they start with preflight), not the ones
    that only use their results, such as a scoring DAG."""
    from mop_airflow.operators.preflight import MopPreflightOperator

    return [dag for dag in dagbag.dags.values()
            if any(isinstance(t, MopPreflightOperator) for t in dag.tasks)]


def test_example_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert SELECTION_DAGS | {"mop_digits_score"} <= set(dagbag.dag_ids)
    assert SELECTION_DAGS <= {dag.dag_id for dag in selection_dags(dagbag)}


def test_every_hop_task_has_its_shards_pool_and_queue(dagbag):
    for dag in selection_dags(dagbag):
        assert hops(dag), dag.dag_id
        for task in hops(dag):
            shard = int(task.task_id.rsplit("train_shard_", 1)[1].split("_")[0])
            assert task.pool == shard_pool(shard) == task.queue == shard_pool(task.shard)


def test_the_retraining_example_runs_nightly_and_on_new_data_and_publishes_its_champion(dagbag):
    from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable

    from mop_airflow.airflow.dag import champion_asset
    from mop_airflow.examples.sklearn_data import digits_data_spec

    dag = dagbag.dags["mop_digits_retrain"]
    schedule = dag.timetable
    assert isinstance(schedule, AssetOrTimeSchedule)
    assert isinstance(schedule.timetable, CronTriggerTimetable)
    assert (schedule.timetable.expression, str(schedule.timetable.timezone)) == ("0 3 * * *", "UTC")
    data = Asset("file://" + digits_data_spec()["source"])
    assert isinstance(schedule.asset_condition, Asset) and schedule.asset_condition.uri == data.uri
    publish = dag.get_task("publish")
    assert publish.upstream_task_ids == {"report"}
    assert publish.outlets == [champion_asset("mop_digits_retrain")]
    spec = dag.get_task("preflight").spec
    assert spec["search"]["warm_start"]["from"] == "champion" and spec["publish"]["margin"] == 0.005


def test_the_scoring_example_runs_on_every_new_champion(dagbag):
    from airflow.sdk.definitions.timetables.assets import AssetTriggeredTimetable

    from mop_airflow.airflow.dag import champion_asset
    from mop_airflow.operators.predict import MopPredictOperator

    dag = dagbag.dags["mop_digits_score"]
    assert type(dag.timetable) is AssetTriggeredTimetable
    assert list(dag.timetable.asset_condition.objects) == [champion_asset("mop_digits_retrain")]
    assert champion_asset("mop_digits_retrain").uri == "mop://mop_digits_retrain/champion"
    score = dag.get_task("score")
    assert isinstance(score, MopPredictOperator) and score.upstream_task_ids == {"champion_event"}
    assert "champion_event" in score.model_run_id and "champion_event" in score.config_id


def test_parsing_imports_neither_tensorflow_nor_great_expectations():
    # One process parses every example DAG file in turn and names the heavy modules each one added:
    # a process each cost an Airflow import each (95 s in all on 2 cores, now one).
    code = ("import sys, importlib.util as u\n"
            "for path in sys.argv[1:]:\n"
            "    s = u.spec_from_file_location('d_' + str(abs(hash(path))), path); m = u.module_from_spec(s)\n"
            "    s.loader.exec_module(m)\n"
            "    print(path, sorted(x for x in ('tensorflow', 'keras', 'great_expectations', 'pandas') if x in sys.modules))\n")
    paths = [str(p) for p in sorted((REPO / "dags").glob("*.py"))]
    out = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, check=True)
    parsed = dict(line.rsplit(" ", 1) for line in out.stdout.splitlines() if line.startswith(tuple(paths)))
    assert parsed == {p: "[]" for p in paths}, out.stdout


def test_the_task_plan_imports_no_airflow_and_is_deterministic():
    from mop_airflow.search.adaptive import adaptive_plan

    hb = adaptive_plan({"method": "hyperband", "R": 9, "eta": 3}, 4)
    assert build_task_plan(4, 3) == build_task_plan(4, 3)
    assert build_task_plan(4, 0, hb) == build_task_plan(4, 0, adaptive_plan({"method": "hyperband", "R": 9, "eta": 3}, 4))


@pytest.mark.parametrize("adaptive", [None, {"method": "hyperband", "R": 9, "eta": 3}])
def test_the_rendered_dag_is_exactly_the_task_plan(adaptive):
    from mop_airflow.airflow.dag import build_mop_dag
    from mop_airflow.planning.task_plan import spec_task_plan
    from mop_airflow.config import MopSpec

    spec = adaptive_spec(adaptive, shards=3) if adaptive else spec_dict(schedule__shards=3, schedule__iterations=2)
    dag = build_mop_dag(spec, dag_id="rendered")
    plan = spec_task_plan(MopSpec.from_dict(spec))
    assert {t.task_id for t in dag.tasks} == {s.task_id for s in plan.tasks}
    for s in plan.tasks:
        task = dag.get_task(s.task_id)
        assert set(task.upstream_task_ids) == set(s.upstream), s.task_id
        assert (task.priority_weight, task.weight_rule) == (s.priority_weight, "absolute")
        assert task.trigger_rule == s.trigger_rule
        if s.pool:
            assert task.pool == s.pool
        if s.queue:
            assert task.queue == s.queue
    for s in plan.tasks:
        if s.kind == "train":  # labelled by its shard; it reads what its block trains from the store, not an XCom
            task = dag.get_task(s.task_id)
            assert task.task_display_name == f"train on shard {s.args['shard']}"
            assert not task.template_fields
            assert (task.shard, task.slot, task.end) == (s.args["shard"], 0, s.args["end"])
    assert not any(type(t).__name__ == "MappedOperator" for t in hops(dag))


def test_shape_depends_only_on_shards_slots_and_iterations():
    from mop_airflow.airflow.dag import build_mop_dag

    edges = lambda dag: sorted((u, t.task_id) for t in dag.tasks for u in t.upstream_task_ids)  # noqa: E731
    a = build_mop_dag(spec_dict(), dag_id="a")
    wider = spec_dict()
    values = wider["search"]["space"]["params"]["learning_rate"]
    wider["search"]["space"]["params"]["learning_rate"] = values + [v * 3 for v in values]
    assert edges(build_mop_dag(wider, dag_id="b")) == edges(a)  # twice the configurations, the same tasks
    two = build_mop_dag(spec_dict(schedule__slots_per_shard=2), dag_id="c")
    assert len(hops(two)) == 2 * len(hops(a))
    assert {t.task_id for t in hops(two)} == {f"train_shard_{s}_slot_{k}" for s in range(2) for k in range(2)}
    assert {t.task_display_name for t in hops(two)} == {f"train on shard {s} slot {k}" for s in range(2)
                                                        for k in range(2)}


@pytest.mark.parametrize("shards, iterations", [(1, 1), (3, 2), (4, 3)])
def test_a_block_is_one_train_task_per_shard_after_every_stage(shards, iterations):
    from mop_airflow.airflow.dag import build_mop_dag

    spec = spec_dict(schedule__shards=shards, schedule__iterations=iterations)
    dag = build_mop_dag(spec, dag_id="shape")
    end = shards * iterations
    stages = {f"stage_shard_{s}" for s in range(shards)}
    assert {t.task_id for t in hops(dag)} == {f"train_shard_{s}" for s in range(shards)}
    for s in range(shards):
        task = dag.get_task(f"train_shard_{s}")
        assert task.pool == task.queue == shard_pool(s)
        # every shard is staged and every model built once on the data's shapes first
        assert task.upstream_task_ids == stages | {"check_models"}
        assert task.end == end
        assert task.priority_weight == end  # the plan's weight of the block's first hop
    assert dag.get_task("report").upstream_task_ids == {f"train_shard_{s}" for s in range(shards)}
    # a run continuing a search skips list_data ... plan from preflight and stages after it alone
    assert dag.get_task("preflight").downstream_task_ids == {"list_data", "check_models"} | stages
    assert dag.get_task("shard").upstream_task_ids == {"scatter"}
    for after_plan in ("check_models", *stages):
        assert dag.get_task(after_plan).upstream_task_ids == {"plan", "preflight"}
        assert dag.get_task(after_plan).trigger_rule == "none_failed_min_one_success"
    assert dag.max_active_tasks >= shards + 2  # every shard slot of a block at once, and control tasks beside


def test_max_active_tasks_leaves_room_for_every_shard_slot():
    from mop_airflow.airflow.dag import build_mop_dag

    dag = build_mop_dag(spec_dict(schedule__shards=16, schedule__slots_per_shard=2), dag_id="wide")
    assert dag.max_active_tasks >= 32


def adaptive_spec(adaptive, shards=2):
    spec = spec_dict(schedule__shards=shards)
    spec["search"]["space"] = {"method": "random", "params": {
        "model": "mop_airflow.examples.mnist1d_models:mlp",
        "learning_rate": {"distribution": "log_uniform", "low": 1e-3, "high": 1e-1}}}
    spec["search"]["adaptive"] = adaptive
    return spec


def test_hyperband_is_one_dag_run_of_a_block_per_rung_end_each_after_a_decide_step():
    from mop_airflow.airflow.dag import build_mop_dag
    from mop_airflow.operators.decide import MopDecideOperator

    dag = build_mop_dag(adaptive_spec({"method": "hyperband", "R": 9, "eta": 3}), dag_id="hb")
    # R=9, eta=3: every rung of the 3 brackets side by side ends at iteration 1, 3 or 9: 3 blocks, 2 shards
    decides = sorted(t.task_id for t in dag.tasks if isinstance(t, MopDecideOperator))
    assert decides == ["block_1.decide", "block_2.decide", "decide"]
    assert {t.task_id for t in hops(dag)} == {f"{prefix}train_shard_{s}" for prefix in ("", "block_1.", "block_2.")
                                               for s in range(2)}
    # a block starts once the decision before it is written, and waits for the block before it
    assert dag.get_task("block_1.decide").upstream_task_ids == {"train_shard_0", "train_shard_1"}
    assert dag.get_task("block_2.train_shard_0").upstream_task_ids == {"block_2.decide"}  # it reads that decision
    last = dag.get_task("decide")
    assert last.upstream_task_ids == {"block_2.train_shard_0", "block_2.train_shard_1"} and last.whole
    assert dag.get_task("report").upstream_task_ids == {"decide"}
    # every train task reads how far its block trains from its decision: block k of the run
    assert [dag.get_task(f"{p}train_shard_1").block for p in ("", "block_1.", "block_2.")] == [0, 1, 2]
    assert len(dag.tasks) < 30  # whatever R is, a block is a train task per shard slot and a decide step
    assert dag.description == ("Hyperband R=9, eta=3, one block per rung end (1, 3, 9) in one DAG run: 17 "
                               "configurations in 3 bracket(s), trained 1, 3 or 9 iteration(s) (each rung keeps the "
                               "best 1/3); models hop across 2 shards")
    assert dag.task_group_dict["block_2"].group_display_name == "block 3"


def test_successive_halving_is_one_bracket_on_the_same_machinery():
    from mop_airflow.airflow.dag import build_mop_dag

    dag = build_mop_dag(adaptive_spec({"method": "successive_halving", "n": 8, "r": 1, "eta": 2}), dag_id="sh")
    # n=8, eta=2: rungs of 8, 4, 2, 1 configurations ending at 1, 2, 4 and 8 iterations: 4 blocks
    assert sorted(t.task_id for t in dag.tasks if t.task_id.endswith("decide")) == [
        "block_1.decide", "block_2.decide", "block_3.decide", "decide"]


def test_adaptive_plan_cannot_change_per_run():
    from mop_airflow.errors import SpecError
    from mop_airflow.config import MopSpec

    spec = MopSpec.from_dict(adaptive_spec({"method": "hyperband", "R": 9, "eta": 3}))
    with pytest.raises(SpecError) as info:
        spec.with_overrides({"search": {"adaptive": {"method": "hyperband", "R": 27, "eta": 3}}})
    assert info.value.field == "conf.search.adaptive"
    assert len(spec.configurations()) == 17  # the plan decides how many configurations are drawn


def test_the_plan_record_round_trips_and_every_class_visits_every_shard_once_per_iteration():
    from mop_airflow.records import Plan
    from mop_airflow.planning.plan import make_plan
    from mop_airflow.planning.resolve import resolve_run

    run = resolve_run(spec_dict(schedule__shards=3, schedule__iterations=2), None, dag_id="d", run_id="r")
    plan = make_plan(run)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert sorted(c for members in plan.classes for c in members) == sorted(c["config_id"] for c in run.configs)
    for shards in plan.visit_order.values():
        assert sorted(shards[:3]) == sorted(shards[3:]) == [0, 1, 2]


@pytest.mark.parametrize("adaptive, blocks", [({"method": "hyperband", "R": 9, "eta": 3}, 3),
                                              ({"method": "hyperband", "R": 9, "eta": 3, "rounding": "madlib"}, 3),
                                              ({"method": "hyperband", "R": 27, "eta": 3, "skip_last": 1}, 3),
                                              ({"method": "successive_halving", "n": 20, "r": 1, "eta": 2}, 5)])
def test_a_search_of_known_shape_renders_a_block_per_decision_point(adaptive, blocks):
    from mop_airflow.search.adaptive import adaptive_plan, decision_points

    p = 4
    plan = adaptive_plan(adaptive, p)
    assert len(decision_points(plan)) == blocks
    tasks = build_task_plan(p, 0, plan)
    assert sum(1 for t in tasks.tasks if t.kind == "decide") == blocks
    assert tasks.train_tasks == blocks * p


def test_every_task_retries_twice_with_backoff_unless_the_dag_says_otherwise():
    import datetime as dt

    from mop_airflow.airflow.dag import build_mop_dag

    dag = build_mop_dag(spec_dict(), dag_id="retrying")
    assert {(t.retries, t.retry_delay, t.retry_exponential_backoff) for t in dag.tasks} == {
        (2, dt.timedelta(seconds=10), 2.0)}
    off = build_mop_dag(spec_dict(), dag_id="no_retries", default_args={"retries": 0})
    assert {t.retries for t in off.tasks} == {0}


def test_a_trigger_conf_may_name_builders_only_from_the_modules_the_dag_allows():
    from mop_airflow.airflow.dag import build_mop_dag
    from mop_airflow.errors import SpecError
    from mop_airflow.planning.resolve import resolve_run

    spec = spec_dict()  # builders from mop_airflow.examples.mnist1d_models
    allowed = build_mop_dag(spec, dag_id="allow").get_task("preflight").builder_modules
    assert allowed == ["mop_airflow.examples.mnist1d_models"]

    def conf(*models):
        return {"search": {"space": {"method": "grid", "params": {"model": list(models)}}}}

    run = resolve_run(spec, conf("mop_airflow.examples.mnist1d_models:cnn"), dag_id="d", run_id="r",
                      allowed_modules=allowed)  # another builder of an allowed module
    assert [c["model"] for c in run.configs] == ["mop_airflow.examples.mnist1d_models:cnn"]
    with pytest.raises(SpecError, match=r"search.space.params.model='mop_airflow.examples.image_models:cnn2d': "
                                        r"module 'mop_airflow.examples.image_models' is not among the builder "
                                        r"modules this DAG allows \['mop_airflow.examples.mnist1d_models'\]. Fix: "):
        resolve_run(spec, conf("mop_airflow.examples.image_models:cnn2d"), dag_id="d", run_id="r",
                    allowed_modules=allowed)
    # a package allows every module under it
    package = build_mop_dag(spec, dag_id="pkg", builder_modules=["mop_airflow.examples"])
    assert package.get_task("preflight").builder_modules == ["mop_airflow.examples"]
    resolve_run(spec, conf("mop_airflow.examples.image_models:cnn2d"), dag_id="d", run_id="r",
                allowed_modules=["mop_airflow.examples"])


@pytest.mark.parametrize("adaptive, shards, blocks", [({"method": "hyperband", "R": 81, "eta": 3}, 16, 5),
                                                      ({"method": "hyperband", "R": 81, "eta": 3, "rounding": "madlib"},
                                                       16, 5),
                                                      ({"method": "hyperband", "R": 27, "eta": 3}, 4, 4),
                                                      ({"method": "asha", "n": 256, "r": 1, "R": 81, "eta": 3}, 16, 1)])
def test_an_adaptive_search_renders_its_blocks_whatever_its_size(adaptive, shards, blocks):
    """Hyperband at MADlib's example size (R=81, eta=3, 16 workers) drew 24,722 tasks into one DAG, and
    then took 81 DAG runs of one iteration; its 5 rung ends make 5 blocks in one run. ASHA without a budget
    has no known number of blocks: one a run, its decide step starting the next."""
    from mop_airflow.search.adaptive import adaptive_plan

    plan = adaptive_plan(adaptive, shards)
    tasks = build_task_plan(shards, 0, plan)
    assert len(tasks.tasks) <= 200 and {t.kind for t in tasks.tasks} >= {"decide", "stage", "train"}
    trains = [t for t in tasks.tasks if t.kind == "train"]
    assert len(trains) == blocks * shards and all(t.args.get("relative") for t in trains)
    assert sorted(t.args["block"] for t in trains) == sorted(k for k in range(blocks) for _ in range(shards))
    decides = [t for t in tasks.tasks if t.kind == "decide"]
    assert len(decides) == blocks and decides[-1].task_id == "decide"
    assert decides[-1].args.get("whole", False) == (adaptive["method"] != "asha")
    if adaptive["method"] == "asha":
        two = build_task_plan(shards, 0, plan, blocks_setting=2)  # schedule.iterations_per_run: 2 blocks a run
        assert [t.task_id for t in two.tasks if t.kind == "decide"] == ["block_1.decide", "decide"]
        assert two.train_tasks == 2 * tasks.train_tasks


def _alert(context):  # a user's own failure alert, from default_args
    pass


def test_every_train_task_ends_its_blocks_never_started_tasks_after_the_users_own_failure_callback():
    from airflow.serialization.serialized_objects import DagSerialization

    from mop_airflow import build_mop_dag
    from mop_airflow.operators.train import end_block_after_final_failure

    spec = spec_dict()
    spec["schedule"] = {**spec.get("schedule", {}), "shards": 3}
    dag = build_mop_dag(spec, dag_id="mop_callbacks", default_args={"on_failure_callback": _alert})
    trains = hops(dag)
    assert len(trains) >= 3
    for task in trains:
        assert task.on_failure_callback == [_alert, end_block_after_final_failure], task.task_id
    others = [t for t in dag.tasks if t not in trains]
    assert all(t.on_failure_callback in (_alert, [_alert]) for t in others)  # no other task's is touched
    again = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    assert all(again.get_task(t.task_id).has_on_failure_callback for t in trains)


def test_the_provider_lists_each_operator_module_and_only_those():
    """Admin > Providers: every module the provider metadata names imports and defines an operator
    (it once named ``mop_airflow.operators.promote``, which did not exist)."""
    import importlib
    import inspect

    from airflow.sdk import BaseOperator

    from mop_airflow.airflow.provider import get_provider_info

    (entry,) = get_provider_info()["operators"]
    modules = entry["python-modules"]
    assert "mop_airflow.operators.train" in modules and "mop_airflow.operators.base" not in modules
    for name in modules:
        module = importlib.import_module(name)
        defined = [c for _, c in inspect.getmembers(module, inspect.isclass)
                   if issubclass(c, BaseOperator) and c.__module__ == name]
        assert defined, f"{name} defines no operator"
