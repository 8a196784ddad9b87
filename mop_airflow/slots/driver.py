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
The loop is here; its parts each have a module: training and committing
(:mod:`~mop_airflow.slots.train_actions`), the machine's reads and writes on the store
(:mod:`~mop_airflow.slots.store_actions`), ASHA's legs on a dead slot (:mod:`~mop_airflow.slots.dead_legs`),
what the slot says when it ends (:mod:`~mop_airflow.slots.endings`); where a block's hops go is
:mod:`~mop_airflow.planning.placement`'s (the plan simulator's too).

Runs and is tested without Airflow; the shard operator maps Airflow's context onto :func:`run_slot`.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from mop_airflow.records import Assignment, HopRecord, Manifest, RunRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.slots import messages as slot_messages
from mop_airflow.slots.commits import CommitLog, CommitPoller
from mop_airflow.slots.dead_legs import DeadLegs
from mop_airflow.slots.endings import (  # noqa: F401 - how a slot ends, its exceptions re-exported
    SlotStopped, SlotSuperseded, SlotYielded, ended, ended_raising)
from mop_airflow.slots.machine import SlotMachine
from mop_airflow.slots.messages import (Check, Decide, Look, Read, ReadPeers, Rules, Stopped, Superseded, Train,
                                        Wait, Write, Yield)
from mop_airflow.planning.placement import (  # noqa: F401 - where a block's hops go, re-exported
    BlockHop, block_hops, deal_fused_slots, deal_slots, fused_partners)
from mop_airflow.planning.fusing import groups_of
from mop_airflow.slots.status import StatusWriter, yielding_since
from mop_airflow.slots.store_actions import StoreActions
from mop_airflow.slots.train_actions import TrainActions
from mop_airflow.slots.watchdog import Watchdog
from mop_airflow.training import progress
from mop_airflow.training.fused import fuses_here
from mop_airflow.training.model_hop import CLEANUP, Where, state_after
from mop_airflow.training.session import WARM_MODELS, TaskSession

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


class _Loop(StoreActions, TrainActions, DeadLegs):
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
        partners = (fused_partners(own, functools.partial(groups_of, run))
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
                    self._train_hops(act, commits, ahead, writer, reader, hasher)
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
        machine = self.machine
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
                self._read_peers(act)
            elif isinstance(act, Look):
                self._look(act)
            elif isinstance(act, Check):
                self._check(act)
            elif isinstance(act, Write):
                self._write(act)
            else:
                return act

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
