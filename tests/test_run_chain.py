"""A plain search longer than one DAG run holds, split over the DAG's runs (mop_airflow.planning.run_chain):
how many iterations a run trains, the shape each run renders, and how any run of a search finds
the search's folder. The runs themselves go on a real scheduler: tests/test_real_scheduler.py."""

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.records.layout import RunLayout, run_folder
from mop_airflow.planning.run_chain import continuation_of, iterations_per_run
from mop_airflow.records import Continuation, RunChain
from mop_airflow.config import MopSpec
from mop_airflow.store import Store
from mop_airflow.results.runs import stored_run
from mop_airflow.planning.task_plan import build_task_plan, spec_task_plan
from tests.test_end_to_end import tiny_spec


def random_spec(configs, shards, iterations, **schedule):
    spec = tiny_spec("/data/train.parquet", "file:///store", **schedule)
    spec["search"]["space"] = {"method": "random", "num_samples": configs, "seed": 7, "params": {
        "model": ["m:mlp"], "learning_rate": {"distribution": "log_uniform", "low": 1e-3, "high": 1e-1},
        "batch_size": [32]}}
    spec["schedule"].update(shards=shards, iterations=iterations)
    return MopSpec.from_dict(spec)


def test_auto_keeps_a_search_in_one_run_and_a_whole_number_splits_it():
    assert iterations_per_run(7, "auto") == 7  # a run renders a train task per shard slot, however many hops
    assert iterations_per_run(6, 2) == 2  # a whole number is taken as it is


def test_a_whole_number_must_divide_the_iterations_and_the_error_lists_the_ones_that_do():
    with pytest.raises(SpecError) as err:
        iterations_per_run(10, 3)
    text = str(err.value)
    assert "schedule.iterations_per_run" in text and "must divide schedule.iterations (10)" in text
    assert "[1, 2, 5, 10]" in text
    with pytest.raises(SpecError, match="schedule.iterations_per_run"):
        tiny_spec_with(iterations_per_run=0)


def tiny_spec_with(**schedule):
    return MopSpec.from_dict(tiny_spec("/d.parquet", "file:///s", **schedule))


def test_the_size_of_the_systems_we_compare_with_runs_whole_in_one_run():
    """256 configurations x 16 shards x 10 iterations: as hop tasks that was 2,560 task instances, split
    over 10 runs; one train task per shard trains every hop of its shard, so the run holds all 160."""
    plan = spec_task_plan(random_spec(256, 16, 10))
    assert plan.train_tasks == 16 and "next_run" not in {t.task_id for t in plan.tasks}
    by_id = {t.task_id: t for t in plan.tasks}
    assert set(by_id["report"].upstream) == {f"train_shard_{s}" for s in range(16)}
    assert {t.args["end"] for t in plan.tasks if t.kind == "train"} == {160}
    assert len(plan.tasks) == 16 + 16 + 8  # train and stage per shard; preflight ... check_models, report, publish
    # 64 shards: 64 train tasks a run, where 256 configurations rendered 329 tasks a run over 160 runs
    wide = spec_task_plan(random_spec(256, 64, 10))
    assert wide.train_tasks == 64 and len(wide.tasks) == 64 + 64 + 8
    # a split set by hand still ends each run in next_run, the report after the last
    split = spec_task_plan(random_spec(256, 16, 10, iterations_per_run=5))
    by_id = {t.task_id: t for t in split.tasks}
    assert dict(by_id["next_run"].args) == {"hops_per_run": 80, "hops": 160}
    assert by_id["report"].upstream == ("next_run",) and dict(by_id["report"].args) == {"last_start": 80}
    assert len(by_id["next_run"].upstream) == 16  # every train task


def test_iterations_per_run_shapes_the_dag_and_a_trigger_conf_cannot_change_it():
    spec = tiny_spec_with(iterations=4, iterations_per_run=2)
    with pytest.raises(SpecError, match="conf.schedule.iterations_per_run"):
        spec.with_overrides({"schedule": {"iterations_per_run": 1}})
    assert spec.with_overrides({"schedule": {"seed": 3}}).schedule.iterations_per_run == 2


def test_only_a_whole_mop_dags_plain_search_is_split():
    with pytest.raises(SpecError, match="MopTaskGroup") as err:
        spec_task_plan(tiny_spec_with(iterations=4, iterations_per_run=2), result=True)
    assert "leave schedule.iterations_per_run out" in str(err.value)
    hyperband = random_spec(8, 2, 3, iterations_per_run=1).to_dict()
    hyperband["search"]["adaptive"] = {"method": "hyperband", "R": 9, "eta": 3}
    del hyperband["search"]["space"]["num_samples"]
    # an adaptive search's runs hold whole blocks: one here, its decide step starting the next run
    one = spec_task_plan(MopSpec.from_dict(hyperband))
    assert [t.task_id for t in one.tasks if t.kind == "decide"] == ["decide"] and "next_run" not in {
        t.kind for t in one.tasks}
    hyperband["schedule"]["iterations_per_run"] = 0.5
    with pytest.raises(SpecError, match="no longer takes a fraction"):
        spec_task_plan(MopSpec.from_dict(hyperband))
    # one plan for equal inputs, as the renderer and the simulator rely on
    assert build_task_plan(2, 4, hops_per_run=4) == build_task_plan(2, 4, hops_per_run=4)


def test_a_continuing_run_is_named_in_its_conf_and_its_folder_points_at_the_search(tmp_path):
    assert continuation_of({"search": {}}) is None and continuation_of(None) is None
    block = Continuation(first_run="manual__1", block=2, start=8)
    assert continuation_of({"mop_continues": block.to_dict()}) == block
    for bad in ({"first_run": "manual__1"}, {"first_run": "manual__1", "block": 0, "start": 8}, "block 2"):
        with pytest.raises(SpecError, match="conf.mop_continues") as err:
            continuation_of({"mop_continues": bad})
        assert "trigger without mop_continues" in str(err.value)
    store = Store(f"file://{tmp_path}")
    first = RunLayout(store, "dag", "manual__1")
    later = RunLayout(store, "dag", "manual__1__block_2")
    store.write_json(first.run_record_uri, {"dag_id": "dag", "run_id": "manual__1", "created_at": "2026-11-24T00:00:00",
                                            "spec": tiny_spec("/d.parquet", f"file://{tmp_path}"), "configs": []})
    store.write_json(later.continues_uri, block.to_dict())
    assert run_folder(store, "dag", later.run_id).run_id == "manual__1"
    assert run_folder(store, "dag", "manual__1").run_id == "manual__1"
    assert run_folder(store, "dag", "never_ran").run_id == "never_ran"  # no pointer: its own (missing) folder
    assert stored_run(store, "dag", later.run_id).run_id == "manual__1"
    chain = RunChain(["manual__1"]).with_run("manual__1__block_1").with_run("manual__1__block_1")
    assert RunChain.from_dict(chain.to_dict()).runs == ["manual__1", "manual__1__block_1"]


@pytest.mark.integration
def test_dag_test_refuses_a_split_search_before_anything_trains(airflow_db, tmp_path):
    from tests.conftest import write_dag_file
    from tests.test_end_to_end import write_digits

    write_digits(tmp_path / "digits.parquet")
    spec = tiny_spec(tmp_path / "digits.parquet", f"file://{tmp_path / 'store'}", iterations=2, iterations_per_run=1)
    dag_run = write_dag_file("mop_split_in_dag_test", spec).test()
    assert dag_run.state == "failed"
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states["preflight"] == "failed" and states["list_data"] == "upstream_failed"
    assert not (tmp_path / "store" / "mop_split_in_dag_test").exists() or not list(
        (tmp_path / "store" / "mop_split_in_dag_test").rglob("hops/*"))


def test_a_run_holds_whole_iterations():
    from mop_airflow.planning.run_chain import hops_per_run

    assert hops_per_run(10, 64, "auto") == 640  # 64 shards: still one run, 64 train tasks
    assert hops_per_run(10, 8, 2) == 16


def test_a_fraction_of_an_iteration_is_refused_saying_a_run_holds_whole_iterations():
    with pytest.raises(SpecError) as err:
        tiny_spec_with(shards=4, iterations_per_run=0.5)
    assert err.value.field == "schedule.iterations_per_run" and "no longer takes a fraction" in err.value.rule
    assert "set a whole number" in err.value.fix


def test_a_later_run_s_train_tasks_resume_each_class_from_the_hop_records_and_drop_the_failed(tmp_path):
    """A plain search's block that starts at hop 3 of 2 shards: shard o holds class (o - 3) mod 2 in the
    plan's lineup, each configuration from its state after hop 2; one whose hop 2 failed is dropped and
    reported."""
    from mop_airflow.planning.resume import plain_classes
    from mop_airflow.records import HopRecord, Plan

    layout = RunLayout(Store(f"file://{tmp_path}"), "d", "r")
    plan = Plan(shards=2, iterations=2, seed=0, priority="remaining", model_hops_total=12,
                classes=[["a", "b"], ["c"]], lineup=[["b", "a"], ["c"]])
    for cid, status in (("a", "ok"), ("b", "failed"), ("c", "ok")):
        HopRecord(config_id=cid, t=2, iteration=1, hop=0, shard=0, status=status, checkpoint_sha256=f"sha-{cid}",
                  best_t=1, best_metric=0.5).write(layout.store, layout.hop_record_uri(cid, 2))
    stopped = []
    classes = plain_classes(layout, plan, 3, lambda cid, hop: stopped.append((cid, hop)))
    assert [[(a.config_id, a.t, a.checkpoint_sha256, a.best_t) for a in per] for per in classes] == [
        [("c", 2, "sha-c", 1)], [("a", 2, "sha-a", 1)]]
    assert classes[1][0].checkpoint == layout.checkpoint_uri("a", 2) and stopped == [("b", 2)]
    first = plain_classes(layout, plan)  # the first run: the lineup from scratch, nothing read
    assert [[(a.config_id, a.t, a.checkpoint) for a in per] for per in first] == [
        [("b", -1, None), ("a", -1, None)], [("c", -1, None)]]
