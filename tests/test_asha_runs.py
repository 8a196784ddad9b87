"""ASHA decided between blocks of hops on a real Airflow: one block a DAG run, each to the next decision.

4 configurations, rungs at 1 and 3 iterations, eta 3, 2 shards: block 1 starts all four (the
capacity is two configurations per slot) and trains them one iteration, to rung 0's end; its decide
step promotes the best of the four (floor(4/3) = 1) and starts the next run, whose block trains it
the two more iterations to rung 1's end in one go; that run's decide step finds nothing left to train
and its run reports. Every decision is recorded with what it
saw, and the leaderboard says where each configuration stopped and why. A hop task SIGKILLed half-way
through the search is retried, and the search decides and ranks as the undisturbed one does; so does
one whose scheduler is stopped between two blocks and started again.
"""

import json
import math
import time

import pytest

from mop_airflow.airflow.local import LocalAirflow
from mop_airflow.records import BlockDecision, HopRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import dag_file, failed_logs
from tests.killer import killer_source
from tests.test_end_to_end import MLP, tiny_spec, write_digits

pytestmark = pytest.mark.integration

ASHA = "mop_asha_blocks"
KILLED, UNDISTURBED = "mop_asha_killed", "mop_asha_undisturbed"
RESTARTED = "mop_asha_restarted"
TWO_BLOCKS = "mop_asha_two_blocks"

# A builder whose training process SIGKILLs itself at its 15th training batch in the first try of the
# KILLED DAG's shard 1 train task in the search's second run (the promoted configuration's block);
# importable by the task processes through PYTHONPATH, outside the DAG folder.
KILLER = killer_source('_batches == 15 and env.get("AIRFLOW_CTX_DAG_ID") == "mop_asha_killed" and '
                       'env.get("AIRFLOW_CTX_DAG_RUN_ID", "").endswith("__block_1") and '
                       'env.get("AIRFLOW_CTX_TASK_ID") == "train_shard_1" and env.get("AIRFLOW_CTX_TRY_NUMBER") == "1"',
                       "asha_killer")


def asha_spec(source, root):
    spec = tiny_spec(source, root)
    spec["search"]["space"] = {"method": "random", "seed": 5, "params": {
        "model": [MLP],
        "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32], "hparams": {"units": [32]}}}
    spec["search"]["adaptive"] = {"method": "asha", "n": 4, "r": 1, "R": 3, "eta": 3}
    spec["schedule"]["iterations_per_run"] = 1  # a DAG run a block, as a search too large for one run goes
    return spec


def block_decisions(store, dag_id, first):
    """What each of a search's block decisions started or promoted, at which rank, and how far it trained."""
    layout = RunLayout(store, dag_id, first)
    found = [BlockDecision.read(store, uri) for uri in sorted(store.glob(layout.block_decision_uri("*")))]
    return [([(j["config_id"], j["kind"], j["rung"], j["rank"]) for j in d.jobs], d.hops, d.start) for d in found]


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    root = tmp_path_factory.mktemp("asha")
    dags = root / "dags"
    dags.mkdir()
    write_digits(root / "digits.parquet")
    for dag_id in (ASHA, RESTARTED):
        dag_file(dags, dag_id, asha_spec(root / "digits.parquet", f"file://{root / 'store'}"))
    two = asha_spec(root / "digits.parquet", f"file://{root / 'store'}")
    two["schedule"]["iterations_per_run"] = 2
    dag_file(dags, TWO_BLOCKS, two)
    lib = root / "lib"
    lib.mkdir()
    (lib / "asha_killer.py").write_text(KILLER)
    for dag_id in (KILLED, UNDISTURBED):
        spec = asha_spec(root / "digits.parquet", f"file://{root / 'store'}")
        spec["search"]["space"]["params"]["model"] = ["asha_killer:mlp"]
        (dags / f"{dag_id}.py").write_text(
            "import datetime, json\nfrom mop_airflow import build_mop_dag\n"
            f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={dag_id!r},\n"
            "                    default_args={'retry_delay': datetime.timedelta(seconds=2)})\n")
    env = {"MOP_AIRFLOW_HOME": str(root / "mop"), "PYTHONPATH": str(lib)}
    with LocalAirflow(root / "airflow", dags, extra_env=env) as af:
        for dag_id in (ASHA, KILLED, UNDISTURBED, RESTARTED, TWO_BLOCKS):
            af.wait_for_dag(dag_id)
        af.root = root
        yield af


@pytest.mark.slow
def test_asha_promotes_the_best_of_a_rung_between_dag_runs_and_reports_where_each_stopped(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    first = airflow.trigger(ASHA)
    runs = [first, f"{first}__block_1"]
    for run_id in runs:
        assert airflow.wait_for_run(ASHA, run_id, timeout=420) == "success", failed_logs(airflow, ASHA, run_id)
    for run_id in runs:
        states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(ASHA, run_id)}
        assert states["decide"] == "success", run_id
        assert states["report"] == ("success" if run_id == runs[-1] else "skipped"), run_id
    layout = RunLayout(store, ASHA, first)
    assert not store.exists(RunLayout(store, ASHA, f"{first}__block_2").continues_uri)  # no third run

    blocks = [BlockDecision.read(store, layout.block_decision_uri(b)) for b in range(3)]
    assert [len(b.training) for b in blocks] == [4, 1, 0] and blocks[2].finished
    assert [(b.hops, b.start) for b in blocks[:2]] == [(2, 0), (4, 2)]  # to iteration 1, then on to 3 in one block
    assert [j["kind"] for j in blocks[0].jobs] == ["start"] * 4 and blocks[0].capacity == 4
    (promotion,) = blocks[1].jobs
    assert (promotion["kind"], promotion["rung"], promotion["iterations"], promotion["rank"], promotion["of"]) == \
        ("promote", 1, 3, 1, 4)
    # the promoted one is the best val_accuracy after one iteration, read from the hop records themselves
    ids = [j["config_id"] for j in blocks[0].jobs]
    after_one = {cid: HopRecord.read(store, layout.hop_record_uri(cid, 1)).val_metrics["val_accuracy"] for cid in ids}
    best = max(sorted(after_one), key=lambda cid: after_one[cid])
    assert promotion["config_id"] == best and promotion["metric"] == pytest.approx(after_one[best])
    assert blocks[1].training == {best: 2} and blocks[1].ends == [best]
    # it trained hops 0..5 (3 iterations x 2 shards), resuming from its checkpoints; the others hops 0..1
    hops = {}
    for uri in store.glob(layout.hops_glob):
        record = store.read_json(uri)
        hops.setdefault(record["config_id"], []).append(record["t"])
    assert sorted(hops[best]) == list(range(6))
    assert all(sorted(hops[cid]) == [0, 1] for cid in ids if cid != best)
    assert [c["config_id"] for c in blocks[2].completions][-1] == best

    board = store.read_json(layout.report_uri("leaderboard.json"))
    rows = {row["config_id"]: row for row in board["leaderboard"]}
    assert rows[best]["outcome"] == "finished: reached the last rung, 3 iterations" and rows[best]["rung"] == 1
    for cid in ids:
        if cid != best:
            assert rows[cid]["status"] == "pruned" and rows[cid]["rung"] == 0
            assert rows[cid]["outcome"].startswith("stopped at rung 0 (1 iteration(s)): ranked ")
            assert "of 4 that completed it; ASHA promotes from the best 1/3 (1 promoted)" in rows[cid]["outcome"]
    assert [d["kind"] for d in board["decisions"]] == ["start"] * 4 + ["promote"]
    assert board["decisions"][-1]["block"] == 1
    assert math.isclose(rows[best]["val_accuracy"],
                        HopRecord.read(store, layout.hop_record_uri(best, 5)).val_metrics["val_accuracy"])


@pytest.mark.slow
def test_a_hop_killed_half_way_through_asha_is_retried_and_the_search_decides_and_ranks_the_same(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    searches = {dag_id: airflow.trigger(dag_id) for dag_id in (KILLED, UNDISTURBED)}
    for dag_id, first in searches.items():
        for run_id in (first, f"{first}__block_1"):
            assert airflow.wait_for_run(dag_id, run_id, timeout=420) == "success", failed_logs(airflow, dag_id, run_id)
    killed_first = searches[KILLED]
    tries = [ti for ti in airflow.task_instances(KILLED, f"{killed_first}__block_1")
             if ti["task_id"] == "train_shard_1" and ti["state"] == "success"]
    assert [ti["try_number"] for ti in tries] == [2]  # the killed train task ran again

    assert block_decisions(store, KILLED, killed_first) == block_decisions(store, UNDISTURBED, searches[UNDISTURBED])
    boards = {dag_id: store.read_json(RunLayout(store, dag_id, first).report_uri("leaderboard.json"))["leaderboard"]
              for dag_id, first in searches.items()}
    assert [(r["config_id"], r["outcome"]) for r in boards[KILLED]] == \
        [(r["config_id"], r["outcome"]) for r in boards[UNDISTURBED]]
    for a, b in zip(boards[KILLED], boards[UNDISTURBED]):
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1e-6)


@pytest.mark.slow
def test_a_scheduler_stopped_between_two_blocks_and_started_again_goes_on_and_ranks_the_same(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    first = airflow.trigger(RESTARTED)
    # Polled often, so that the scheduler stops before it has started anything of the next block
    # (its first tasks take seconds before a hop can start).
    assert airflow.wait_for_run(RESTARTED, first, timeout=420, tick=0.3) == "success", \
        failed_logs(airflow, RESTARTED, first)
    scheduler_log = airflow.home / "logs" / "scheduler.log"
    old = airflow.processes["scheduler"]
    airflow.stop_service("scheduler")
    try:  # whatever fails while it is down, the module's other tests need it back
        block_1 = airflow.task_instances(RESTARTED, f"{first}__block_1")
        hops = [ti["state"] for ti in block_1 if ti["task_id"].startswith("train_shard_")]
        health = airflow.client.get("/api/v2/monitor/health").json()["scheduler"]["status"]
        reference = airflow.trigger(ASHA)
        time.sleep(5)
        reference_state = airflow.run_state(ASHA, reference)
        starts = scheduler_log.read_text().count("Starting the scheduler")
    finally:
        airflow.start_service("scheduler")
    # It left its loop on SIGTERM by itself: nothing had to be killed (a negative code). Airflow's
    # scheduler may still exit 1 when the signal lands while it enqueues tasks: on its way out it
    # commits inside its HA-lock guard ("UNEXPECTED COMMIT - THIS WILL BREAK HA LOCKS!").
    assert old.returncode == 0 or (old.returncode == 1 and "UNEXPECTED COMMIT" in scheduler_log.read_text())
    assert hops and hops == [None] * len(hops)  # between two blocks: no hop of block 1 had started
    assert health == "unhealthy" and reference_state == "queued"  # no scheduler, so no run starts
    airflow.wait_healthy()
    assert airflow.processes["scheduler"].pid != old.pid
    assert scheduler_log.read_text().count("Starting the scheduler") == starts + 1

    searches = {RESTARTED: first, ASHA: reference}
    for dag_id, run in searches.items():
        for run_id in (run, f"{run}__block_1"):
            assert airflow.wait_for_run(dag_id, run_id, timeout=420) == "success", failed_logs(airflow, dag_id, run_id)
    assert block_decisions(store, RESTARTED, first) == block_decisions(store, ASHA, reference)
    boards = {dag_id: store.read_json(RunLayout(store, dag_id, run).report_uri("leaderboard.json"))["leaderboard"]
              for dag_id, run in searches.items()}
    assert [(r["config_id"], r["outcome"]) for r in boards[RESTARTED]] == \
        [(r["config_id"], r["outcome"]) for r in boards[ASHA]]
    for a, b in zip(boards[RESTARTED], boards[ASHA]):
        assert (a["val_accuracy"], a["val_loss"]) == pytest.approx((b["val_accuracy"], b["val_loss"]), abs=1e-6)


@pytest.mark.slow
def test_two_blocks_a_run_decide_and_rank_as_one_block_a_run(airflow):
    """iterations_per_run=2: the first run trains blocks 1 and 2 (block 2's deal tasks wait for the
    decision after block 1), and its last decide step finds the search ended, so that run reports and
    starts none. The decisions and the leaderboard are those of a DAG run a block."""
    store = Store(f"file://{airflow.root / 'store'}")
    searches = {TWO_BLOCKS: airflow.trigger(TWO_BLOCKS), ASHA: airflow.trigger(ASHA)}
    for dag_id, blocks in ((TWO_BLOCKS, ()), (ASHA, (1,))):
        first = searches[dag_id]
        for run_id in [first] + [f"{first}__block_{b}" for b in blocks]:
            assert airflow.wait_for_run(dag_id, run_id, timeout=420) == "success", failed_logs(airflow, dag_id, run_id)
    first = searches[TWO_BLOCKS]
    assert not store.exists(RunLayout(store, TWO_BLOCKS, f"{first}__block_2").continues_uri)  # no second run
    states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(TWO_BLOCKS, first)}
    assert (states["block_1.decide"], states["decide"], states["report"]) == ("success", "success", "success")
    assert {s for t, s in states.items() if t.startswith("block_1.train_shard_")} == {"success"}
    assert block_decisions(store, TWO_BLOCKS, first) == block_decisions(store, ASHA, searches[ASHA])
    boards = {dag_id: store.read_json(RunLayout(store, dag_id, run).report_uri("leaderboard.json"))["leaderboard"]
              for dag_id, run in searches.items()}
    assert [(r["config_id"], r["outcome"]) for r in boards[TWO_BLOCKS]] == \
        [(r["config_id"], r["outcome"]) for r in boards[ASHA]]
    for a, b in zip(boards[TWO_BLOCKS], boards[ASHA]):
        assert (a["val_accuracy"], a["val_loss"]) == pytest.approx((b["val_accuracy"], b["val_loss"]), abs=1e-6)
