"""A shard slot's faults cost seconds: the yield rule, final statuses that stay final, late peers
retried rather than failed for good, a failed commit that fails only its configuration, and a
watchdog that kills a process whose progress stopped."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from mop_airflow.errors import BlockIncompleteError
from mop_airflow.records import HopRecord, SlotStatus
from mop_airflow.slots import status as slot_status
from mop_airflow.training.model_hop import Where
from mop_airflow.slots.driver import run_slot
from mop_airflow.slots.machine import PeerView
from mop_airflow.slots.status import HEARTBEAT_SECONDS, StatusWriter, read_status
from mop_airflow.slots.watchdog import Watchdog, stall_seconds

from .test_shard_loop import _hops, _setup


def _status(layout, shard, slot, state, *, ago=0.0, try_number=1, final=False, progress=0, last_try=False):
    SlotStatus(block="b0", shard=shard, slot=slot, state=state, heartbeat=time.time() - ago, try_number=try_number,
               final=final, progress=progress, last_try=last_try).write(layout.store,
                                                                         layout.slot_status_uri("b0", shard, slot))


def test_a_retried_slot_whose_earlier_peers_ended_keeps_its_pool_slot(toy_data, tmp_path):
    """Slot 1 of shard 1, retried after shard 0 slot 0 and shard 1 slot 0 finished their block: they
    ended before this try began, which is not 'not started'. It waits for shard 0 slot 1 (running, then
    silent), and is retried for it, instead of giving its pool slot back every 30 s."""
    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    hops = _hops(run, slots=2)
    _status(layout, 0, 0, "done", ago=600)
    _status(layout, 1, 0, "done", ago=600)
    _status(layout, 0, 1, "running")
    with pytest.raises(BlockIncompleteError) as caught:
        run_slot(layout, run, manifest, hops, block="b0", shard=1, slot=1, cache_dir=run.store.local_cache,
                 yield_seconds=0.5, wait_seconds=3, final=lambda exc: not exc.retryable)  # as the operator says
    assert caught.value.retryable and caught.value.for_good == set()
    assert all("shard 0 slot 1 made no progress for" in why for why in caught.value.untrained.values())
    status = SlotStatus.read(layout.store, layout.slot_status_uri("b0", 1, 1))
    assert status.state == "failed" and not status.final  # a retry follows: its peers keep waiting


def test_a_slot_that_took_a_hop_from_another_slot_never_gives_its_pool_slot_back(toy_data, tmp_path):
    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    hops = _hops(run)
    # shard 0 trains the hops it can, then gives up waiting for shard 1 (retryable: shard 1 never came)
    with pytest.raises(BlockIncompleteError) as first:
        run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, cache_dir=run.store.local_cache,
                 wait_seconds=1)
    assert first.value.retryable
    layout.store.delete_tree(layout.slot_status_uri("b0", 0, 0))  # as if shard 0 never ran in this block
    # shard 1 takes class 0's second hops from shard 0's commits: its block runs, it waits and never yields
    with pytest.raises(BlockIncompleteError) as second:
        run_slot(layout, run, manifest, hops, block="b0", shard=1, slot=0, cache_dir=run.store.local_cache,
                 yield_seconds=0.2, wait_seconds=2)
    assert second.value.retryable
    status = SlotStatus.read(layout.store, layout.slot_status_uri("b0", 1, 0))
    assert status.state == "failed" and status.trained == 4  # class 1's first hops and class 0's second


def test_a_peer_that_failed_for_good_fails_the_block_for_good(toy_data, tmp_path):
    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    _status(layout, 1, 0, "failed", final=True, ago=-2)
    with pytest.raises(BlockIncompleteError) as caught:
        run_slot(layout, run, manifest, _hops(run), block="b0", shard=0, slot=0, cache_dir=run.store.local_cache,
                 wait_seconds=30)
    assert not caught.value.retryable and caught.value.for_good == set(caught.value.untrained)
    assert SlotStatus.read(layout.store, layout.slot_status_uri("b0", 0, 0)).final


class _SlowStore:
    """A store whose "running" writes take ``delay`` seconds (an S3 write retrying)."""

    def __init__(self, store, delay):
        self.store, self.delay, self.writes = store, delay, []

    def __getattr__(self, name):
        return getattr(self.store, name)

    def write_json(self, uri, obj):
        if obj["state"] == "running":
            time.sleep(self.delay)
        self.writes.append(obj["state"])
        return self.store.write_json(uri, obj)


def test_a_heartbeat_in_flight_never_lands_after_the_final_status(toy_data, tmp_path, monkeypatch):
    import dataclasses

    run, layout, _ = _setup(tmp_path, toy_data, "store")
    monkeypatch.setattr(slot_status, "HEARTBEAT_SECONDS", 0.05)
    slow = dataclasses.replace(layout, store=_SlowStore(layout.store, 0.5))
    writer = StatusWriter(slow, "b0", 0, 0, Where(try_number=2), left=3)
    writer.start()
    time.sleep(0.2)  # a heartbeat is being written now
    writer.stop("failed", final=True, error="boom")
    time.sleep(0.8)  # long after any heartbeat could have landed
    status = SlotStatus.read(layout.store, layout.slot_status_uri("b0", 0, 0))
    assert (status.state, status.final, status.error, status.try_number) == ("failed", True, "boom", 2)
    assert slow.store.writes == ["running", "running", "failed"]  # the one in flight landed first; none after


class Peer(PeerView):
    """Another slot of the block as the machine judges it (:class:`PeerView`), fed with its status file
    at most once per heartbeat, as the shard loop feeds it when its machine asks."""

    def __init__(self, layout: RunLayout, block: str, shard: int, slot: int, *, began: float, since: float) -> None:
        super().__init__(began, since, name=f"shard {shard} slot {slot}")
        self.layout, self.block, self.shard, self.slot = layout, block, shard, slot

    def started(self, now: float, wait: float) -> bool:
        if not self.seen:
            self._refresh(now, HEARTBEAT_SECONDS)
        return super().started(now, wait)

    def gone(self, now: float, wait: float) -> tuple[str, bool] | None:
        self._refresh(now, min(HEARTBEAT_SECONDS, wait / 2))
        return super().gone(now, wait)

    def _refresh(self, now: float, every: float) -> None:
        if now - self.read_at < every:
            return
        self.read_at = now
        self.read(read_status(self.layout, self.block, self.shard, self.slot), now)


def test_a_peer_reads_progress_not_heartbeats_and_ignores_an_older_try(toy_data, tmp_path):
    run, layout, _ = _setup(tmp_path, toy_data, "store")
    now = time.time()
    peer = Peer(layout, "b0", 1, 0, began=now, since=now - 100)
    _status(layout, 1, 0, "running", try_number=2, progress=7)
    assert peer.gone(now, 50) is None  # first read: alive now
    _status(layout, 1, 0, "running", try_number=2, progress=7)  # a fresh heartbeat, no progress
    assert peer.gone(now + 60, 50)[0].startswith("shard 1 slot 0 made no progress for 60 s")
    _status(layout, 1, 0, "failed", try_number=1, final=True)  # try 1's late word: ignored
    assert peer.gone(now + 70, 50)[1] is False
    _status(layout, 1, 0, "running", try_number=2, progress=8)
    assert peer.gone(now + 80, 50) is None


def test_a_peer_silent_on_its_last_try_ended_for_good_and_is_not_yielded_to(toy_data, tmp_path):
    """A try killed (by its watchdog, with its worker) says no last word: "running" stays, its heartbeat
    stops. On its last try no retry writes again, so silence past the wait bound is the end (seed 544 of
    the slot simulation: a slot yielded for ever to such a peer); on an earlier try it may come back."""
    run, layout, _ = _setup(tmp_path, toy_data, "store")
    now = time.time()
    _status(layout, 1, 0, "running", try_number=2, progress=7, last_try=True, ago=700)
    peer = Peer(layout, "b0", 1, 0, began=now, since=now)
    why, for_good = peer.gone(now, 600)
    assert for_good and why.startswith("shard 1 slot 0 died on its last try 2: its heartbeat stopped 700 s ago")
    assert Peer(layout, "b0", 1, 0, began=now, since=now).started(now, 600)  # ended: no pool slot given back for it
    _status(layout, 1, 0, "running", try_number=2, progress=7, last_try=True, ago=500)  # within the bound
    fresh = Peer(layout, "b0", 1, 0, began=now, since=now)
    assert fresh.gone(now, 600) is None and not fresh.started(now, 600)
    _status(layout, 1, 0, "running", try_number=1, progress=7, ago=700)  # a retry follows: not for good
    late = Peer(layout, "b0", 1, 0, began=now, since=now)
    assert late.gone(now, 600) is None  # first read: its word is news, so it counts as alive now
    assert late.gone(now + 601, 600)[1] is False and not late.started(now + 601, 600)


def test_a_failed_commit_fails_its_configuration_only(toy_data, tmp_path, monkeypatch):
    from mop_airflow.training import model_hop

    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    hops = _hops(run)
    victim = hops[0].config_id
    commit = model_hop.TrainedHop.commit

    def failing_commit(self, **kwargs):
        if self.assignment.config_id == victim:
            raise ValueError("cannot pack this state")
        return commit(self, **kwargs)

    monkeypatch.setattr(model_hop.TrainedHop, "commit", failing_commit)
    result = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops,
                      cache_dir=run.store.local_cache)
    assert [r.config_id for r in result.failed] == [victim]
    record = HopRecord.read(layout.store, layout.hop_record_uri(victim, 0))
    assert record.status == "failed" and "ValueError: cannot pack this state" in record.error
    assert len(result.trained) == len(hops) - 4 and len(result.dropped) == 3
    # a fatal one (the store gone) ends the slot, saying whether a retry follows
    monkeypatch.setattr(model_hop.TrainedHop, "commit", lambda self, **kwargs: (_ for _ in ()).throw(OSError("gone")))
    run2, layout2, manifest2 = _setup(tmp_path, toy_data, "store2")
    with pytest.raises(OSError, match="gone"):
        run_slot(layout2, run2, manifest2, _hops(run2), block="b0", shard=0, slot=0, mine=_hops(run2),
                 cache_dir=run2.store.local_cache, fatal=lambda exc: True, final=lambda exc: False)
    status = SlotStatus.read(layout2.store, layout2.slot_status_uri("b0", 0, 0))
    assert status.state == "failed" and not status.final and "OSError: gone" in status.error


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_the_watchdog_kills_a_process_whose_progress_stopped_and_spares_one_that_moves():
    stuck, moving = _sleeper(), _sleeper()
    counter = [0]

    def moves():
        counter[0] += 1
        return counter[0]

    dogs = [Watchdog(1.5, count=lambda: 5, target=stuck.pid), Watchdog(1.5, count=moves, target=moving.pid)]
    try:
        assert stuck.wait(timeout=10) == -9
        assert moving.poll() is None
    finally:
        for dog in dogs:
            dog.stop()
        moving.kill()
    assert all(dog.process.poll() is not None for dog in dogs)  # they end with the pipe


def test_the_stall_bound_is_read_from_the_environment():
    assert stall_seconds({}) == 300.0 and stall_seconds({"MOP_SHARD_STALL_SECONDS": "0"}) == 0.0
    with pytest.raises(ValueError, match=r"MOP_SHARD_STALL_SECONDS='soon': must be a number of seconds >= 0"):
        stall_seconds({"MOP_SHARD_STALL_SECONDS": "soon"})


def test_slots_of_three_shards_learn_their_hops_from_the_previous_shards_markers(toy_data, tmp_path):
    """With three shards a slot lists only the previous shard's markers: the hop two shards back is
    another slot's it never lists, and the block must not wait for it."""
    from mop_airflow.data.shard import shard_dataset
    from mop_airflow.planning.resolve import resolve_run
    from mop_airflow.planning.schedule import deal_classes
    from mop_airflow.records import Assignment
    from mop_airflow.records.layout import RunLayout
    from mop_airflow.store import Store
    from mop_airflow.planning.placement import block_hops

    from .toys import toy_spec

    run = resolve_run(toy_spec(tmp_path, *toy_data, shards=3, iterations=2), None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", 3, run.schedule.seed)
    ids = [c["config_id"] for c in run.configs]
    classes = [[Assignment(cid, -1, None) for cid in members]
               for members in deal_classes(ids, shards=3, seed=run.schedule.seed)]
    hops = block_hops(classes, shards=3, slots=1, start=0, end=6)
    results, errors = {}, []

    def slot(shard):
        try:
            results[shard] = run_slot(layout, run, manifest, hops, block="b0", shard=shard, slot=0,
                                      cache_dir=run.store.local_cache, wait_seconds=60)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=slot, args=(s,)) for s in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert errors == [] and sum(len(r.trained) for r in results.values()) == len(hops)
    assert all(SlotStatus.read(layout.store, layout.slot_status_uri("b0", s, 0)).state == "done" for s in range(3))


# ------------------------------------------------------------------ issue 70: peers missing, silent or ended
def test_a_final_failure_said_before_the_reader_began_ends_it_for_good_after_the_wait_bound(toy_data, tmp_path):
    """A slot failed for good on its last try (a store outage) before this slot's task began: the end
    may be an earlier run's (cleared since), so it is not taken at once, but once it has stood for the
    wait bound with no later try it is final: ASHA then fails the legs on it instead of waiting for ever."""
    run, layout, _ = _setup(tmp_path, toy_data, "store")
    now = time.time()
    _status(layout, 1, 0, "failed", try_number=3, final=True, ago=30)
    peer = Peer(layout, "b0", 1, 0, began=now, since=now)
    assert peer.gone(now, 60) is None  # said before this slot began: a cleared run's retry may still come
    why, for_good = peer.gone(now + 61, 60)
    assert for_good and why.startswith("shard 1 slot 0 failed for good on its try 3 before this slot's task began, "
                                       "and no later try of it has started in 60 s")
    old = PeerView(now, now, stale_ends=False, name="shard 1 slot 0")  # the rule before: never for good
    old.read(read_status(layout, "b0", 1, 0), now)
    assert old.gone(now + 61, 60)[1] is False
    # a later try that starts meanwhile is what the reader judges instead
    _status(layout, 1, 0, "running", try_number=4, progress=1)
    again = Peer(layout, "b0", 1, 0, began=now, since=now)
    again.read_at = -1e18
    assert again.gone(now + 1, 60) is None and again.started(now + 1, 60)


def test_clock_skew_within_the_allowance_is_harmless_and_past_it_costs_at_most_the_wait_bound(toy_data, tmp_path):
    """A peer's host clock behind the reader's by up to CLOCK_SKEW: its final word, said after the reader
    began, still counts at once. Further behind, it counts after the wait bound (never never)."""
    from mop_airflow.slots.messages import CLOCK_SKEW, PeerStatus

    now = time.time()
    within = PeerView(now, now, name="shard 2 slot 0")
    within.read(PeerStatus(1, "failed", now + 0.1 - CLOCK_SKEW, final=True, error="StoreError: gone"), now + 0.2)
    assert within.gone(now + 0.2, 60) == ("shard 2 slot 0 failed for good on its try 1 (StoreError: gone)", True)
    past = PeerView(now, now, name="shard 2 slot 0")
    past.read(PeerStatus(1, "failed", now - 5 * CLOCK_SKEW, final=True, error="StoreError: gone"), now + 0.2)
    assert past.gone(now + 0.2, 60) is None and past.gone(now + 60.3, 60)[1] is True


def test_a_peer_that_never_started_is_named_with_its_pool_and_queue():
    now = 1000.0
    peer = PeerView(now, now, name="shard 2 slot 0", shard=2)
    peer.read(None, now)  # no status file: its task never ran
    assert peer.gone(now + 10, 20) is None and not peer.absent(now + 10, 20)
    why, for_good = peer.gone(now + 21, 20)
    assert not for_good and peer.absent(now + 21, 20)
    assert why == ("shard 2 slot 0 has not started: it wrote no status in 21 s (the bound is 20 s, "
                   "MOP_SHARD_WAIT_SECONDS); its task waits in Airflow: no worker may serve its queue mop_shard_2, "
                   "or its pool mop_shard_2 may have no free slot (another DAG holds them, or it has too few)")


def _asha_machine(rules=None, **kw):
    from mop_airflow.slots import machine as sp

    return sp.SlotMachine([], shard=0, slot=0, try_number=1, began=0.0, wait=20.0, give_back=30.0, asha=True,
                          shards=3, slots=1, rules=rules or sp.Rules(look_after=60.0), **kw)


def _drive(machine, now, statuses):
    """Answer the machine's reads at ``now`` (statuses: owner -> PeerStatus or None) until it waits or ends."""
    from mop_airflow.slots import machine as sp

    for _ in range(50):
        act = machine.decide(now)
        if isinstance(act, sp.ReadPeers):
            for owner in act.owners:
                machine.peer_status(owner, statuses.get(owner), now)
        elif not isinstance(act, sp.Decide):  # no decisions in these tests: nothing to add
            return act
    raise AssertionError("the machine never settled")


def test_asha_ends_its_try_when_a_slot_of_the_block_never_starts_and_names_it():
    """ASHA's legs cross every shard: a slot that never starts stalls the search even where no hop waits
    for it yet. Past the wait bound of every try it has left (``absent_wait``: one here) the try fails
    for good naming it, which ends the absent slot's task too; before issue 70 the slots waited for ever.
    A slot late but started within that bound is waited for (its hops taken back as before)."""
    from mop_airflow.slots import machine as sp

    running = sp.PeerStatus(1, "running", 1.0, progress=1)
    statuses = {(1, 0): running, (2, 0): None}
    machine = _asha_machine()
    assert isinstance(_drive(machine, 1.0, statuses), sp.Wait)
    act = _drive(machine, 10.0, statuses)
    assert isinstance(act, sp.Wait) and act.until <= 21.0 + 1e-3  # wakes at the bound
    end = _drive(machine, 21.5, statuses)
    assert isinstance(end, sp.End) and not end.done and end.absent == frozenset({(2, 0)})
    assert end.for_good == frozenset(end.untrained)  # for good: the absent slot's task is ended with it
    (why,) = end.untrained.values()
    assert why.startswith("shard 2 slot 0 has not started") and "queue mop_shard_2" in why
    patient = _asha_machine(absent_wait=60.0)  # three tries' wait bounds: the slot starts at 45 s
    _drive(patient, 1.0, statuses)
    assert isinstance(_drive(patient, 30.0, statuses), sp.Wait)
    assert isinstance(_drive(patient, 45.0, {**statuses, (2, 0): sp.PeerStatus(1, "running", 45.0, progress=1)}),
                      sp.Wait)
    assert isinstance(_drive(patient, 70.0, {**statuses, (2, 0): sp.PeerStatus(1, "running", 70.0, progress=9)}),
                      sp.Wait)
    old = _asha_machine(sp.Rules(look_after=60.0, absent_peers=False))
    _drive(old, 1.0, statuses)
    assert isinstance(_drive(old, 500.0, statuses), sp.Wait)  # the rule before: waits on


def test_a_record_listed_but_not_readable_yet_is_read_again_not_fatal():
    """A store whose readers disagree for a while: the marker is listed, the record answers 404 to this
    reader. The hop waits and its record is read again a second later (a StoreError failed the try)."""
    from mop_airflow.slots import machine as sp

    from .test_slot_sim import Hop

    hops = [Hop("a", 0, 0, start=sp.State("a", -1, None)), Hop("a", 1, 1)]
    machine = sp.SlotMachine(hops, shard=1, slot=0, try_number=1, began=0.0, wait=60.0)
    machine.decide(0.0)
    machine.markers([("a", 0)])
    assert machine.decide(1.0) == sp.Read((("a", 0),))
    machine.unreadable([("a", 0)])
    act = machine.decide(1.2)
    while isinstance(act, sp.ReadPeers):
        for owner in act.owners:
            machine.peer_status(owner, sp.PeerStatus(1, "running", 1.2, progress=3), 1.2)
        act = machine.decide(1.2)
    assert isinstance(act, sp.Wait) and act.until == pytest.approx(1.0 + sp.READ_AGAIN)
    assert machine.decide(2.1) == sp.Read((("a", 0),))  # read again
    machine.read({("a", 0): sp.Record("a", 0, 0, "ok", None, "a0")})
    assert isinstance(machine.decide(2.1), sp.Train)
    strict = sp.SlotMachine(hops, shard=1, slot=0, try_number=1, began=0.0, wait=60.0, rules=sp.Rules(read_again=False))
    with pytest.raises(LookupError):
        strict.unreadable([("a", 0)])


def test_a_slot_yields_for_the_wait_bound_at_most_then_fails_naming_the_slot_that_never_started(toy_data, tmp_path):
    """Shard 0's task never starts (no worker on mop_shard_0). Shard 1 gives its pool slot back (it may
    be another block's turn), but for the wait bound in all, counted from its first yield across its
    reschedules (its status says when); then it waits as any slot, and its last try fails naming shard 0,
    its pool and queue, and says shard 0 failed for good so that no slot waits for it any more."""
    from mop_airflow.slots.driver import SlotYielded

    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    hops = _hops(run)
    kw = dict(block="b0", shard=1, slot=0, cache_dir=run.store.local_cache, yield_seconds=0.3, wait_seconds=2)
    with pytest.raises(SlotYielded):
        run_slot(layout, run, manifest, hops, **kw)
    first = read_status(layout, "b0", 1, 0)
    assert first.state == "yielded" and first.yielding_since is not None
    with pytest.raises(SlotYielded):  # rescheduled, the same try: yields again, its first yield kept
        run_slot(layout, run, manifest, hops, **kw)
    assert read_status(layout, "b0", 1, 0).yielding_since == first.yielding_since
    time.sleep(max(0.0, first.yielding_since + 2.1 - time.time()))
    with pytest.raises(BlockIncompleteError) as caught:  # past the yield bound: it waits, then fails
        run_slot(layout, run, manifest, hops, final=lambda exc: True, **kw)
    error = caught.value
    assert error.absent == [(0, 0)] and error.untrained
    assert all(why.startswith("shard 0 slot 0 has not started: it wrote no status") and "queue mop_shard_0" in why
               for why in error.untrained.values())
    ended = read_status(layout, "b0", 0, 0)
    assert (ended.state, ended.final) == ("failed", True) and ended.error.startswith("never started: shard 1 slot 0")
