"""The example DAGs import cleanly and have the MOP shape: per-shard pools/queues, one upstream per hop."""

import subprocess
import sys

import pytest

from mop_airflow.pools import shard_pool
from mop_airflow.schedule import upstream_shard
from tests.conftest import REPO
from tests.test_spec import spec_dict


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_example_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "mop_mnist1d" in dagbag.dag_ids


def test_every_training_task_has_its_shards_pool_and_queue(dagbag):
    for dag in dagbag.dags.values():
        train = [t for t in dag.tasks if ".shard_" in t.task_id]
        assert train, dag.dag_id
        for task in train:
            shard = int(task.task_id.rsplit("_", 1)[1])
            assert task.pool == shard_pool(shard) == task.queue


def test_parsing_imports_neither_tensorflow_nor_great_expectations():
    code = ("import sys, importlib.util as u; s = u.spec_from_file_location('d', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); "
            "print(sorted(x for x in ('tensorflow', 'keras', 'great_expectations', 'pandas') if x in sys.modules))")
    for path in sorted((REPO / "dags").glob("*.py")):
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
        assert out.stdout.strip().splitlines()[-1] == "[]", (path, out.stdout)


def test_shape_depends_only_on_shards_and_iterations():
    from mop_airflow.dag_factory import build_mop_dag

    a = build_mop_dag(spec_dict(), dag_id="a")
    other = spec_dict()
    other["search"]["space"]["params"]["learning_rate"] = [1e-4, 1e-3, 1e-2, 1e-1]
    b = build_mop_dag(other, dag_id="b")
    edges = lambda dag: sorted((u, t.task_id) for t in dag.tasks for u in t.upstream_task_ids)  # noqa: E731
    assert edges(a) == edges(b)


@pytest.mark.parametrize("shards, iterations", [(1, 1), (3, 2), (4, 3)])
def test_each_hop_waits_only_for_the_models_it_receives(shards, iterations):
    from mop_airflow.dag_factory import build_mop_dag

    spec = spec_dict(schedule__shards=shards, schedule__iterations=iterations)
    dag = build_mop_dag(spec, dag_id="shape")
    train = [t for t in dag.tasks if ".shard_" in t.task_id]
    assert len(train) == shards * shards * iterations
    for i in range(iterations):
        for k in range(shards):
            t = i * shards + k
            for s in range(shards):
                task = dag.get_task(f"iteration_{i}.hop_{k}.shard_{s}")
                if t == 0:
                    expected = {f"stage_shard_{s}"}
                else:
                    pi, pk = divmod(t - 1, shards)
                    expected = {f"iteration_{pi}.hop_{pk}.shard_{upstream_shard(s, shards)}"}
                assert task.upstream_task_ids == expected  # no barrier: one upstream task, not the whole hop
    last = {f"iteration_{iterations - 1}.hop_{shards - 1}.shard_{s}" for s in range(shards)}
    assert dag.get_task("report").upstream_task_ids == last
    assert dag.get_task("preflight").downstream_task_ids == {"validate"}


def adaptive_spec(adaptive, shards=2):
    spec = spec_dict(schedule__shards=shards)
    spec["search"]["space"] = {"method": "random", "params": {
        "model": "mop_airflow.examples.mnist1d_models:mlp",
        "learning_rate": {"distribution": "log_uniform", "low": 1e-3, "high": 1e-1}}}
    spec["search"]["adaptive"] = adaptive
    return spec


def test_hyperband_dag_has_a_branching_promote_task_between_rungs():
    from mop_airflow.dag_factory import build_mop_dag
    from mop_airflow.operators.promote import MopPromoteOperator

    dag = build_mop_dag(adaptive_spec({"method": "hyperband", "R": 9, "eta": 3}), dag_id="hb")
    promotes = sorted(t.task_id for t in dag.tasks if isinstance(t, MopPromoteOperator))
    # R=9, eta=3: bracket 2 has 3 rungs (2 promotions), bracket 1 has 2 (1), bracket 0 has 1 (0)
    assert promotes == ["bracket_1.rung_0.promote", "bracket_2.rung_0.promote", "bracket_2.rung_1.promote"]
    promote = dag.get_task("bracket_2.rung_1.promote")
    # rung 1 of bracket 2 trains from 1 to 3 iterations: its last hop is iteration 2, hop 1
    assert promote.upstream_task_ids == {f"bracket_2.rung_1.iteration_2.hop_1.shard_{s}" for s in range(2)}
    assert promote.downstream_task_ids == {f"bracket_2.rung_2.stage_shard_{s}" for s in range(2)}
    assert promote.next_stage_ids == sorted(promote.downstream_task_ids)
    # a promoted configuration resumes: rung 2 starts at global hop 6 (3 iterations x 2 shards)
    first = dag.get_task("bracket_2.rung_2.iteration_3.hop_0.shard_0")
    assert first.partial_kwargs["t"] == 6 and first.upstream_task_ids == {"bracket_2.rung_2.stage_shard_0"}
    assert dag.get_task("report").upstream_task_ids == {
        f"bracket_{b}.rung_{r}.iteration_8.hop_1.shard_{s}" for b, r in ((2, 2), (1, 1), (0, 0)) for s in range(2)}
    # every bracket's stage and hop tasks use the shared shard pools
    for task in dag.tasks:
        if ".shard_" in task.task_id:
            shard = int(task.task_id.rsplit("_", 1)[1])
            assert task.pool == task.queue == shard_pool(shard)


def test_successive_halving_is_one_bracket_on_the_same_machinery():
    from mop_airflow.dag_factory import build_mop_dag

    dag = build_mop_dag(adaptive_spec({"method": "successive_halving", "n": 8, "r": 1, "eta": 2}), dag_id="sh")
    groups = {t.task_id.split(".")[0] for t in dag.tasks if t.task_id.startswith("bracket_")}
    assert groups == {"bracket_3"}  # n=8, eta=2: rungs of 8, 4, 2, 1 configurations
    assert sorted(t.task_id for t in dag.tasks if t.task_id.endswith("promote")) == [
        f"bracket_3.rung_{i}.promote" for i in range(3)]


def test_adaptive_plan_cannot_change_per_run():
    from mop_airflow.errors import SpecError
    from mop_airflow.spec import MopSpec

    spec = MopSpec.from_dict(adaptive_spec({"method": "hyperband", "R": 9, "eta": 3}))
    with pytest.raises(SpecError) as info:
        spec.with_overrides({"search": {"adaptive": {"method": "hyperband", "R": 27, "eta": 3}}})
    assert info.value.field == "conf.search.adaptive"
    assert len(spec.configurations()) == 17  # the plan decides how many configurations are drawn
