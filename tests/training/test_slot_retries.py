"""A retried slot never trains a committed hop again nor writes its record again, even when the hop's
checkpoint was cleaned up since (``store.keep_checkpoints``) and the hop that took it on was trained by
a slot whose markers the retry does not list (the next shard's). A lost Celery worker's retry took such
a hop for "not committed", trained it again from its initial weights, overwrote its record, and then
wanted a checkpoint the store no longer had."""

from __future__ import annotations

import os
import threading
import time

import pytest

from mop_airflow.data.shard import shard_dataset
from mop_airflow.errors import TrainingError
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.planning.schedule import deal_classes
from mop_airflow.records import Assignment, HopRecord, SlotStatus
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.training.model_hop import Where, read_hashed, run_hop, state_after, train_hop
from mop_airflow.slots.commits import CommitLog
from mop_airflow.planning.placement import block_hops
from mop_airflow.slots.driver import SlotSuperseded, run_slot
from mop_airflow.slots.machine import SlotMachine
from mop_airflow.slots.messages import Check, End, ReadPeers, Record, Rules, Superseded, Train, Wait, Write
from mop_airflow.slots.messages import state_after as sp_state_after

from .toys import toy_spec

pytestmark = pytest.mark.integration

SHARDS, ITERATIONS = 3, 2


@pytest.mark.parametrize("try_number", [1, 2])
def test_a_retried_slot_skips_hops_whose_checkpoints_were_cleaned_up_since(toy_data, tmp_path, try_number):
    spec = toy_spec(tmp_path, *toy_data, shards=SHARDS, iterations=ITERATIONS)
    assert spec["store"].get("keep_checkpoints", 2) == 2  # hop t deletes hop t-2's checkpoint
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", SHARDS, run.schedule.seed)
    ids = [c["config_id"] for c in run.configs]
    classes = [[Assignment(cid, -1, None) for cid in members]
               for members in deal_classes(ids, shards=SHARDS, seed=run.schedule.seed)]
    hops = block_hops(classes, shards=SHARDS, slots=1, start=0, end=SHARDS * ITERATIONS)
    errors = []

    def slot(shard):
        try:
            run_slot(layout, run, manifest, hops, block="b0", shard=shard, slot=0, cache_dir=run.store.local_cache,
                     wait_seconds=120)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=slot, args=(s,)) for s in range(SHARDS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert errors == []
    before = {(h.config_id, h.hop): HopRecord.read(layout.store, layout.hop_record_uri(h.config_id, h.hop))
              for h in hops}
    mine = [h for h in hops if h.shard == 0]
    cleaned = [h for h in mine if not layout.store.exists(before[h.config_id, h.hop].checkpoint)]
    assert cleaned, "no checkpoint of shard 0's hops was cleaned up: the test proves nothing"

    # shard 0's slot runs again (a retry after its worker was lost, or the same try run again)
    again = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, cache_dir=run.store.local_cache,
                     wait_seconds=10, where=Where(task_id="train_shard_0", try_number=try_number))
    assert again.trained == [] and again.failed == [] and again.untrained == {}
    assert sorted(again.committed) == sorted(h.label for h in mine)
    for key, record in before.items():
        assert HopRecord.read(layout.store, layout.hop_record_uri(*key)) == record  # not one written again


# ---------------------------------------------------------------- two copies of one slot (Rules.fence)
def _setup(toy_data, tmp_path):
    spec = toy_spec(tmp_path, *toy_data, shards=SHARDS, iterations=ITERATIONS)
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", SHARDS, run.schedule.seed)
    ids = [c["config_id"] for c in run.configs]
    classes = [[Assignment(cid, -1, None) for cid in members]
               for members in deal_classes(ids, shards=SHARDS, seed=run.schedule.seed)]
    return run, layout, manifest, classes


def _hop_zero(run, layout, manifest, cid, shard, try_number, nudge=0.0):
    """Hop 0 of ``cid`` trained by try ``try_number`` of its slot, not committed yet; ``nudge`` moves its
    first weight as two GPUs' kernels may (their sums are not bit for bit the same)."""
    trained = train_hop(layout, run, manifest, Assignment(cid, -1, None), t=0, shard=shard,
                        cache_dir=run.store.local_cache, where=Where(task_id="train_shard", try_number=try_number))
    trained.state["model"][0] = trained.state["model"][0] + nudge
    return trained


def test_a_copy_taken_for_dead_that_commits_after_its_retry_overwrites_nothing(toy_data, tmp_path):
    run, layout, manifest, classes = _setup(toy_data, tmp_path)
    cid, shard = classes[1][0].config_id, 1  # offset class 1 starts on shard 1
    # try 1's host paused mid-commit; Airflow took it for dead and its retry (try 2) committed the hop
    zombie = _hop_zero(run, layout, manifest, cid, shard, 1, nudge=1e-3)
    retry = _hop_zero(run, layout, manifest, cid, shard, 2)
    committed = retry.commit()
    assert retry.won and committed.try_number == 2
    # ... then try 1 came back and committed the same hop: the retry's record and checkpoint stand
    standing = zombie.commit()
    assert not zombie.won and standing == committed
    assert HopRecord.read(layout.store, layout.hop_record_uri(cid, 0)) == committed
    assert read_hashed(layout.store, committed.checkpoint)[1] == committed.checkpoint_sha256
    folder = layout.store.local_path(layout.checkpoint_uri(cid, 0)).rsplit("/", 1)[0]
    assert sorted(os.listdir(folder)) == ["t000.npz"]  # the late copy's own checkpoint is removed
    # the next hop trains from what the record names (before the fence: _Corrupt, a healthy one failed)
    record, _ = run_hop(layout, run, manifest, state_after(committed), t=1, shard=(shard + 1) % SHARDS,
                        cache_dir=run.store.local_cache)
    assert record.status == "ok" and record.input_sha256 == committed.checkpoint_sha256

    # unfenced (the rule before), the late copy replaces both, and a hop that read the record fails
    late = _hop_zero(run, layout, manifest, cid, shard, 1, nudge=1e-3)
    late.commit(fence=False)
    assert HopRecord.read(layout.store, layout.hop_record_uri(cid, 0)).try_number == 1
    with pytest.raises(TrainingError, match="is corrupt"):
        run_hop(layout, run, manifest, state_after(committed), t=1, shard=(shard + 1) % SHARDS,
                cache_dir=run.store.local_cache)


def test_a_checkpoint_an_earlier_try_left_without_its_record_takes_a_name_of_its_own(toy_data, tmp_path):
    run, layout, manifest, classes = _setup(toy_data, tmp_path)
    cid = classes[0][0].config_id
    orphan = _hop_zero(run, layout, manifest, cid, 0, 1, nudge=1e-3)
    layout.store.write_bytes(layout.checkpoint_uri(cid, 0), b"try 1 died after its checkpoint, before its record")
    committed = orphan.commit()
    assert orphan.won and committed.checkpoint == layout.checkpoint_uri(cid, 0, committed.checkpoint_sha256)
    assert read_hashed(layout.store, committed.checkpoint)[1] == committed.checkpoint_sha256


def test_a_slot_that_lists_a_marker_of_a_later_try_of_itself_writes_nothing_more_and_says_nothing(toy_data,
                                                                                                 tmp_path):
    run, layout, manifest, classes = _setup(toy_data, tmp_path)
    hops = block_hops(classes, shards=SHARDS, slots=1, start=0, end=SHARDS * ITERATIONS)
    # try 1 of shard 1's slot trains the hops that need nobody, then waits for shard 0's (which never runs)
    outcome = []

    def slot():
        try:
            run_slot(layout, run, manifest, hops, block="b0", shard=1, slot=0, cache_dir=run.store.local_cache,
                     wait_seconds=300, yield_seconds=600, where=Where(task_id="train_shard_1", try_number=1))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome.append(exc)

    thread = threading.Thread(target=slot)
    thread.start()
    status_uri = layout.slot_status_uri("b0", 1, 0)
    deadline = time.time() + 240
    while time.time() < deadline and (not layout.store.exists(status_uri)
                                      or SlotStatus.read(layout.store, status_uri).trained < 1):
        time.sleep(0.1)
    # Airflow took try 1 for dead: try 2 runs, says so, and commits (its marker in the slot's own folder)
    later = SlotStatus(block="b0", shard=1, slot=0, state="running", heartbeat=time.time(), try_number=2)
    later.write(layout.store, status_uri)
    marked = time.time()
    CommitLog(layout, "b0", 1, 0, 2).mark(HopRecord(config_id=classes[1][0].config_id, t=0, iteration=0, hop=0,
                                                    shard=1))
    thread.join(timeout=60)
    assert not thread.is_alive() and len(outcome) == 1 and isinstance(outcome[0], SlotSuperseded), outcome
    assert "try 2 of shard 1 slot 0 runs since this try 1 began" in str(outcome[0])
    assert SlotStatus.read(layout.store, status_uri) == later  # no heartbeat, no last word over try 2's
    written = [HopRecord.read(layout.store, uri) for uri in layout.store.glob(layout.hops_glob)]
    assert written and all(r.saved_at is None or r.saved_at < marked for r in written)


def _grid(shards, hops, configs="ab"):
    from .test_slot_sim import _grid as grid

    return grid(shards, hops, configs)


def test_a_failure_that_finds_the_hop_committed_by_another_copy_takes_it_instead():
    hops = _grid(2, 2, "a")
    machine = SlotMachine(hops, shard=0, slot=0, try_number=2, began=0.0, wait=60.0)
    act = machine.decide(0.0)
    assert isinstance(act, Check)
    machine.checked({})
    act = machine.decide(0.0)
    assert isinstance(act, Train)
    (hop, state), = act.members
    # this copy's hop failed (out of memory on its host), but its earlier try, back, committed it first
    machine.trained_failed(hop, state, "failed", "out of memory")
    failure = machine.decide(0.0).records[0][0]
    standing = Record("a", 0, 0, "ok", None, "a0", try_number=1)
    machine.lost(failure, standing)
    assert machine.decide(0.0) == Write(((standing, "mark"),))  # marked for the slot waiting for it
    assert "a" not in machine.failed and machine.states["a"][0] == sp_state_after(standing)
    # its commit, likewise: a copy's record there stands. Nothing left to train: it ends, once it has read
    # whether the slot holding a's last hop has started (no slot waits for that hop)
    assert isinstance(machine.decide(0.0), (End, Wait, ReadPeers))


def test_a_try_that_lists_a_later_try_of_its_slot_writes_nothing_more_unless_unfenced():
    hops = _grid(2, 2, "ab")
    first, second = [h for h in hops if h.start is not None]
    for fence in (True, False):
        machine = SlotMachine(hops, shard=0, slot=0, try_number=1, began=0.0, wait=60.0, rules=Rules(fence=fence))
        machine.trained_failed(first, first.start, "failed", "boom")  # a write waiting
        machine.later_try(2)
        flushed = machine.flush()  # a graceful stop's writes
        assert (flushed is None) == fence
        machine.trained_failed(second, second.start, "failed", "boom")
        act = machine.decide(0.0)
        assert isinstance(act, Superseded) if fence else isinstance(act, Write)


@pytest.mark.parametrize("seed,written", [(85, "the same ok record"), (96, "the same ok record"),
                                          (141, "another failed record")])
def test_the_simulation_finds_copies_writing_over_each_other_without_the_fence_and_nothing_with_it(seed, written):
    """Schedules of the slot simulation with a try taken for dead that comes back (and, in 141, a commit
    whose marker is refused after its record landed, so the slot records the hop failed over it)."""
    from slot_sim import check
    from slot_sim.world import World

    def run_one(seed, rules=Rules()):  # in the world these were found in: without the peer faults drawn since
        world = World(seed, rules, peers=False).run()
        world.problems = check(world)
        return world

    unfenced = run_one(seed, Rules(fence=False, retry_looks=False))  # (and before a retry looked its inputs up)
    assert any("was written again" in p and written in p for p in unfenced.problems), unfenced.problems
    fenced = run_one(seed)
    assert "zombie" in [kind for *_, kind in fenced.s.faults]
    assert fenced.problems == [] and fenced.outcome == "succeeded"
