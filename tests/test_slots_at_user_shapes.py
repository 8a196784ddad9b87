"""The shard slots at the shapes users run, on a real Airflow (api-server, scheduler, dag-processor;
not ``dag.test()``).

- A grid of 8 configurations, 4 of them built with a layer whose output turns NaN some steps into their
  second or third hop (what a learning rate too high does), on 4 x 1, 8 x 1 and 3 x 2 shards x slots:
  the run succeeds, each diverged configuration is reported with where it diverged and its later hops
  settled, and every other configuration's hops train once, to the checkpoints of the same grid where
  nothing diverges, and rank as there. Before its
  failure was settled along the chain, the grid failed on 4 shards and hung on 8.
- ASHA (n=9, r=1, R=9, eta=3) of sleepy models on 2 shards with shard 1's train task stopped
  (SIGSTOP) mid-search: its watchdog kills it, Airflow retries it, shard 0 takes back the hop it had
  given up, and the search ends. Before, it never ended.
- The same ASHA with shard 1's pool held by another DAG past the wait bound before it starts: the
  search ends.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mop_airflow.planning.task_plan import shard_pool
from mop_airflow.records import BlockDecision, HopRecord, SlotStatus
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import airflow_part
from tests.test_end_to_end import MLP, tiny_spec, write_digits
from tests.test_slot_faults_scheduler import HOLDERS, Stopped, _held_during, _holder, _mop_dag, _run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAN = "tests.training.toys:nan_after_steps"
SLEEPY = "mop_airflow.examples.timed_models:sleepy"
REPO = Path(__file__).resolve().parents[1]
# shards, slots, the training step its layer turns NaN at, and the hop that step falls in (digits' 1,437
# training rows in batches of 32 are 12, 6 and 15 steps a hop): mid-search on every shape
SHAPES = {"4x1": (4, 1, 13, 1), "8x1": (8, 1, 13, 2), "3x2": (3, 2, 20, 1)}
ASHA_STOPPED, ASHA_LATE = "mop_asha_stopped", "mop_asha_late_peer"
WAIT_S = 20  # the ASHA DAGs' wait bound for a peer slot's hop


def _grid(root, shards, slots):
    spec = tiny_spec(root / "digits.parquet", f"file://{root / 'store'}", shards=shards, iterations=2,
                     slots_per_shard=slots)
    spec["search"]["space"]["params"] = {"model": [MLP, NAN], "learning_rate": [3e-3, 1e-2], "batch_size": [32],
                                         "hparams": {"units": [16, 32]}}
    return spec


def _asha(root):
    spec = tiny_spec(root / "digits.parquet", f"file://{root / 'store'}")
    spec["search"]["space"] = {"method": "random", "seed": 5, "params": {
        "model": [SLEEPY], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32], "hparams": {"units": [32], "seconds_per_batch": [0.04]}}}
    spec["search"]["adaptive"] = {"method": "asha", "n": 9, "r": 1, "R": 9, "eta": 3}
    return spec


@pytest.fixture(scope="module")
def airflow(shared_airflow, tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    write_digits(root / "digits.parquet")
    # 8 train tasks at once beside a control task: the shared Airflow's parallelism is 10 for this file
    # (preflight refuses fewer); the toy builders come from tests/
    with airflow_part(shared_airflow, root, "user_shapes", paths=[REPO]) as af:
        for name, (shards, slots, step, _) in SHAPES.items():
            _mop_dag(af, f"mop_diverging_{name}", _grid(root, shards, slots), {"MOP_TEST_NAN_AT_STEP": str(step)})
            _mop_dag(af, f"mop_clean_{name}", _grid(root, shards, slots), {"MOP_TEST_NAN_AT_STEP": "1000000"})
        bounds = {"MOP_SHARD_WAIT_SECONDS": str(WAIT_S), "MOP_SHARD_STALL_SECONDS": "60"}
        _mop_dag(af, ASHA_STOPPED, _asha(root), bounds)
        _mop_dag(af, ASHA_LATE, _asha(root), bounds)
        _holder(af, HOLDERS[1], shard_pool(1))
        for dag_id in [*(f"mop_{k}_{n}" for k in ("diverging", "clean") for n in SHAPES), ASHA_STOPPED, ASHA_LATE,
                       HOLDERS[1]]:
            af.wait_for_dag(dag_id)
        sync = subprocess.run([sys.executable, "-m", "mop_airflow.cli.main", "pools", "sync", "--shards", "8",
                               "--slots", "2"], env=af.env, capture_output=True, text=True)
        assert sync.returncode == 0, sync.stderr
        af.root = root
        af.store = Store(f"file://{root / 'store'}")
        yield af


def _board(af, dag_id, run_id):
    layout = RunLayout(af.store, dag_id, run_id)
    return {r["config_id"]: r for r in af.store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_grid_with_configurations_diverging_mid_search_succeeds_and_ranks_the_rest_as_without_them(airflow,
                                                                                                        shape):
    shards, slots, _, hop = SHAPES[shape]
    clean_id, clean_took = _run(airflow, f"mop_clean_{shape}", timeout=600)
    run_id, took = _run(airflow, f"mop_diverging_{shape}", timeout=600)
    clean, board = _board(airflow, f"mop_clean_{shape}", clean_id), _board(airflow, f"mop_diverging_{shape}", run_id)
    assert set(board) == set(clean) and len(board) == 8
    diverged = {cid for cid, row in board.items() if row["status"] == "diverged"}
    assert len(diverged) == 4 and all(clean[cid]["status"] == "finished" for cid in diverged)
    for cid in diverged:  # where its step fell: the hops before it trained, and nothing after the divergence
        assert board[cid]["outcome"].startswith(f"diverged at hop {hop} (iteration 0, shard "), board[cid]["outcome"]
        assert "loss=nan" in board[cid]["outcome"]
    for cid in set(board) - diverged:
        row, reference = board[cid], clean[cid]
        assert row["status"] == "finished"
        assert (row["val_accuracy"], row["val_loss"]) == (reference["val_accuracy"], reference["val_loss"])
    ranked = [cid for cid in sorted(clean, key=lambda c: clean[c]["rank"]) if cid not in diverged]
    assert sorted(ranked, key=lambda c: board[c]["rank"]) == ranked  # the others keep their order
    tries = {ti["task_id"]: ti["try_number"] for ti in airflow.task_instances(f"mop_diverging_{shape}", run_id)}
    assert {t: n for t, n in tries.items() if t.startswith("train_shard_")} == {
        t: 1 for t in tries if t.startswith("train_shard_")}  # no slot failed, none retried
    # the hops, as tests/training/test_failures_travel.py checks them in processes without Airflow: every
    # other configuration's hops trained once, to the bits of the run where nothing diverges; a diverged
    # one's later hops settled with the hop it diverged at; one marker a hop; every slot ended its block done
    clean_hops, hops = _hops(airflow, f"mop_clean_{shape}", clean_id), _hops(airflow, f"mop_diverging_{shape}", run_id)
    for (cid, t), record in clean_hops.items():
        if cid not in diverged:
            assert hops[cid, t].status == "ok" and hops[cid, t].checkpoint_sha256 == record.checkpoint_sha256
            assert hops[cid, t].try_number == 1
    for cid in diverged:
        mine = sorted((t, r) for (c, t), r in hops.items() if c == cid)
        first = next(r for _, r in mine if r.status != "ok")
        assert first.status == "diverged" and first.dropped_after is None and first.t == hop
        assert [t for t, r in mine if r.status == "ok"] == list(range(hop))
        later = [r for t, r in mine if t > first.t]
        assert later and all(r.dropped_after == first.t and r.error == first.error for r in later)
    layout = RunLayout(airflow.store, f"mop_diverging_{shape}", run_id)
    marked = [n.split(".", 2)[2] for folder in airflow.store.glob(f"{layout.run_uri}/slots/*/commits/*")
              for n in airflow.store.names_after(folder)]
    assert len(marked) == len(set(marked)) == len(hops)
    statuses = airflow.store.glob(f"{layout.run_uri}/slots/*/shard_*_slot_*.json")
    assert {u.rsplit("/", 1)[1] for u in statuses} == {f"shard_{s:02d}_slot_{k}.json" for s in range(shards)
                                                        for k in range(slots)}
    assert all(SlotStatus.from_dict(json.loads(airflow.store.read_bytes(u))).state == "done" for u in statuses)
    print(f"{shape}: diverging {took:.1f} s, clean {clean_took:.1f} s")


def _hops(af, dag_id, run_id):
    layout = RunLayout(af.store, dag_id, run_id)
    return {(r.config_id, r.t): r for r in (HopRecord.read(af.store, u) for u in af.store.glob(layout.hops_glob))}


def _asha_ended(af, dag_id, run_id, n=9):
    store = af.store
    layout = RunLayout(store, dag_id, run_id)
    decisions = [BlockDecision.read(store, u) for u in sorted(store.glob(layout.block_decision_uri("*")))]
    assert decisions[-1].finished and not any(d.finished for d in decisions[:-1])
    jobs = [j for d in decisions for j in d.jobs]
    starts = [j["config_id"] for j in jobs if j["kind"] == "start"]
    assert len(starts) == len(set(starts)) == n
    promotions = [(j["config_id"], j["rung"]) for j in jobs if j["kind"] == "promote"]
    assert len(promotions) == len(set(promotions)) >= 1
    board = _board(af, dag_id, run_id)
    assert sorted(board) == sorted(starts) and all(r["status"] in ("finished", "pruned") for r in board.values())
    hops = [store.read_json(u) for u in store.glob(layout.hops_glob)]
    assert all(h["status"] == "ok" for h in hops)
    assert len({(h["config_id"], h["t"]) for h in hops}) == len(hops)


def _running_for(af, dag_id, run_id, task_id) -> float:
    """Seconds since ``task_id``'s current try started (0 before it has)."""
    [ti] = [t for t in af.task_instances(dag_id, run_id) if t["task_id"] == task_id]
    if not ti["start_date"]:
        return 0.0
    return (dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(ti["start_date"])).total_seconds()


def _committed(af, dag_id, run_id, shard):
    layout = RunLayout(af.store, dag_id, run_id)
    return [n for b in af.store.glob(f"{layout.run_uri}/slots/*")
            for n in af.store.names_after(f"{b}/commits/shard_{shard:02d}_slot_0")]


def test_asha_with_a_slot_hung_mid_search_ends(airflow):
    def stop(run_id):
        deadline = time.time() + 300
        while len(_committed(airflow, ASHA_STOPPED, run_id, 1)) < 6 and time.time() < deadline:
            time.sleep(0.05)
        layout = RunLayout(airflow.store, ASHA_STOPPED, run_id)
        status = [SlotStatus.from_dict(json.loads(airflow.store.read_bytes(u)))
                  for u in airflow.store.glob(f"{layout.run_uri}/slots/*/shard_01_slot_0.json")]
        assert status and status[0].state == "running", "shard 1 ended before it could be stopped"
        stopped.stop(status[0].pid)

    with Stopped() as stopped:  # never leaves a stopped process behind
        run_id, took = _run(airflow, ASHA_STOPPED, during=stop, timeout=900)
    tries = {ti["task_id"]: ti["try_number"] for ti in airflow.task_instances(ASHA_STOPPED, run_id)}
    assert tries["train_shard_1"] == 2 and tries["train_shard_0"] == 1, tries
    _asha_ended(airflow, ASHA_STOPPED, run_id)
    log = airflow.task_log(ASHA_STOPPED, run_id, "train_shard_0", 1)
    if "given up" in log:  # shard 0 waited past its bound for the stopped slot: it took the hop back
        assert "taken back" in log
    print(f"ASHA, a slot stopped: {took:.1f} s")


def test_asha_with_a_slot_held_past_the_wait_bound_ends(airflow):
    # held until shard 0's train task has run for the wait bound and 30 s more (it trains its first hops in
    # about 10 s, then waits for shard 1's): from its start, so a task that started late still waits past it
    run_id, took = _held_during(airflow, ASHA_LATE, 1, until=lambda run_id: _running_for(
        airflow, ASHA_LATE, run_id, "train_shard_0") > WAIT_S + 30)
    tries = {ti["task_id"]: ti["try_number"] for ti in airflow.task_instances(ASHA_LATE, run_id)}
    assert tries["train_shard_1"] == 1, tries
    _asha_ended(airflow, ASHA_LATE, run_id)
    print(f"ASHA, a slot held past the wait bound: {took:.1f} s")
