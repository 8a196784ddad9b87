"""Every hop a block puts on one shard slot, trained in one process that stays warm.

As Cerebro runs one long task per worker hosting its training service, and MADlib's segments keep
their state between hops: the task of slot ``k`` of shard ``s`` starts once per block, imports Keras,
starts its device and reads its shard once, then trains every hop of the block that falls on
``(s, k)``, one after another. It takes whichever of its hops is ready (the configuration's previous
hop committed in the store, by whichever slot trained it), so a model still waits only for itself,
and it keeps every model it compiled (:class:`~mop_airflow.training.session.TaskSession`).

What a hop learns never depends on which process trained it or when: each hop restores weights
and optimizer state from its configuration's checkpoint, and its batch order and seed come from
the plan (:func:`~mop_airflow.training.hop.batch_order`). Checkpoints still go through the store,
atomically, so the next hop may run on another machine. The training thread only takes a hop's
state out of the model; a writer thread packs and hashes it and commits the hop (checkpoint, then
record) while the next one trains, and a reader thread reads and hashes the next ready hop's
checkpoint ahead.

The guarantees of a task per hop are kept:

- a configuration that fails (its builder raises, its loss diverges) is recorded; its later hops
  are dropped wherever they were due, and every other hop goes on;
- a retried task skips the hops an earlier try committed (same input state, record written);
- a slot that waits for a slot which failed for good (or died on its last try: its heartbeat silent for
  the wait bound, with no retry to follow) gives those hops up, trains everything else, and fails naming
  the slot and the hops left untrained (:class:`~mop_airflow.errors.BlockIncompleteError`); in ASHA the
  configurations those hops belong to fail instead, with the cause, and the search goes on;
  one that waits for a slot whose progress stopped for ``MOP_SHARD_WAIT_SECONDS`` (600 s by default)
  does the same, but its task is retried: that slot may be late (its pool held elsewhere) or hung, and
  comes back;
- a slot whose own progress stops (a step that hangs, a stalled mount, a stopped process) is killed by
  its watchdog after ``MOP_SHARD_STALL_SECONDS`` (:mod:`~mop_airflow.slots.watchdog`), and retried.

A block's slots wait for each other's hops, so they must all run at once. Two blocks that share
the shard pools at once (two selections, two DAGs) could each hold some of them and wait for the
rest; so a slot waiting while a slot of its block ranked before it (by shard, then slot) has not
started within ``MOP_SHARD_YIELD_SECONDS`` (30 s) gives its pool slot back (:class:`SlotYielded`;
the operator reschedules the task; what it committed stays) and tries again later. A slot that has
trained a hop another slot of its block handed it, or whose slots ranked before it run or ended their
block, keeps its pool slot: its block holds the pools. The block holding the first shard's slot keeps
every slot it gets, so it always gets the rest (with one slot per shard; with several, two blocks may
each hold a slot of the first shard and wait, up to the wait bound).

What the slot decides (what to train next, when to wait, settle a failed configuration forward, give a
hop up or take it back, yield, end) is a pure state machine,
:class:`~mop_airflow.slots.machine.SlotMachine`, which the slot protocol's simulation
(:mod:`~slot_sim`) checks over many schedules; the loop here is its driver: it
carries each action out with the store, its threads and the clock, and tells the machine what it found.
Training, committing, the slot's status and the task's result stay here.

Runs and is tested without Airflow; the shard operator maps Airflow's context onto :func:`run_slot`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from mop_airflow.errors import TrainingError
from mop_airflow.planning.asha_slots import dead_leg_error, dead_legs
from mop_airflow.slots import messages as slot_messages
from mop_airflow.training import progress
from mop_airflow.records import Assignment, HopRecord, Manifest, RunRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.training.fused import fused_partners, fuses_here, train_fused_hop
from mop_airflow.training.model_hop import (CLEANUP, Where, failure_of, read_hashed, record_failure, sha256_of,
                                            state_after, train_hop, with_digest)
from mop_airflow.slots.commits import CommitLog, CommitPoller
from mop_airflow.slots.endings import (  # noqa: F401 - how a slot ends, its exceptions re-exported
    SlotStopped, SlotSuperseded, SlotYielded, ended, ended_raising)
from mop_airflow.slots.placement import (  # noqa: F401 - where a block's hops go, re-exported
    BlockHop, block_hops, deal_fused_slots, deal_slots)
from mop_airflow.training.session import WARM_MODELS, TaskSession, out_of_memory
from mop_airflow.slots.messages import (Check, Decide, Facts, Look, Read, ReadPeers, Rules, Stopped, Superseded,
                                        Train, Wait, Write, Yield)
from mop_airflow.slots.machine import PeerView, SlotMachine
from mop_airflow.slots.status import HEARTBEAT_SECONDS, StatusWriter, read_status, yielding_since
from mop_airflow.slots.watchdog import Watchdog

log = logging.getLogger(__name__)

WAIT_ENV = "MOP_SHARD_WAIT_SECONDS"
# How long a slot waits for a slot whose progress stopped before it gives up the hops that depend on
# it (and is retried). Longer than Airflow needs to find a lost task instance (its heartbeat timeout,
# 300 s by default) and start its retry (10 s, then 20 s), and than a hung slot's watchdog takes.
WAIT_SECONDS = 600.0
# How long a slot waits for a hop's input, its slot alive, before it looks the input's record up in the
# store itself: the marker that names it may have landed after a name its poller had already listed
# past (a commit and a failure marked at once, a marker PUT retried, a listing that lags), and then no
# listing ever shows it. Found by the slot protocol's simulation (slot_sim).
LOOK_SECONDS = 60.0
YIELD_ENV = "MOP_SHARD_YIELD_SECONDS"
# How long a slot that has trained nothing waits for the slots of its block ranked before it to
# start, before it gives its pool slot back: longer than a task takes to start when slots are free.
YIELD_SECONDS = 30.0


# Hops trained and not yet committed, at most: one the writer commits while the next one trains
# keeps both busy; a bound keeps the memory their taken states hold to two states. The machine holds
# the slot to it (it waits for a commit before it takes another hop).
STATES_HELD = slot_messages.STATES_HELD


@dataclass
class SlotResult:
    """What a slot's task did in its block."""

    trained: list[HopRecord] = field(default_factory=list)
    committed: list[str] = field(default_factory=list)  # hops an earlier try had committed (labels)
    failed: list[HopRecord] = field(default_factory=list)  # configurations that failed here
    dropped: list[str] = field(default_factory=list)  # hops after a configuration's failure elsewhere
    untrained: dict[str, str] = field(default_factory=dict)  # hops given up: label -> why
    waited: float = 0.0  # seconds with nothing ready
    absent: list = field(default_factory=list)  # ASHA finished: the block's slots that never started, ended done


def run_slot(layout: RunLayout, run: RunRecord, manifest: Manifest, hops: Sequence[BlockHop], *, block: str,
             shard: int, slot: int, cache_dir: str, where: Where = Where(), mine: Iterable[BlockHop] | None = None,
             fatal: Callable[[BaseException], bool] = lambda exc: False,
             final: Callable[[BaseException], bool] = lambda exc: True,
             wait_seconds: float | None = None, yield_seconds: float | None = None,
             session: TaskSession | None = None, on_hop: Callable[[HopRecord], object] | None = None,
             stop: threading.Event | None = None, stall_seconds: float | None = None,
             more: Any = None, last_try: bool = False, tries_left: int = 1) -> SlotResult:
    """Train the hops of ``hops`` (the whole block) that fall on ``(shard, slot)``, or ``mine``.

    ``mine`` lets one process train more than its slot: every hop of the block when tasks run one
    at a time (``dag.test()``), which can then never wait for another process. ``block`` names the
    block in the slots' status files. ``fatal(exc)``: errors that end the task instead of failing
    one configuration (the store going away, ``search.fail_fast``); ``final(exc)``: whether no retry
    follows such an error (then the slots waiting for this one stop waiting). ``on_hop(record)`` is
    called as each hop is committed (the task's log). Raises :class:`SlotYielded` when the slot gives
    its pool slot back (``yield_seconds``, by default ``MOP_SHARD_YIELD_SECONDS``; never with ``mine``).
    ``stop`` set (the task's ``on_kill``): the slot ends after its hop in progress and its commits,
    raising :class:`SlotStopped`. ``stall_seconds``: a watchdog process kills this process when its
    progress stops that long (:mod:`~mop_airflow.slots.watchdog`; a task of its own only, never the
    caller's process of ``dag.test()``; None or 0: none). ``more``: where hops decided while the block
    trains come from (an ASHA search, :class:`~mop_airflow.slots.asha_source.AshaSource`): the slot
    asks it for new hops as it polls, and to decide when it has nothing ready, until it says the
    search has ended. ``last_try``: no retry follows this try; its status says so, so that the slots
    waiting for it know it ended for good if it dies (it says no last word then). ``tries_left``: this try
    and the retries after it; an ASHA slot waits that many wait bounds for a slot of its block that has
    not started before it fails for good naming it (a grid's slot waits one a try).
    """
    own = list(mine) if mine is not None else [h for h in hops if h.shard == shard and h.slot == slot]
    loop = _Loop(layout, run, manifest, hops, own, block=block, shard=shard, slot=slot, cache_dir=cache_dir,
                 where=where, fatal=fatal, session=session, on_hop=on_hop,
                 wait=wait_seconds if wait_seconds is not None else float(os.environ.get(WAIT_ENV) or WAIT_SECONDS),
                 give_back=None if mine is not None else (
                     yield_seconds if yield_seconds is not None else float(os.environ.get(YIELD_ENV) or YIELD_SECONDS)),
                 stop=stop, more=more, last_try=last_try, tries_left=tries_left)
    watchdog = Watchdog(stall_seconds) if stall_seconds and mine is None else None
    try:
        result = loop.train_all()
    except BaseException as exc:
        ended_raising(loop, layout, block, exc, last_try=last_try, final=final)
        raise
    finally:
        if watchdog is not None:
            watchdog.stop()
    return ended(loop, layout, block, result, final=final)


class _Loop:
    """The driver of the slot's state machine (:class:`~mop_airflow.slots.machine.SlotMachine`): it
    asks the machine what to do next and carries that out with the store, its threads and the clock,
    telling it what it found and what arrived meanwhile (markers its poller listed, commits its writer
    thread made, peers' statuses, records, ASHA's decisions). What to train next, when to wait, what to
    settle, give up, take back, and when to yield or end is the machine's, as the simulation checks it;
    training, committing, the slot's status and the task's result are the driver's."""

    def __init__(self, layout: RunLayout, run: RunRecord, manifest: Manifest, hops: Sequence[BlockHop],
                 own: list[BlockHop], *, block: str, shard: int, slot: int, cache_dir: str, where: Where,
                 fatal: Callable[[BaseException], bool], session: TaskSession | None,
                 on_hop: Callable[[HopRecord], object] | None, wait: float, give_back: float | None,
                 stop: threading.Event | None = None, more: Any = None, last_try: bool = False,
                 tries_left: int = 1) -> None:
        self.layout, self.run, self.manifest = layout, run, manifest
        self.cache_dir, self.where, self.fatal, self.on_hop, self.wait = cache_dir, where, fatal, on_hop, wait
        self.stop = stop or threading.Event()
        self.session = session or TaskSession(run, manifest, cache_dir, max_models=WARM_MODELS)
        self.more = more
        self.slot_of = (shard, slot)
        self.began = time.time()
        # schedule.fuse: this slot's hops that train as one program (ASHA's, decided as it goes, train alone)
        partners = (fused_partners(((h.config_id, h.hop, (h.shard, h.slot, h.rung_end)) for h in own), run)
                    if more is None and fuses_here(run, manifest, {h.shard for h in own}) else {})
        # give_back None: this process trains every slot's hops (dag.test()), and never yields
        self.machine = SlotMachine(hops, own=own, shard=shard, slot=slot, try_number=where.try_number,
                                   began=self.began, wait=wait, give_back=give_back, partners=partners,
                                   asha=more is not None, alone=give_back is None,
                                   shards=more.shards if more is not None else run.schedule.shards,
                                   slots=more.slots if more is not None else 1,
                                   rules=Rules(look_after=LOOK_SECONDS), state_after=state_after,
                                   yielding_since=yielding_since(layout, block, shard, slot, where.try_number),
                                   absent_wait=wait * max(1, tries_left))
        self.poller = CommitPoller(layout, block, self.machine.polled, own=self.slot_of, try_number=where.try_number,
                                   began=self.began)
        self.marks = CommitLog(layout, block, shard, slot, where.try_number)
        self.status = StatusWriter(layout, block, shard, slot, where, left=len(self.machine.pending), last_try=last_try)
        self.result = SlotResult()
        self.for_good: set[str] = set()  # hops given up because their slot ended for good
        self.legs_checked_at = 0.0  # ASHA: when the slots of the legs in flight were last checked
        self.absent: list[tuple[int, int]] = []  # the slots its hops waited for that never started

    def train_all(self) -> SlotResult:
        self.status.start()
        self.poller.poll()  # what is committed already, earlier tries' hops included
        self.poller.start()
        try:
            return self._train_all()
        finally:
            self.poller.stop()

    def _train_all(self) -> SlotResult:
        result, machine = self.result, self.machine
        with ThreadPoolExecutor(1, thread_name_prefix="mop-commit") as writer, \
                ThreadPoolExecutor(1, thread_name_prefix="mop-read-ahead") as reader, \
                ThreadPoolExecutor(1, thread_name_prefix="mop-hash") as hasher:
            commits: list[tuple[BlockHop, Assignment, Future]] = []
            ahead: dict[str, Future] = {}
            while True:
                if self.stop.is_set() and not machine.stopping:
                    machine.stop()  # the machine waits for the commits and its writes, then says Stopped
                self._settle(commits, block=False)
                if self.more is not None:
                    self._extend(self.more.new_hops())
                act = self._next()
                if isinstance(act, Train):
                    for _, later in act.ahead:  # read and hash the next ready model's checkpoint while this one trains
                        if later.checkpoint and later.checkpoint not in ahead:
                            # not tallied on that thread: the hop that takes it counts it (store.bytes_read
                            # deltas are a hop's own reads)
                            ahead[later.checkpoint] = reader.submit(read_hashed, self.layout.store, later.checkpoint,
                                                                    tally=False)
                    members = list(act.members)
                    trained = (self._train_fused(members, ahead, hasher) if len(members) > 1
                               else [(hop, state, self._train(hop, state, ahead, hasher)) for hop, state in members])
                    for member, member_state, done in trained:
                        if done is not None:
                            machine.trained_ok(member)
                            commits.append((member, member_state, writer.submit(self._commit, done)))
                elif isinstance(act, Wait):
                    if act.commit:
                        # its next hop waits for this slot's own commit (or a trained hop holds its taken state
                        # until its commit packs it: at most STATES_HELD at once, so a store slower than
                        # training slows the slot instead), or for another slot's: whichever comes
                        if commits:
                            wait_for([commits[0][2]], timeout=self.poller.first)
                        continue
                    progress.tick()  # waiting for other slots is progress: they are judged by their own
                    began = time.monotonic()
                    # a poll that finds a hop wakes the slot at once
                    self.poller.arrived.wait(min(1.0, max(0.0, act.until - time.time())))
                    if self.more is not None:
                        machine.store_changed()  # a decision or completion may have landed: decide again
                    if self.stop.is_set():
                        continue
                    result.waited += time.monotonic() - began
                elif isinstance(act, Decide):  # ASHA, nothing ready: what trains next?
                    if machine.rules.asha_dead_legs:
                        self._fail_dead_legs()
                    self.more.idle()
                    self._extend(self.more.new_hops())
                elif isinstance(act, Yield):
                    raise SlotYielded(act.why)
                elif isinstance(act, Stopped):
                    raise SlotStopped(f"{act.why}; the {len(result.trained)} committed stay, and a retry trains "
                                      "the rest")
                elif isinstance(act, Superseded):
                    log.error("%s", act.why)
                    raise SlotSuperseded(act.why)
                else:
                    break
            self._settle(commits, block=True, every=True)
        CLEANUP.retry(self.layout.store)  # a stale checkpoint whose delete failed: once more before the task ends
        result.untrained = dict(act.untrained)
        self.for_good = set(act.for_good)
        self.absent = sorted(act.absent)
        return result

    def _next(self) -> Any:
        """The machine's next action that the loop itself carries out (train, wait, decide, yield, end),
        after the reads and writes it asks for first, each answered at once."""
        machine, store = self.machine, self.layout.store
        machine.markers(sorted(self.poller.take()))  # a poll's error is raised here, on the loop's thread
        if self.poller.later_try:
            machine.later_try(self.poller.later_try)
        while True:
            given_up = dict(machine.untrained)
            act = machine.decide(time.time())
            self._report(given_up)
            for wanted, event in ((machine.wants_poll, self.poller.wanted), (machine.idle, self.poller.idle)):
                event.set() if wanted else event.clear()
            if isinstance(act, Read):
                self._read_records(act)
            elif isinstance(act, ReadPeers):
                now = time.time()
                for owner in act.owners:
                    machine.peer_status(owner, read_status(self.layout, self.status.block, *owner), now)
            elif isinstance(act, Look):
                self._look(act)
            elif isinstance(act, Check):
                self._check(act)
            elif isinstance(act, Write):
                self._write(act)
            else:
                return act

    def _read_records(self, act: Read) -> None:
        """The records the listed markers name; one that a reader of this store cannot read yet (listed, but
        404 here for a while) is read again later: the machine waits for it as for a hop not listed."""
        found, missing = {}, []
        for key in act.keys:
            data = self.layout.store.read_if_there(self.layout.hop_record_uri(*key))
            if data is None:
                missing.append(key)
                log.warning("%s t=%d: its marker is listed but its record cannot be read yet; read again shortly", *key)
            else:
                found[key] = HopRecord.from_dict(json.loads(data))
        self.machine.read(found)
        if missing:
            self.machine.unreadable(missing)

    def superseded(self) -> bool:
        """Whether a later try of this slot left a marker since this try began (one listing of its own
        folder, made when the slot ends failing: a copy taken for dead must not say a last word then)."""
        try:
            return self.poller.look_own() > 0
        except Exception:  # noqa: BLE001 - the task's own error is the one to report
            return False

    def _report(self, given_up: dict[str, str]) -> None:
        """What the machine's last decision dropped, gave up or took back: into the result and the log."""
        machine = self.machine
        while machine.dropped:
            hop, record = machine.dropped.pop(0)
            self.result.dropped.append(hop.label)
            log.info("%s: dropped, %s %s at hop %d", hop.label, hop.config_id, record.status, record.t)
        if given_up != machine.untrained:
            for label, why in machine.untrained.items():
                if label not in given_up:
                    log.error("%s: given up, %s", label, why)
            for label in given_up:
                if label not in machine.untrained:
                    log.info("%s: given up before, now taken back or failed", label)

    def _extend(self, hops: Iterable[BlockHop]) -> None:
        """Hops decided while the block trains (ASHA): to the machine, which keeps this slot's."""
        self.status.left += self.machine.asha_hops(hops, self.more.ended)

    def _look(self, act: Look) -> None:
        """Whether the records of the hops' inputs are in the store though no marker named them."""
        store, found = self.layout.store, {}
        for hop, _, _ in act.hops:
            uri = self.layout.hop_record_uri(hop.config_id, hop.hop - 1)
            found[hop.config_id, hop.hop - 1] = record = HopRecord.read(store, uri) if store.exists(uri) else None
            if record is not None:
                log.info("%s: its input's record is in the store, though no marker named it", hop.label)
        self.machine.looked(act.hops, found)

    def _check(self, act: Check) -> None:
        """Whether an earlier try committed these hops (then learnt, and not trained again)."""
        for hop, earlier in self.machine.checked({(hop.config_id, hop.hop): self._facts(hop, state)
                                                  for hop, state in act.members}):
            self.result.committed.append(hop.label)
            if earlier.status != "ok" and earlier.dropped_after is None:
                self.result.failed.append(earlier)
            log.info("%s: already committed by try %d of %s; not trained again", hop.label, earlier.try_number,
                     earlier.task_id or "an earlier task")

    def _facts(self, hop: BlockHop, state: Assignment) -> Facts:
        """What the store says of ``hop`` for the machine's check, asking only what its rule reads, in its
        order: a first try asks only of hops whose markers were listed, and reads their records at once."""
        store, cid, t = self.layout.store, hop.config_id, hop.hop
        uri = self.layout.hop_record_uri(cid, t)
        if self.where.try_number > 1 and not store.exists(uri):
            return Facts()
        record = HopRecord.read(store, uri)
        if record.input_sha256 != state.checkpoint_sha256 or record.status != "ok":
            return Facts(record)
        if record.checkpoint and store.exists(record.checkpoint):
            return Facts(record, checkpoint_there=True)
        if self.where.try_number == 1 and (cid, t + 1) in self.machine.known:
            return Facts(record)
        return Facts(record, next_there=store.exists(self.layout.hop_record_uri(cid, t + 1)))

    def _write(self, act: Write | None) -> None:
        """The machine's writes, in order: a failure, a drop settled forward (unless a record is there: an
        earlier try's stays), a marker a retry found missing; each record then its marker."""
        store, fence = self.layout.store, self.machine.rules.fence
        for record, how in () if act is None else act.records:
            if how == "mark":
                self.marks.mark(record)
                continue
            uri = self.layout.hop_record_uri(record.config_id, record.t)
            written = self._hop_record(record)
            if fence:
                # created only where no record is: one request, where a look and a write were two; a record
                # there (an earlier try's settle, or another copy's commit of the hop) stands
                if not written.create(store, uri):
                    self.machine.lost(record, None if how == "settle" else HopRecord.read(store, uri))
                    continue
            elif how == "settle" and store.exists(uri):
                continue
            else:
                written.write(store, uri)
            self.marks.mark(written)
            if how == "write":
                self.result.failed.append(written)
                log.info("%s t=%d recorded %s: %s", written.config_id, written.t, written.status, written.error)

    def _hop_record(self, record: Any) -> HopRecord:
        """The machine's record as this try writes it."""
        iteration, hop = divmod(record.t, self.run.schedule.shards)
        return HopRecord(config_id=record.config_id, t=record.t, iteration=iteration, hop=hop, shard=record.shard,
                         status=record.status, task_id=self.where.task_id, error=record.error,
                         try_number=self.where.try_number, input_sha256=record.input_sha256,
                         dropped_after=record.dropped_after)

    def _train(self, hop: BlockHop, state: Assignment, ahead: dict[str, Future], hasher: ThreadPoolExecutor) -> Any:
        """Train one hop; returns what to commit, or None (it failed, and is recorded)."""
        layout = self.layout
        taken = time.time()
        self.status.training = hop.label
        where = replace(self.where, started_at=taken)
        read = self._reader(ahead, hasher)
        log.info("%s on shard %d from %s", hop.label, hop.shard, state.checkpoint or "its initial weights")
        try:
            for again in (False, True):
                held = self.session.held
                try:
                    return train_hop(layout, self.run, self.manifest, state, t=hop.hop, shard=hop.shard,
                                     rung_end=hop.rung_end, cache_dir=self.cache_dir, where=where,
                                     session=self.session, read_checkpoint=read)
                except Exception as exc:
                    if self.fatal(exc):
                        raise
                    # the models this process keeps may be what filled the device: let them go and train the
                    # hop again before the configuration is blamed (its own model is built afresh)
                    if again or not out_of_memory(exc) or held == 0:
                        self._failed(hop, state, exc)
                        return None
                    log.warning("%s ran out of memory with %d compiled model(s) kept (%s): they are let go and the "
                                "hop trains again", hop.label, held, exc)
                    self.session.empty()
            return None
        finally:
            self.status.training = None

    def _train_fused(self, members: list[tuple[BlockHop, Assignment]], ahead: dict[str, Future],
                     hasher: ThreadPoolExecutor) -> list[tuple[BlockHop, Assignment, Any]]:
        """Train a fused group's hops (``schedule.fuse``: one shard, one hop, one program) and return each
        member's to commit (None: failed and recorded). A member whose input does not restore or whose
        loss diverges fails alone; if the group's program itself fails, its members train alone."""
        first = members[0][0]
        where = replace(self.where, started_at=time.time())
        self.status.training = ", ".join(hop.label for hop, _ in members)
        log.info("%s fused on shard %d", self.status.training, first.shard)
        try:
            results = train_fused_hop(self.layout, self.run, self.manifest, [state for _, state in members],
                                      t=first.hop, shard=first.shard, rung_end=first.rung_end,
                                      cache_dir=self.cache_dir, where=where, session=self.session,
                                      read_checkpoint=self._reader(ahead, hasher))
        except Exception as exc:
            if self.fatal(exc):
                raise
            log.warning("%s: the fused program failed (%s: %s); its members train alone", self.status.training,
                        type(exc).__name__, exc)
            self.session.empty()
            return [(hop, state, self._train(hop, state, ahead, hasher)) for hop, state in members]
        finally:
            self.status.training = None
        out = []
        for (hop, state), result in zip(members, results):
            if isinstance(result, Exception):
                if self.fatal(result):
                    raise result
                self._failed(hop, state, result)
                result = None
            out.append((hop, state, result))
        return out

    def _reader(self, ahead: dict[str, Future], hasher: ThreadPoolExecutor) -> Callable[[str], tuple[bytes, Any]]:
        """How a hop reads its input checkpoint: read and hashed ahead (``ahead``), or hashed on another thread
        (hashlib lets go of the GIL) while the bytes are decoded."""
        store = self.layout.store

        def read(uri: str) -> tuple[bytes, Callable[[], str]]:
            future = ahead.pop(uri, None)
            if future is None:
                data = store.read_bytes(uri)
                return data, hasher.submit(sha256_of, data).result
            data, sha256 = future.result()
            store.bytes_read += len(data)
            return with_digest(data, sha256)

        return read

    def _settle(self, commits: list[tuple[BlockHop, Assignment, Future]], *, block: bool, every: bool = False) -> None:
        """Take the finished commits (``block``: wait for the oldest, ``every``: for all). A commit that
        failed goes the way of a hop that failed: a fatal error (the store went away) ends the task, any
        other fails its configuration."""
        while commits and (commits[0][2].done() or block):
            hop, state, future = commits.pop(0)
            try:
                record, won = future.result()
            except Exception as exc:
                if self.fatal(exc):
                    raise
                self._failed(hop, state, exc, commit=True)
                continue
            progress.tick()
            if not won:  # another copy of the hop committed it first (Rules.fence): its record stands
                self.result.committed.append(hop.label)
                self.machine.commit_lost(record)
                log.warning("%s: try %d of %s committed it first; its record stands and this copy's is not written",
                            hop.label, record.try_number, record.task_id or "another task")
                continue
            self.result.trained.append(record)
            self.machine.committed(record)
            self.status.hop_done()
            if self.on_hop is not None:
                self.on_hop(record)
            if not every:
                block = False

    def _commit(self, trained: Any) -> tuple[HopRecord, bool]:
        """On the writer thread: the hop's checkpoint and record, then its marker for the waiting slots; the
        record that stands, and whether it is this one (fenced, another copy's may have been first)."""
        record = trained.commit(fence=self.machine.rules.fence)
        if trained.won:
            self.marks.mark(record)
        return record, trained.won

    def _failed(self, hop: BlockHop, state: Assignment, exc: BaseException, *, commit: bool = False) -> None:
        """Configuration ``hop.config_id`` failed at ``hop`` (or its commit did): the machine has it recorded
        next; the other configurations go on."""
        self.session.forget(self.run.config(hop.config_id))
        status, reason = failure_of(exc)
        (self.machine.commit_failed if commit else self.machine.trained_failed)(hop, state, status, reason)
        log.error("%s %s; its remaining hops are dropped, the other configurations go on", hop.label, status,
                  exc_info=exc)

    def _fail_dead_legs(self) -> None:
        """ASHA: a job in flight whose next hop is on a slot that ended for good (failed for good, or died
        on its last try) fails there, with the cause. When that hop is its leg's last, no slot waits for
        it, and the search would wait for the job for ever (found by the slot protocol's simulation,
        seed 539). Checked at most once a heartbeat, when the slot has nothing ready."""
        now = time.time()
        if now - self.legs_checked_at < HEARTBEAT_SECONDS:
            return
        self.legs_checked_at = now
        store = self.layout.store

        def failed(config_id: str, t: int) -> bool:
            uri = self.layout.hop_record_uri(config_id, t)
            return store.exists(uri) and HopRecord.read(store, uri).status != "ok"

        for leg, t, shard, why in dead_legs(self.more.ledger.next_hops(), shards=self.more.shards, me=self.slot_of,
                                            gone=lambda owner: self._peer(owner, now).gone(now, self.wait),
                                            failed=failed):
            self._fail_for_good(leg.config_id, t, shard, why)

    def _fail_for_good(self, config_id: str, t: int, shard: int, why: str) -> None:
        """ASHA: record configuration ``config_id`` failed at its hop ``t`` (on ``shard``), which will never
        train; the search goes on without it."""
        failure = record_failure(self.layout, Assignment(config_id, t - 1, None), t=t, shard=shard,
                                 shards=self.run.schedule.shards, where=self.where,
                                 error=TrainingError(dead_leg_error(t, shard, why)),
                                 fence=self.machine.rules.fence)
        self.marks.mark(failure)
        self.machine.recorded(failure)
        if failure.error and why in failure.error:
            self.result.failed.append(failure)
        else:  # another copy recorded the hop first (Rules.fence): its record stands
            log.warning("%s t=%d: try %d of %s recorded it first; its record stands", config_id, t,
                        failure.try_number, failure.task_id)
        log.error("%s t=%d: its hop %s; %s is recorded failed and the search goes on", config_id, t, why, config_id)

    def _peer(self, owner: tuple[int, int], now: float) -> PeerView:
        """Slot ``owner`` as the machine sees it, its status read again at most once per heartbeat."""
        peer = self.machine.peer(owner, now)
        if now - peer.read_at >= min(HEARTBEAT_SECONDS, self.wait / 2):
            peer.read_at = now
            peer.read(read_status(self.layout, self.status.block, *owner), now)
        return peer
