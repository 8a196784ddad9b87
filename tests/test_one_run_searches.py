"""A small population-based training or model-based (TPE) search holds all its blocks in one DAG run,
so `dag.test()` (what `airflow dags test` runs) trains it whole: decided between blocks all the same,
with every copy and proposal recorded. A large one takes a DAG run a block."""

import pytest

from mop_airflow.config import MopSpec
from mop_airflow.planning.task_plan import spec_task_plan
from mop_airflow.records import BlockDecision
from mop_airflow.records.layout import RunLayout, read_run
from mop_airflow.store import Store
from tests.conftest import write_dag_file
from tests.test_end_to_end import MLP, tiny_spec, write_digits

LR = {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2}


def pbt(source, root, population=3, iterations=3):
    spec = tiny_spec(source, root)
    spec["search"]["space"] = {"method": "random", "seed": 2, "params": {
        "model": [MLP], "learning_rate": LR, "batch_size": [16, 32], "hparams": {"units": [32]}}}
    spec["search"]["adaptive"] = {"method": "pbt", "population": population, "iterations": iterations, "interval": 1,
                                  "mutations": {"learning_rate": LR}}
    return spec


def tpe(source, root, n=5):
    spec = tiny_spec(source, root, iterations=1)
    spec["search"]["space"] = {"method": "random", "seed": 2, "num_samples": n, "sampler": "tpe", "startup": 2,
                               "params": {"model": [MLP], "learning_rate": LR, "batch_size": [16, 32],
                                          "hparams": {"units": [32]}}}
    return spec


def test_a_small_search_renders_every_block_and_a_large_one_a_block_a_run(tmp_path):
    small = spec_task_plan(MopSpec.from_dict(pbt("/data/x.parquet", "memory://a")))
    decides = [t for t in small.tasks if t.kind == "decide"]
    assert [t.task_id for t in decides] == ["block_1.decide", "block_2.decide", "decide"]
    assert [t.args.get("block") for t in decides] == [0, 1, 2] and decides[-1].args["last"]
    trains = [t for t in small.tasks if t.kind == "train"]  # each reads what it trains from its block's decision
    assert sorted((t.args["block"], t.args["shard"]) for t in trains) == [(k, s) for k in range(3) for s in range(2)]
    assert [t.upstream for t in trains if t.args["block"] == 2] == [("block_2.decide",)] * 2
    assert [t.args for t in small.tasks if t.kind == "report"] == [{"decided": True, "blocks": 3}]
    large = spec_task_plan(MopSpec.from_dict(pbt("/data/x.parquet", "memory://a", population=8, iterations=2000)))
    # too large for one run: one block a run, its decide step starts the DAG's next run
    assert [t.task_id for t in large.tasks if t.kind == "decide"] == ["decide"] and large.train_tasks < 100
    # a model-based random search: ceil(5 / 4) waves of one iteration, 4 configurations a block
    assert [t.task_id for t in spec_task_plan(MopSpec.from_dict(tpe("/data/x.parquet", "memory://a"))).tasks
            if t.kind == "decide"] == ["block_1.decide", "decide"]


@pytest.mark.integration
def test_dag_test_trains_a_small_pbt_and_a_tpe_search_whole(airflow_db, tmp_path):
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    store = Store(root)

    run = write_dag_file("mop_pbt_one_run", pbt(source, root)).test()
    assert run.state == "success"
    layout = RunLayout(store, "mop_pbt_one_run", run.run_id)
    blocks = [BlockDecision.read(store, layout.block_decision_uri(b)) for b in range(4)]
    assert [len(b.copies) for b in blocks] == [0, 1, 1, 0] and blocks[3].finished  # ceil(3 x 0.25) = 1 a boundary
    board = store.read_json(layout.report_uri("leaderboard.json"))
    assert len(board["leaderboard"]) == 5 and len(board["lineage"]) == 2
    assert {r["config_id"] for r in board["leaderboard"] if r["outcome"].startswith("finished")} == set(blocks[3].members)

    run = write_dag_file("mop_tpe_one_run", tpe(source, root)).test()
    assert run.state == "success"
    layout = RunLayout(store, "mop_tpe_one_run", run.run_id)
    blocks = [BlockDecision.read(store, layout.block_decision_uri(b)) for b in range(3)]
    # block 1: the 2 random start-up draws and 2 proposals (capacity 4); block 2: the last proposal
    assert [len(b.proposed) for b in blocks] == [2, 1, 0] and blocks[2].finished
    assert len(read_run(layout).configs) == 5
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    assert len(board) == 5 and all(r["status"] == "finished" for r in board)


@pytest.mark.integration
def test_dag_test_trains_an_asha_search_with_a_budget_whole_and_stops_at_its_deadline(airflow_db, tmp_path):
    """ASHA with a budget of 8 iterations on 2 shards x 1 slot, decided inside the slots: one DAG run, one
    block. dag.test() runs one task at a time, so its first train task is every slot: it decides a job
    whenever nothing is ready, four starts and the promotion of the best of the first three; no leg is
    begun that would end past the budget, and the search trains 6 iterations of the 8."""
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    store = Store(root)
    spec = tiny_spec(source, root)
    spec["search"]["space"] = {"method": "random", "seed": 2, "params": {
        "model": [MLP], "learning_rate": LR, "batch_size": [16, 32], "hparams": {"units": [32]}}}
    spec["search"]["adaptive"] = {"method": "asha", "n": 4, "r": 1, "R": 3, "eta": 3, "budget": 8}

    run = write_dag_file("mop_asha_budget", spec).test()
    assert run.state == "success"
    assert not [ti.task_id for ti in run.get_task_instances() if ti.task_id.endswith("decide")]
    layout = RunLayout(store, "mop_asha_budget", run.run_id)
    decisions = [BlockDecision.read(store, u) for u in sorted(store.glob(layout.block_decision_uri("*")))]
    assert {d.capacity for d in decisions} == {2} and decisions[-1].finished and not decisions[-1].jobs
    jobs = [j for d in decisions for j in d.jobs]
    assert [j["kind"] for j in jobs] == ["start", "start", "start", "promote", "start"]
    promoted = next(j for j in jobs if j["kind"] == "promote")
    seen = decisions[3].completions  # what the promotion saw: the first three, ranked
    assert len(seen) == 3 and promoted["config_id"] == max(seen, key=lambda c: c["metric"])["config_id"]
    trained = sum(1 for _ in store.glob(layout.hops_glob))
    assert trained == (4 * 1 + 2) * 2 <= 8 * 2  # 6 iterations of 2 hops: within the budget
    board = {r["config_id"]: r for r in store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]}
    assert board[promoted["config_id"]]["outcome"] == "finished: reached the last rung, 3 iterations"
    assert len(board) == 4
