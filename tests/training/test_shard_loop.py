"""A block's hops on shard slots that stay warm: the same checkpoints, bit for bit, as a task per
hop, whichever process trains a hop and when; failures stay with their configuration; a retried slot
trains only what is not committed; a slot waiting for a slot that is gone stops, naming it."""

from __future__ import annotations

import os
import threading
import time

import pytest

from mop_airflow.data.shard import shard_dataset
from mop_airflow.errors import BlockIncompleteError
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.planning.schedule import deal_classes, shard_at
from mop_airflow.records import Assignment, HopRecord, SlotStatus
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.training.model_hop import run_hop
from mop_airflow.planning.placement import block_hops
from mop_airflow.slots.driver import SlotYielded, run_slot

from .slot_processes import slot_context
from .toys import TOY_MODEL, toy_spec

SHARDS = 2
ITERATIONS = 2
HOPS = SHARDS * ITERATIONS


def _setup(folder, toy_data, name, models=(TOY_MODEL,)):
    spec = toy_spec(folder, *toy_data, store=name, cache=f"{name}-cache", models=models, batch_sizes=(8, 16),
                    shards=SHARDS, iterations=ITERATIONS)
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", SHARDS, run.schedule.seed)
    return run, layout, manifest


def _classes(run):
    ids = [c["config_id"] for c in run.configs]
    return [[Assignment(cid, -1, None) for cid in members]
            for members in deal_classes(ids, shards=SHARDS, seed=run.schedule.seed)]


def _hops(run, slots=1):
    return block_hops(_classes(run), shards=SHARDS, slots=slots, start=0, end=HOPS)


def _task_per_hop(run, layout, manifest):
    """The reference: every hop of every configuration in order, each with nothing shared."""
    out = {}
    for o, members in enumerate(deal_classes([c["config_id"] for c in run.configs], shards=SHARDS,
                                             seed=run.schedule.seed)):
        for cid in members:
            assignment = Assignment(cid, -1, None)
            for t in range(HOPS):
                record, assignment = run_hop(layout, run, manifest, assignment, t=t, shard=shard_at(o, t, SHARDS),
                                             cache_dir=run.store.local_cache)
                out[cid, t] = record.checkpoint_sha256
    return out


def _shas(run, layout):
    return {(c["config_id"], t): HopRecord.read(layout.store, layout.hop_record_uri(c["config_id"], t)).checkpoint_sha256
            for c in run.configs for t in range(HOPS)}


def _slot_process(folder, toy_data, name, shard, slot, slots, die_after, wait):
    """One shard slot's task, in a process of its own (forked as a worker forks its tasks: :mod:`.slot_processes`)."""
    os.environ["MOP_SHARD_WAIT_SECONDS"] = str(wait)
    run, layout, manifest = _setup(folder, toy_data, name)
    done = []

    def after(record):
        done.append(record)
        if die_after is not None and len(done) >= die_after:
            os._exit(9)  # a worker lost mid-block: no status written, no cleanup

    run_slot(layout, run, manifest, _hops(run, slots), block="b0", shard=shard, slot=slot,
             cache_dir=run.store.local_cache, on_hop=after)


def _slots_in_processes(folder, toy_data, name, *, slots=1, die=None, wait=120, context=None):
    """Each shard slot's task in a process of its own, started from ``context`` (:func:`.slot_context`'s unless
    given); their exit codes."""
    context = context or slot_context()
    procs = [context.Process(target=_slot_process, args=(folder, toy_data, name, s, k, slots,
                                                          die[1] if die and die[0] == (s, k) else None, wait))
             for s in range(SHARDS) for k in range(slots)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    return {(s, k): proc.exitcode for (s, k), proc in zip([(s, k) for s in range(SHARDS) for k in range(slots)],
                                                             procs)}


def test_block_hops_follow_the_rotation_and_deal_slots(toy_data, tmp_path):
    run, _, _ = _setup(tmp_path, toy_data, "store")
    hops = _hops(run, slots=2)
    assert len(hops) == len(run.configs) * HOPS
    for hop in hops:
        assert hop.shard == (hop.offset + hop.step) % SHARDS and hop.hop == hop.step
        assert (hop.start is not None) == (hop.step == 0)
    slots = {h.config_id: h.slot for h in hops}
    assert sorted(slots.values()) == [0, 0, 1, 1]  # configuration i of the block on slot i mod 2, on every shard
    assert all(h.slot == slots[h.config_id] for h in hops)
    relative = block_hops([[Assignment("c", 6, "x")]], shards=2, slots=1, start=0,
                          end=2, relative=True, rung_end=True)
    assert [(h.step, h.hop, h.shard, h.rung_end) for h in relative] == [(0, 7, 0, False), (1, 8, 1, True)]


@pytest.mark.integration
@pytest.mark.slow
def test_slots_in_processes_of_their_own_train_what_a_task_per_hop_trains(toy_data, tmp_path):
    run, layout, manifest = _setup(tmp_path, toy_data, "reference")
    reference = _task_per_hop(run, layout, manifest)
    run_w, layout_w, _ = _setup(tmp_path, toy_data, "warm")
    assert _slots_in_processes(tmp_path, toy_data, "warm", slots=2) == {(s, k): 0 for s in range(SHARDS)
                                                                          for k in range(2)}
    assert _shas(run_w, layout_w) == reference
    records = [HopRecord.read(layout_w.store, layout_w.hop_record_uri(c["config_id"], t))
               for c in run_w.configs for t in range(HOPS)]
    # one process per shard slot trained all of that slot's hops; each slot's hops never overlap in time
    by_process = {}
    for record in records:
        by_process.setdefault(record.pid, []).append(record)
    assert len(by_process) == SHARDS * 2
    for hops in by_process.values():
        assert len({r.shard for r in hops}) == 1
        spans = sorted((r.started_at, r.train_end) for r in hops)
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    for s in range(SHARDS):
        for k in range(2):
            status = SlotStatus.read(layout_w.store, layout_w.slot_status_uri("b0", s, k))
            assert (status.state, status.trained, status.left) == ("done", 4, 0)


def test_one_process_trains_a_whole_block_alone(toy_data, tmp_path):
    """When tasks run one at a time (dag.test), one task trains every shard's hops in an order that
    never waits: the same checkpoints, the compiled model reused across configurations."""
    run, layout, manifest = _setup(tmp_path, toy_data, "reference")
    reference = _task_per_hop(run, layout, manifest)
    run_w, layout_w, manifest_w = _setup(tmp_path, toy_data, "alone")
    hops = _hops(run_w)
    result = run_slot(layout_w, run_w, manifest_w, hops, block="b0", shard=0, slot=0, mine=hops,
                      cache_dir=run_w.store.local_cache)
    assert len(result.trained) == len(hops) and not result.failed and not result.untrained
    assert _shas(run_w, layout_w) == reference
    assert sum(r.model_reused for r in result.trained) == len(hops) - 1  # one model key: built once
    # a retry finds everything committed and trains nothing again
    again = run_slot(layout_w, run_w, manifest_w, hops, block="b0", shard=0, slot=0, mine=hops,
                     cache_dir=run_w.store.local_cache)
    assert not again.trained and len(again.committed) == len(hops)


def test_a_slow_store_holds_at_most_two_trained_hops_behind_the_writer(toy_data, tmp_path, monkeypatch):
    """Each trained hop holds its taken state until the writer packs and commits it: with a store
    slower than training, the slot waits rather than piling states up, and commits the same bytes."""
    from mop_airflow.training import model_hop

    run, layout, manifest = _setup(tmp_path, toy_data, "slow-writer")
    hops = _hops(run)
    waiting, most, lock = [0], [0], threading.Lock()
    train_hop, commit = model_hop.train_hop, model_hop.TrainedHop.commit

    def counted_train_hop(*args, **kwargs):
        trained = train_hop(*args, **kwargs)
        with lock:
            waiting[0] += 1
            most[0] = max(most[0], waiting[0])
        return trained

    def slow_commit(self, fence=True):
        time.sleep(0.5)  # longer than a toy hop trains
        record = commit(self, fence)
        with lock:
            waiting[0] -= 1
        return record

    monkeypatch.setattr("mop_airflow.slots.train_actions.train_hop", counted_train_hop)
    monkeypatch.setattr(model_hop.TrainedHop, "commit", slow_commit)
    result = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops,
                      cache_dir=run.store.local_cache)
    assert len(result.trained) == len(hops) and not result.failed
    assert most[0] == 2  # the writer busy with one, one queued behind it; never a third
    monkeypatch.undo()
    reference_run, reference_layout, reference_manifest = _setup(tmp_path, toy_data, "reference")
    assert _shas(run, layout) == _task_per_hop(reference_run, reference_layout, reference_manifest)


def test_a_failing_configuration_is_recorded_and_the_others_go_on(toy_data, tmp_path):
    run, layout, manifest = _setup(tmp_path, toy_data, "store", models=(TOY_MODEL, "tests.training.toys:raises"))
    hops = block_hops(_classes(run), shards=SHARDS, slots=1, start=0, end=HOPS)
    result = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops,
                      cache_dir=run.store.local_cache)
    failing = {c["config_id"] for c in run.configs if c["model"].endswith(":raises")}
    assert {r.config_id for r in result.failed} == failing and len(failing) == 4
    assert len(result.dropped) == len(failing) * (HOPS - 1)  # every later hop of theirs, on either shard
    assert len(result.trained) == (len(run.configs) - len(failing)) * HOPS
    for cid in failing:
        failure = HopRecord.read(layout.store, layout.hop_record_uri(cid, 0))
        assert failure.status == "failed"
        # its next hop is settled where it was due (the slot waiting for it learns of the failure); no later one
        settled = HopRecord.read(layout.store, layout.hop_record_uri(cid, 1))
        assert (settled.status, settled.dropped_after, settled.error) == ("failed", 0, failure.error)
        assert not any(layout.store.exists(layout.hop_record_uri(cid, t)) for t in range(2, HOPS))


def test_fail_fast_errors_end_the_slot_and_say_so_for_good(toy_data, tmp_path):
    run, layout, manifest = _setup(tmp_path, toy_data, "store", models=("tests.training.toys:raises",))
    hops = _hops(run)
    with pytest.raises(Exception, match="builder"):
        run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, cache_dir=run.store.local_cache,
                 fatal=lambda exc: True, final=lambda exc: True)
    status = SlotStatus.read(layout.store, layout.slot_status_uri("b0", 0, 0))
    assert status.state == "failed" and status.final and "builder" in status.error


def test_a_slot_gives_up_the_hops_of_a_slot_that_failed_for_good_and_names_it(toy_data, tmp_path):
    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    hops = _hops(run)
    # shard 1's slot failed for good while shard 0's slot runs
    SlotStatus(block="b0", shard=1, slot=0, state="failed", heartbeat=time.time() + 2, try_number=3, final=True,
               error="MemoryError: out of memory").write(layout.store, layout.slot_status_uri("b0", 1, 0))
    started = time.monotonic()
    with pytest.raises(BlockIncompleteError) as caught:
        run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, cache_dir=run.store.local_cache,
                 wait_seconds=30)
    assert time.monotonic() - started < 30  # at once, not after the bound
    error = caught.value
    mine = [h for h in hops if h.shard == 0]
    firsts = [h for h in mine if h.step == 0]  # class 0 starts on shard 0: those hops need nobody
    assert len(error.untrained) == len(mine) - len(firsts)
    assert all("shard 1 slot 0 failed for good on its try 3 (MemoryError: out of memory)" in why
               for why in error.untrained.values())
    assert "clear the failed shard tasks" in str(error)
    for hop in firsts:
        assert HopRecord.read(layout.store, layout.hop_record_uri(hop.config_id, 0)).status == "ok"
    status = SlotStatus.read(layout.store, layout.slot_status_uri("b0", 0, 0))
    assert status.state == "failed" and status.final and status.trained == len(firsts)


def test_a_slot_waits_for_a_silent_slot_only_within_its_bound(toy_data, tmp_path):
    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    hops = _hops(run)
    # shard 1 started and then fell silent (one that never started is named so: test_slot_faults.py)
    SlotStatus(block="b0", shard=1, slot=0, state="running", heartbeat=time.time(), try_number=1).write(
        layout.store, layout.slot_status_uri("b0", 1, 0))
    started = time.monotonic()
    with pytest.raises(BlockIncompleteError, match=r"shard 1 slot 0 made no progress for \d+ s"):
        run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, cache_dir=run.store.local_cache,
                 wait_seconds=2)
    assert time.monotonic() - started < 60


@pytest.mark.integration
@pytest.mark.slow
def test_a_slot_killed_mid_block_is_retried_and_trains_only_the_rest(toy_data, tmp_path):
    run, layout, manifest = _setup(tmp_path, toy_data, "reference")
    reference = _task_per_hop(run, layout, manifest)
    run_w, layout_w, manifest_w = _setup(tmp_path, toy_data, "killed")
    # shard 1's process dies after committing 3 hops; shard 0's waits for it
    exits = _slots_in_processes(tmp_path, toy_data, "killed", die=((1, 0), 3), wait=20)
    assert exits[1, 0] == 9 and exits[0, 0] == 1  # shard 0 gave up waiting, after its bound (20 s here)
    committed_at = {(c["config_id"], t): HopRecord.read(layout_w.store, layout_w.hop_record_uri(c["config_id"], t))
                    for c in run_w.configs for t in range(HOPS)
                    if layout_w.store.exists(layout_w.hop_record_uri(c["config_id"], t))}
    assert len(committed_at) < len(reference)
    # Airflow retries both: they skip what is committed and train the rest, to the same bits
    exits = _slots_in_processes(tmp_path, toy_data, "killed")
    assert exits == {(0, 0): 0, (1, 0): 0}
    assert _shas(run_w, layout_w) == reference
    for key, record in committed_at.items():  # not written again
        assert HopRecord.read(layout_w.store, layout_w.hop_record_uri(*key)).saved_at == record.saved_at


def test_a_waiting_slot_gives_its_pool_slot_back_while_a_slot_before_it_has_not_started(
        toy_data, tmp_path):
    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    hops = _hops(run)
    # shard 1's slot waits for shard 0's (class 1 starts on shard 1; its next hops come from shard 0)
    with pytest.raises(SlotYielded, match="shard 0 slot 0 of this block has not started within 1 s"):
        run_slot(layout, run, manifest, hops, block="b0", shard=1, slot=0, cache_dir=run.store.local_cache,
                 yield_seconds=1, wait_seconds=60)
    status = SlotStatus.read(layout.store, layout.slot_status_uri("b0", 1, 0))
    assert status.state == "yielded" and not status.final
    # it trained its hops that needed nobody first; now committed, its next try finds them
    assert status.trained == 2
    # the first slot of a block never gives its slot back: it waits (here until its bound)
    with pytest.raises(BlockIncompleteError):
        run_slot(layout, run, manifest, hops, block="b1", shard=0, slot=0, cache_dir=run.store.local_cache,
                 yield_seconds=1, wait_seconds=3)


def test_a_slot_asked_to_stop_ends_after_its_hop_in_progress_and_a_retry_trains_the_rest(toy_data, tmp_path):
    """Airflow stops a task gracefully with SIGTERM, which calls the operator's on_kill: the slot ends
    after the hop it trains and that hop's commit, and its retry trains only what is left."""
    import threading

    from mop_airflow.slots.driver import SlotStopped

    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    hops = _hops(run)
    stop = threading.Event()
    with pytest.raises(SlotStopped, match="asked to stop with \\d+ hop\\(s\\) left"):
        run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops,
                 cache_dir=run.store.local_cache, on_hop=lambda record: stop.set(), stop=stop)
    status = SlotStatus.read(layout.store, layout.slot_status_uri("b0", 0, 0))
    assert status.state == "failed" and not status.final  # a retry follows
    done = [h for h in hops if layout.store.exists(layout.hop_record_uri(h.config_id, h.hop))]
    assert 1 <= len(done) < len(hops)
    again = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops,
                     cache_dir=run.store.local_cache)
    assert len(again.committed) == len(done) and len(again.trained) == len(hops) - len(done)
