"""Hyperband in blocks to the rung ends, one DAG run, on a real Airflow: the leaderboard of the shape
it replaced, to every digit, and the same search whatever a SIGKILLed train task or a failing
configuration does.

R=9, eta=3 on 2 shards: 17 configurations in 3 brackets side by side, whose rungs end at iteration 1,
3 or 9, so the search is 3 blocks (each a train task per shard, then a decide step) in one run. Until
November 2026 the same search was drawn into one DAG run as bracket and rung task groups with promote
tasks; ``DRAWN_BOARD`` is its leaderboard, recorded from that shape (same spec, same seeds). The same
configurations train on the same shards in the same order with the same seeds, so nothing moves.
"""

import json

import pytest

from mop_airflow.records import BlockDecision
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import airflow_part, failed_logs
from tests.killer import killer_source
from tests.test_end_to_end import MLP, tiny_spec, write_digits

pytestmark = pytest.mark.integration

HYPERBAND, KILLED, UNDISTURBED = "mop_hb_blocks", "mop_hb_killed", "mop_hb_undisturbed"

# (rank, config id, val_accuracy, status, bracket), recorded from the drawn shape (bracket and rung task
# groups, promote tasks) by a dag.test() of hyperband_spec below, TensorFlow on the CPU, 1 thread a hop.
DRAWN_BOARD = [
    (1, "c004-19d96a", 0.9693593382835388, "finished", 2), (2, "c009-93606c", 0.9498607516288757, "finished", 1),
    (3, "c014-f3e231", 0.9275766015052795, "finished", 0), (4, "c003-cc37b7", 0.9136490225791931, "pruned", 2),
    (5, "c002-1abce9", 0.9108635187149048, "pruned", 2), (6, "c016-2552a9", 0.8913649320602417, "finished", 0),
    (7, "c015-3909f3", 0.8467966318130493, "finished", 0), (8, "c011-5ff8bb", 0.8189415335655212, "pruned", 1),
    (9, "c008-528c1b", 0.6935933232307434, "pruned", 2), (10, "c000-e5a8ff", 0.6768802404403687, "pruned", 2),
    (11, "c006-ac154d", 0.5933147668838501, "pruned", 2), (12, "c010-0f0bbf", 0.4623955488204956, "pruned", 1),
    (13, "c007-197473", 0.4373258948326111, "pruned", 2), (14, "c013-599ea3", 0.43454039096832275, "pruned", 1),
    (15, "c012-d7ac8e", 0.24512535333633423, "pruned", 1), (16, "c001-85d276", 0.13649025559425354, "pruned", 2),
    (17, "c005-c7ccd7", 0.13370473682880402, "pruned", 2),
]

# SIGKILLs the train task of shard 1 in the middle of block 2 (iterations 1 to 3), on its first try.
KILLER = killer_source('_batches == 40 and env.get("AIRFLOW_CTX_DAG_ID") == "mop_hb_killed" and '
                       'env.get("AIRFLOW_CTX_TASK_ID") == "block_1.train_shard_1" and '
                       'env.get("AIRFLOW_CTX_TRY_NUMBER") == "1"', "hb_killer")


def hyperband_spec(source, root, model=MLP, R=9):
    spec = tiny_spec(source, root)
    spec["search"]["space"] = {"method": "random", "seed": 5, "params": {
        "model": [model], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32], "hparams": {"units": {"distribution": "choice", "values": [16, 32]}}}}
    spec["search"]["adaptive"] = {"method": "hyperband", "R": R, "eta": 3}
    return spec


@pytest.fixture(scope="module")
def airflow(shared_airflow, tmp_path_factory):
    root = tmp_path_factory.mktemp("hb_blocks")
    lib = root / "lib"
    lib.mkdir()
    (lib / "hb_killer.py").write_text(KILLER)
    with airflow_part(shared_airflow, root, "hb_blocks", paths=[lib]) as af:
        write_digits(root / "digits.parquet")
        store = f"file://{root / 'store'}"
        af.dag_file(HYPERBAND, hyperband_spec(root / "digits.parquet", store))
        for dag_id in (KILLED, UNDISTURBED):  # R=3: bracket 1's rung 0 ends at iteration 1, block 2 trains to 3
            spec = hyperband_spec(root / "digits.parquet", store, model="hb_killer:mlp", R=3)
            af.write_dag(dag_id,
                "import datetime, json\nfrom mop_airflow import build_mop_dag\n"
                f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={dag_id!r},\n"
                "                    default_args={'retry_delay': datetime.timedelta(seconds=2)})\n")
        af.wait_for_dags(HYPERBAND, KILLED, UNDISTURBED)
        yield af


@pytest.mark.slow
def test_hyperband_runs_whole_in_one_dag_run_of_three_blocks_and_ranks_as_the_drawn_shape_did(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    run = airflow.trigger(HYPERBAND)
    assert airflow.wait_for_run(HYPERBAND, run, timeout=600) == "success", failed_logs(airflow, HYPERBAND, run)
    assert not store.exists(RunLayout(store, HYPERBAND, f"{run}__block_1").continues_uri)  # no second DAG run
    states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(HYPERBAND, run)}
    assert {t for t in states if "train_shard_" in t} == {f"{p}train_shard_{s}" for p in ("", "block_1.", "block_2.")
                                                          for s in range(2)}
    assert set(states.values()) == {"success"}

    layout = RunLayout(store, HYPERBAND, run)
    blocks = [BlockDecision.read(store, layout.block_decision_uri(b)) for b in range(4)]
    # to iteration 1 (17 configurations), 3 (bracket 2's 3 promoted, bracket 1's 5, bracket 0's 3), 9
    assert [(b.start, b.hops, len(b.training)) for b in blocks[:3]] == [(0, 2, 17), (2, 4, 11), (6, 12, 5)]
    assert blocks[3].finished and not blocks[3].training

    board = store.read_json(layout.report_uri("leaderboard.json"))
    rows = [(r["rank"], r["config_id"], r["val_accuracy"], r["status"], r["bracket"]) for r in board["leaderboard"]]
    assert [row[:2] + row[3:] for row in rows] == [row[:2] + row[3:] for row in DRAWN_BOARD]
    for row, drawn in zip(rows, DRAWN_BOARD):
        assert row[2] == pytest.approx(drawn[2], abs=1e-6), row[1]
    assert set(board["best_per_bracket"]) == {"0", "1", "2"}


@pytest.mark.slow
def test_a_train_task_killed_mid_block_is_retried_and_the_search_ranks_the_same(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    runs = {dag_id: airflow.trigger(dag_id) for dag_id in (KILLED, UNDISTURBED)}
    for dag_id, run in runs.items():
        assert airflow.wait_for_run(dag_id, run, timeout=600) == "success", failed_logs(airflow, dag_id, run)
    tries = [ti["try_number"] for ti in airflow.task_instances(KILLED, runs[KILLED])
             if ti["task_id"] == "block_1.train_shard_1"]
    assert tries == [2]  # killed on its first try, trained the rest on its second
    boards = {dag_id: store.read_json(RunLayout(store, dag_id, run).report_uri("leaderboard.json"))["leaderboard"]
              for dag_id, run in runs.items()}
    assert [(r["config_id"], r["status"], r["outcome"]) for r in boards[KILLED]] == \
        [(r["config_id"], r["status"], r["outcome"]) for r in boards[UNDISTURBED]]
    for a, b in zip(boards[KILLED], boards[UNDISTURBED]):
        assert (a["val_accuracy"], a["val_loss"]) == pytest.approx((b["val_accuracy"], b["val_loss"]), abs=1e-6)
