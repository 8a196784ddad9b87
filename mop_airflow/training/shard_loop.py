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
  its watchdog after ``MOP_SHARD_STALL_SECONDS`` (:mod:`~mop_airflow.training.watchdog`), and retried.

A block's slots wait for each other's hops, so they must all run at once. Two blocks that share
the shard pools at once (two selections, two DAGs) could each hold some of them and wait for the
rest; so a slot waiting while a slot of its block ranked before it (by shard, then slot) has not
started within ``MOP_SHARD_YIELD_SECONDS`` (30 s) gives its pool slot back (:class:`SlotYielded`;
the operator reschedules the task; what it committed stays) and tries again later. A slot that has
trained a hop another slot of its block handed it, or whose slots ranked before it run or ended their
block, keeps its pool slot: its block holds the pools. The block holding the first shard's slot keeps
every slot it gets, so it always gets the rest (with one slot per shard; with several, two blocks may
each hold a slot of the first shard and wait, up to the wait bound).

Runs and is tested without Airflow; the shard operator maps Airflow's context onto :func:`run_slot`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection, Iterable, Sequence

from mop_airflow.errors import BlockIncompleteError, TrainingError
from mop_airflow.training import progress
from mop_airflow.planning.schedule import DEFAULT_PRIORITY, priority_weight, shard_at
from mop_airflow.records import Assignment, HopRecord, Manifest, RunRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.training.fused import fused_partners, fuses_here, train_fused_hop
from mop_airflow.training.model_hop import (CLEANUP, Where, read_hashed, record_failure, sha256_of, train_hop,
                                            with_digest)
from mop_airflow.training.slot_commits import Chains, CommitLog, CommitPoller, committed
from mop_airflow.training.session import WARM_MODELS, TaskSession, out_of_memory
from mop_airflow.training.slot_status import HEARTBEAT_SECONDS, Peer, StatusWriter
from mop_airflow.training.watchdog import Watchdog

log = logging.getLogger(__name__)

WAIT_ENV = "MOP_SHARD_WAIT_SECONDS"
# How long a slot waits for a slot whose progress stopped before it gives up the hops that depend on
# it (and is retried). Longer than Airflow needs to find a lost task instance (its heartbeat timeout,
# 300 s by default) and start its retry (10 s, then 20 s), and than a hung slot's watchdog takes.
WAIT_SECONDS = 600.0
# How long a slot waits for a hop's input, its slot alive, before it looks the input's record up in the
# store itself: the marker that names it may have landed after a name its poller had already listed
# past (a commit and a failure marked at once, a marker PUT retried, a listing that lags), and then no
# listing ever shows it. Found by the slot protocol's simulation (mop_airflow.training.slot_sim).
LOOK_SECONDS = 60.0
YIELD_ENV = "MOP_SHARD_YIELD_SECONDS"
# How long a slot that has trained nothing waits for the slots of its block ranked before it to
# start, before it gives its pool slot back: longer than a task takes to start when slots are free.
YIELD_SECONDS = 30.0


class SlotStopped(Exception):
    """The slot was asked to stop (its task was killed gracefully: SIGTERM, Airflow stopping): it ended
    after its hop in progress and its commits; a retry trains the rest."""


class SlotYielded(Exception):
    """The slot gave its pool slot back: a slot of its block ranked before it has not started (another
    block may hold its pool). Its committed hops stay; try the task again later."""


# Hops trained and not yet committed, at most: one the writer commits while the next one trains
# keeps both busy; a bound keeps the memory their taken states hold to two states.
STATES_HELD = 2


@dataclass(frozen=True)
class BlockHop:
    """One hop of a block: configuration ``config_id`` of offset class ``offset`` at the plan's step
    ``step`` (a global hop, or a block-relative one in a search decided between blocks), on ``shard``
    and its slot ``slot``. ``start`` is where the configuration enters the block, on its first hop."""

    config_id: str
    offset: int
    step: int
    shard: int
    slot: int
    hop: int      # the configuration's own global hop
    rung_end: bool = False
    start: Assignment | None = None
    weight: int = 1
    order: int = 0

    @property
    def label(self) -> str:
        return f"{self.config_id} t={self.hop}"


def block_hops(classes: Sequence[Sequence[Assignment]], *, shards: int, slots: int, start: int, end: int,
               relative: bool = False, rung_end: bool = False, priority: str = DEFAULT_PRIORITY,
               shift: int = 0, ends: Collection[str] | None = None,
               key: Callable[[str], str] | None = None,
               fuse: Callable[[Sequence[str]], list[list[str]]] | None = None) -> list[BlockHop]:
    """Every hop of a block, on every shard slot, in the plan's order.

    ``classes[o]`` lists offset class ``o``'s configurations in the order the slots take them, each with the state it
    enters the block in. Its hop at step ``t`` (``start <= t < end``) is on shard ``(o + t) mod shards``;
    with ``relative`` the steps count within the block and the configuration's own hop follows its
    state (a search decided between blocks); else its global hop is ``shift + t`` (a run continuing a
    search renders its block's steps from 0). Configuration ``i`` of the block (counted over the
    classes in order) trains on slot ``i mod slots`` of every shard. ``rung_end``: the block's last
    hop ends a rung and evaluates. The priority rule ranks a slot's ready hops as Airflow ranked hop
    tasks (:func:`~mop_airflow.planning.schedule.priority_weight`, counted to the block's end). ``key(config_id)``: the configuration's model key; then the
    configurations that share one go to the same slot where the slots stay balanced
    (:func:`deal_slots`), so a slot's compiled models serve more of its hops. ``fuse(config_ids)``: a
    class's configurations in the groups that may train fused (``schedule.fuse``); then each group goes
    whole to one slot (:func:`deal_fused_slots`), whatever ``key`` says. ``ends``: with
    ``rung_end``, the configurations whose rung ends at the block's end (the others go on past it, in
    the next block); None: every one.
    """
    hops: list[BlockHop] = []
    index = 0
    ids = [[a.config_id for a in members] for members in classes]
    dealt = (deal_fused_slots(ids, slots, fuse) if fuse is not None and slots > 1
             else None if key is None else deal_slots(ids, slots, key))
    for offset, members in enumerate(classes):
        for assignment in members:
            slot = index % max(1, slots) if dealt is None else dealt[assignment.config_id]
            index += 1
            for step in range(start, end):
                hops.append(BlockHop(
                    config_id=assignment.config_id, offset=offset, step=step,
                    shard=shard_at(offset, step, shards), slot=slot,
                    hop=assignment.t + 1 + (step - start) if relative else shift + step,
                    rung_end=rung_end and step == end - 1 and (ends is None or assignment.config_id in ends),
                    start=assignment if step == start else None,
                    weight=priority_weight(priority, step, end), order=len(hops)))
    return hops


def deal_slots(classes: Sequence[Sequence[str]], slots: int, key: Callable[[str], str]) -> dict[str, int]:
    """The slot of each configuration (``classes[o]`` lists offset class ``o``'s), keeping those that
    share a model key together. Each class puts on each slot what configuration ``i mod slots`` would
    (the same count, so the slots stay as balanced as before, class by class); within that, a
    configuration goes to the slot its model key first went to while it has room, else to the slot
    with the most room left (the lowest first). Deterministic: every slot of the block deals the same."""
    slots = max(1, slots)
    home: dict[str, int] = {}
    dealt: dict[str, int] = {}
    index = 0
    for members in classes:
        room = [0] * slots
        for i in range(index, index + len(members)):
            room[i % slots] += 1
        index += len(members)
        order: dict[str, list[str]] = {}
        for cid in members:
            order.setdefault(key(cid), []).append(cid)
        # the keys already at home first, so a newcomer never takes a place another key's configurations need
        for model in sorted(order, key=lambda k: k not in home):
            for cid in order[model]:
                slot = home.get(model)
                if slot is None or room[slot] == 0:
                    slot = max(range(slots), key=lambda s: (room[s], -s))
                home.setdefault(model, slot)
                room[slot] -= 1
                dealt[cid] = slot
    return dealt


def deal_fused_slots(classes: Sequence[Sequence[str]], slots: int,
                     fuse: Callable[[Sequence[str]], list[list[str]]]) -> dict[str, int]:
    """The slot of each configuration (``classes[o]`` lists offset class ``o``'s), each fused group of a
    class whole on one: the group to the slot with the fewest configurations of the block so far, the
    lowest first, so configurations alone deal as ``i mod slots`` does. Deterministic."""
    load = [0] * slots
    dealt: dict[str, int] = {}
    for members in classes:
        for group in fuse(members):
            slot = min(range(slots), key=lambda k: (load[k], k))
            load[slot] += len(group)
            dealt.update((cid, slot) for cid in group)
    return dealt


@dataclass
class SlotResult:
    """What a slot's task did in its block."""

    trained: list[HopRecord] = field(default_factory=list)
    committed: list[str] = field(default_factory=list)  # hops an earlier try had committed (labels)
    failed: list[HopRecord] = field(default_factory=list)  # configurations that failed here
    dropped: list[str] = field(default_factory=list)  # hops after a configuration's failure elsewhere
    untrained: dict[str, str] = field(default_factory=dict)  # hops given up: label -> why
    waited: float = 0.0  # seconds with nothing ready


def run_slot(layout: RunLayout, run: RunRecord, manifest: Manifest, hops: Sequence[BlockHop], *, block: str,
             shard: int, slot: int, cache_dir: str, where: Where = Where(), mine: Iterable[BlockHop] | None = None,
             fatal: Callable[[BaseException], bool] = lambda exc: False,
             final: Callable[[BaseException], bool] = lambda exc: True,
             wait_seconds: float | None = None, yield_seconds: float | None = None,
             session: TaskSession | None = None, on_hop: Callable[[HopRecord], object] | None = None,
             stop: threading.Event | None = None, stall_seconds: float | None = None,
             more: Any = None, last_try: bool = False) -> SlotResult:
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
    progress stops that long (:mod:`~mop_airflow.training.watchdog`; a task of its own only, never the
    caller's process of ``dag.test()``; None or 0: none). ``more``: where hops decided while the block
    trains come from (an ASHA search, :class:`~mop_airflow.training.asha_source.AshaSource`): the slot
    asks it for new hops as it polls, and to decide when it has nothing ready, until it says the
    search has ended. ``last_try``: no retry follows this try; its status says so, so that the slots
    waiting for it know it ended for good if it dies (it says no last word then).
    """
    own = list(mine) if mine is not None else [h for h in hops if h.shard == shard and h.slot == slot]
    loop = _Loop(layout, run, manifest, hops, own, block=block, shard=shard, slot=slot, cache_dir=cache_dir,
                 where=where, fatal=fatal, session=session, on_hop=on_hop,
                 wait=wait_seconds if wait_seconds is not None else float(os.environ.get(WAIT_ENV) or WAIT_SECONDS),
                 give_back=None if mine is not None else (
                     yield_seconds if yield_seconds is not None else float(os.environ.get(YIELD_ENV) or YIELD_SECONDS)),
                 stop=stop, more=more, last_try=last_try)
    watchdog = Watchdog(stall_seconds) if stall_seconds and mine is None else None
    try:
        result = loop.train_all()
    except SlotYielded as exc:
        loop.status.stop("yielded", error=str(exc))
        raise
    except BaseException as exc:
        # a slot stopped on request (SIGTERM) is not given up: its task's retry, or Airflow back, goes on
        loop.status.stop("failed", final=not isinstance(exc, SlotStopped) and final(exc),
                         error=f"{type(exc).__name__}: {exc}"[:1000])
        raise
    finally:
        if watchdog is not None:
            watchdog.stop()
    if result.untrained:
        error = BlockIncompleteError(shard, slot, result.untrained, for_good=loop.for_good)
        loop.status.stop("failed", final=final(error), error=str(error)[:1000])
        raise error
    loop.status.stop("done")
    return result


class _Loop:
    def __init__(self, layout: RunLayout, run: RunRecord, manifest: Manifest, hops: Sequence[BlockHop],
                 own: list[BlockHop], *, block: str, shard: int, slot: int, cache_dir: str, where: Where,
                 fatal: Callable[[BaseException], bool], session: TaskSession | None,
                 on_hop: Callable[[HopRecord], object] | None, wait: float, give_back: float | None,
                 stop: threading.Event | None = None, more: Any = None, last_try: bool = False) -> None:
        self.layout, self.run, self.manifest = layout, run, manifest
        self.cache_dir, self.where, self.fatal, self.on_hop, self.wait = cache_dir, where, fatal, on_hop, wait
        self.give_back = give_back
        self.stop = stop or threading.Event()
        # the block's slots ranked before this one (by shard, then slot): those with hops to train
        self.before = sorted({(h.shard, h.slot) for h in hops if (h.shard, h.slot) < (shard, slot)})
        self.session = session or TaskSession(run, manifest, cache_dir, max_models=WARM_MODELS)
        # by priority (highest first), then the plan's order: what Airflow's scheduler ranked hop tasks by
        self.pending = sorted(own, key=lambda h: (-h.weight, h.order))
        self.owner = {(h.config_id, h.hop): (h.shard, h.slot) for h in hops}
        self.chains = Chains(layout, [h.start for h in hops if h.start is not None])
        # the slots this one's hops come from (the previous shard's slot with the same configurations)
        # and itself (what an earlier try committed): one listing each a poll
        mine = {(h.shard, h.slot) for h in own}
        self.more = more
        self.slot_of = (shard, slot)
        self.alone = give_back is None  # this process trains every slot's hops (dag.test())
        if more is not None:  # ASHA: a leg's hops keep the deciding slot's index, so they come from the previous shard's
            p = more.shards
            mine = ({(s, k) for s in range(p) for k in range(more.slots)} if self.alone
                    else {(shard, slot), ((shard - 1) % p, slot)})
        self.poller = CommitPoller(layout, block, mine | {self.owner[h.config_id, h.hop - 1] for h in own
                                                          if (h.config_id, h.hop - 1) in self.owner})
        self.marks = CommitLog(layout, block, shard, slot, where.try_number)
        self.status = StatusWriter(layout, block, shard, slot, where, left=len(self.pending), last_try=last_try)
        self.result = SlotResult()
        # schedule.fuse: this slot's hops that train as one program (ASHA's, decided as it goes, train alone)
        self.partners = (fused_partners(((h.config_id, h.hop, (h.shard, h.slot, h.rung_end)) for h in own), run)
                         if more is None and fuses_here(run, manifest, {h.shard for h in own}) else {})
        self.peers: dict[tuple[int, int], Peer] = {}
        self.for_good: set[str] = set()  # hops given up because their slot ended for good
        self.given_up: dict[tuple[str, int], BlockHop] = {}  # taken back if their input comes after all
        self.looked_at: dict[tuple[str, int], float] = {}  # a given-up hop's input: last looked up (monotonic)
        self.waited_since: dict[tuple[str, int], float] = {}  # (configuration, hop of the input) -> monotonic
        # it took a hop another slot of its block handed it: the block runs, and this slot keeps its pool slot
        self.joined = False
        self.legs_checked_at = 0.0  # ASHA: when the slots of the legs in flight were last checked

    def train_all(self) -> SlotResult:
        self.began = time.time()
        self.status.start()
        self.poller.poll()  # what is committed already, earlier tries' hops included
        self.poller.start()
        try:
            return self._train_all()
        finally:
            self.poller.stop()

    def _train_all(self) -> SlotResult:
        result = self.result
        with ThreadPoolExecutor(1, thread_name_prefix="mop-commit") as writer, \
                ThreadPoolExecutor(1, thread_name_prefix="mop-read-ahead") as reader, \
                ThreadPoolExecutor(1, thread_name_prefix="mop-hash") as hasher:
            commits: list[tuple[BlockHop, Assignment, Future]] = []
            ahead: dict[str, Future] = {}
            while self.pending or commits or (self.more is not None and not self.more.ended):
                if self.stop.is_set():
                    self._settle(commits, block=True, every=True)
                    raise SlotStopped(f"asked to stop with {len(self.pending)} hop(s) left; the {len(result.trained)} "
                                      "committed stay, and a retry trains the rest")
                self._settle(commits, block=False)
                if self.more is not None:
                    self._extend(self.more.new_hops())
                ready, waiting = self._ready()
                if self.partners:
                    ready = self._whole_groups(ready, waiting)
                if not ready:
                    if commits:  # its next hop waits for this slot's own commit, or for another slot's: whichever comes
                        wait_for([commits[0][2]], timeout=self.poller.first)
                        continue
                    if self.more is not None and not self.more.ended:  # nothing ready: what trains next?
                        self._fail_dead_legs()
                        self.more.idle()
                        self._extend(self.more.new_hops())
                        if self._ready()[0]:
                            continue
                    elif not waiting:
                        break
                    progress.tick()  # waiting for other slots is progress: they are judged by their own
                    self._give_up(waiting)
                    if self.pending or self.more is not None:
                        began = time.monotonic()
                        self.poller.arrived.wait(1.0)  # a poll that finds a hop wakes the slot at once
                        if self.stop.is_set():
                            continue
                        result.waited += time.monotonic() - began
                    continue
                hop, state = ready[0]
                group = self.partners.get((hop.config_id, hop.hop))
                members = [(h, s) for h, s in ready if (h.config_id in group and h.hop == hop.hop)] if group else [
                    (hop, state)]
                self.joined = self.joined or hop.start is None
                for _, later in [r for r in ready if r not in members][:1]:  # read and hash the next ready model's checkpoint while this one trains
                    if later.checkpoint and later.checkpoint not in ahead:
                        # not tallied on that thread: the hop that takes it counts it (store.bytes_read
                        # deltas are a hop's own reads)
                        ahead[later.checkpoint] = reader.submit(read_hashed, self.layout.store, later.checkpoint,
                                                                tally=False)
                for member, _ in members:
                    self.pending.remove(member)
                # a trained hop holds its taken state (on a GPU, in its memory) until its commit packs it:
                # at most STATES_HELD at once (a fused group's, and one more), so a store slower than
                # training slows the slot instead
                while len(commits) >= STATES_HELD:
                    self._settle(commits, block=True)
                trained = (self._train_fused(members, ahead, hasher) if len(members) > 1
                           else [(hop, state, self._train(hop, state, ahead, hasher))])
                for member, member_state, done in trained:
                    if done is not None:
                        commits.append((member, member_state, writer.submit(self._commit, done)))
            self._settle(commits, block=True, every=True)
        CLEANUP.retry(self.layout.store)  # a stale checkpoint whose delete failed: once more before the task ends
        return result

    def _extend(self, hops: Iterable[BlockHop]) -> None:
        """Hops decided while the block trains: this slot's join its pending ones; every slot's tell
        whom a hop waits for, and where each configuration's leg starts."""
        added = False
        for hop in hops:
            self.owner[(hop.config_id, hop.hop)] = (hop.shard, hop.slot)
            if hop.start is not None:
                self.chains.states.setdefault(hop.config_id, {}).setdefault(hop.start.t, hop.start)
            if self.alone or (hop.shard, hop.slot) == self.slot_of:
                self.pending.append(hop)
                self.status.left += 1
                added = True
        if added:
            self.pending.sort(key=lambda h: (-h.weight, h.order))

    def _ready(self) -> tuple[list[tuple[BlockHop, Assignment]], list[BlockHop]]:
        """The pending hops whose input state is committed (in priority order), and those still waiting.
        A hop whose configuration failed before it, anywhere, is dropped, with the configuration's
        later hops. What the poller listed since is learnt first; a record is read when its marker
        names the hop a configuration waits for (its earliest pending one: its later ones cannot be ready
        before it), so a poll costs a listing, not a look per waiting configuration."""
        self.chains.listen(self.poller.take())
        self._take_back()
        earliest: dict[str, int] = {}
        for hop in self.pending:
            earliest[hop.config_id] = min(earliest.get(hop.config_id, hop.hop), hop.hop)
        ready, waiting, failed = [], [], {}
        since, self.waited_since = self.waited_since, {}
        for hop in self.pending:
            if hop.hop != earliest[hop.config_id]:
                continue
            state = hop.start or self.chains.before(hop.config_id, hop.hop)
            if isinstance(state, HopRecord):
                failed[hop.config_id] = state
            elif state is None:
                waiting.append(hop)
                key = (hop.config_id, hop.hop - 1)
                self.waited_since[key] = since.get(key, time.monotonic())
            else:
                ready.append((hop, state))
        for hop in [h for h in self.pending if h.config_id in failed]:
            record = failed[hop.config_id]
            self.pending.remove(hop)
            self.result.dropped.append(hop.label)
            log.info("%s: dropped, %s %s at hop %d", hop.label, hop.config_id, record.status, record.t)
            if hop.hop == earliest[hop.config_id]:
                self._settle_dropped(hop, record)
        waiting += [h for h in self.pending if h.hop != earliest[h.config_id] and h.config_id not in failed]
        for wanted, event in ((bool(waiting or self.given_up), self.poller.wanted), (not ready, self.poller.idle)):
            event.set() if wanted else event.clear()
        return ready, waiting  # in the pending hops' order: by priority

    def _train(self, hop: BlockHop, state: Assignment, ahead: dict[str, Future], hasher: ThreadPoolExecutor) -> Any:
        """Train one hop (or find it committed by an earlier try); returns what to commit, or None."""
        layout = self.layout
        if self._committed_before(hop, state):
            return None
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
                        self._failed(hop, state, exc, where)
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
        member's to commit (None: committed before, or failed and recorded). A member whose input does not
        restore or whose loss diverges fails alone; if the group's program itself fails, its members
        train alone."""
        todo = [(hop, state) for hop, state in members if not self._committed_before(hop, state)]
        if len(todo) < 2:
            return [(hop, state, self._train(hop, state, ahead, hasher)) for hop, state in todo]
        first = todo[0][0]
        where = replace(self.where, started_at=time.time())
        self.status.training = ", ".join(hop.label for hop, _ in todo)
        log.info("%s fused on shard %d", self.status.training, first.shard)
        try:
            results = train_fused_hop(self.layout, self.run, self.manifest, [state for _, state in todo], t=first.hop,
                                      shard=first.shard, rung_end=first.rung_end, cache_dir=self.cache_dir,
                                      where=where, session=self.session,
                                      read_checkpoint=self._reader(ahead, hasher))
        except Exception as exc:
            if self.fatal(exc):
                raise
            log.warning("%s: the fused program failed (%s: %s); its members train alone", self.status.training,
                        type(exc).__name__, exc)
            self.session.empty()
            return [(hop, state, self._train(hop, state, ahead, hasher)) for hop, state in todo]
        finally:
            self.status.training = None
        out = []
        for (hop, state), result in zip(todo, results):
            if isinstance(result, Exception):
                if self.fatal(result):
                    raise result
                self._failed(hop, state, result, where)
                result = None
            out.append((hop, state, result))
        return out

    def _whole_groups(self, ready: list[tuple[BlockHop, Assignment]],
                      waiting: list[BlockHop]) -> list[tuple[BlockHop, Assignment]]:
        """The ready hops less those of a fused group with a member still waiting at the same hop: a group
        trains whole, so its members train the same program whatever order their inputs came in."""
        late = {(hop.config_id, hop.hop) for hop in waiting}
        return [(hop, state) for hop, state in ready
                if not any((cid, hop.hop) in late for cid in self.partners.get((hop.config_id, hop.hop), ()))]

    def _committed_before(self, hop: BlockHop, state: Assignment) -> bool:
        """Whether an earlier try committed ``hop`` (then learnt here, and not trained again)."""
        # a retry asks the store: its earlier try may have died between a hop's record and its marker
        earlier = committed(self.layout, state, hop.hop, None if self.where.try_number > 1 else self.poller.known)
        if earlier is None:
            return False
        self.result.committed.append(hop.label)
        if earlier.status != "ok" and earlier.dropped_after is None:
            self.result.failed.append(earlier)
        self.chains.learn(earlier)
        if (hop.config_id, hop.hop) not in self.poller.known:
            # the earlier try died between the record and its marker: the slot waiting for this hop lists
            # markers, and would wait for ever (found by the slot protocol's simulation)
            self.marks.mark(earlier)
        log.info("%s: already committed by try %d of %s; not trained again", hop.label, earlier.try_number,
                 earlier.task_id or "an earlier task")
        return True

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
                record = future.result()
            except Exception as exc:
                if self.fatal(exc):
                    raise
                self._failed(hop, state, exc, replace(self.where, started_at=time.time()))
                continue
            progress.tick()
            self.result.trained.append(record)
            self.chains.learn(record)
            self.status.hop_done()
            if self.on_hop is not None:
                self.on_hop(record)
            if not every:
                block = False

    def _commit(self, trained: Any) -> HopRecord:
        """On the writer thread: the hop's checkpoint and record, then its marker for the waiting slots."""
        record = trained.commit()
        self.marks.mark(record)
        return record

    def _failed(self, hop: BlockHop, state: Assignment, exc: BaseException, where: Where) -> None:
        """Record configuration ``hop.config_id`` failed at ``hop``; the other configurations go on."""
        self.session.forget(self.run.config(hop.config_id))
        failure = record_failure(self.layout, state, t=hop.hop, shard=hop.shard, shards=self.run.schedule.shards,
                                 error=exc, where=where)
        self.marks.mark(failure)
        self.result.failed.append(failure)
        self.chains.learn(failure)
        log.error("%s %s; its remaining hops are dropped, the other configurations go on", hop.label, failure.status,
                  exc_info=exc)

    def _settle_dropped(self, hop: BlockHop, failure: HopRecord) -> None:
        """Write down, where ``hop`` was due, that it will never train: the slot of the next shard waits for
        this hop's record (its marker in this slot's folder), and learns from it that the configuration
        failed. Without it that slot, and every one after it along the chain, waited for a hop that never
        came. The configuration's later hops on this slot need no record: its next hop's slot drops them
        (and settles its own) as this one did. An earlier try's record of the hop is left as it is."""
        uri = self.layout.hop_record_uri(hop.config_id, hop.hop)
        if self.layout.store.exists(uri):
            return
        first = failure.t if failure.dropped_after is None else failure.dropped_after
        record = HopRecord(config_id=hop.config_id, t=hop.hop, iteration=hop.hop // self.run.schedule.shards,
                           hop=hop.hop % self.run.schedule.shards, shard=hop.shard, status=failure.status,
                           task_id=self.where.task_id, error=failure.error, try_number=self.where.try_number,
                           dropped_after=first)
        record.write(self.layout.store, uri)
        self.marks.mark(record)

    def _give_up(self, waiting: list[BlockHop]) -> None:
        """Drop the waiting hops whose input comes from a slot that ended for good or made no progress
        within the wait bound; give the pool slot back (:class:`SlotYielded`) when this slot has taken no
        hop from another slot and a slot ranked before it neither runs nor ended its block."""
        now = time.time()
        if self.give_back is not None and not self.joined and now - self.began > self.give_back:
            for owner in self.before:  # each read until seen started, then never again
                if not self._peer(owner, now).started(now, self.wait):
                    raise SlotYielded(f"shard {owner[0]} slot {owner[1]} of this block has not started within "
                                      f"{self.give_back:.0f} s: this slot gives its pool slot back and tries again "
                                      "later, so a block that holds the shards before it can finish")
        for hop in waiting:
            owner = self.owner.get((hop.config_id, hop.hop - 1))
            if owner is None:
                continue
            key = (hop.config_id, hop.hop - 1)
            if time.monotonic() - self.waited_since.get(key, time.monotonic()) > LOOK_SECONDS:
                self.waited_since[key] = time.monotonic()  # looked up now: again after LOOK_SECONDS
                if self.chains.before(hop.config_id, hop.hop, look=True) is not None:
                    log.info("%s: its input's record is in the store, though no marker named it", hop.label)
                    continue
            gone = self._peer(owner, now).gone(now, self.wait)
            # the peer may have committed the hop just before it stopped: its status is written after its records
            if gone is not None and self.chains.before(hop.config_id, hop.hop, look=True) is None:
                why, for_good = gone
                self.pending.remove(hop)
                self.given_up[hop.config_id, hop.hop] = hop
                self.looked_at[hop.config_id, hop.hop] = time.monotonic()
                self.result.untrained[hop.label] = why
                if for_good:
                    self.for_good.add(hop.label)
                log.error("%s: given up, %s", hop.label, why)

    def _take_back(self) -> None:
        """A hop given up is taken back when its input comes after all (its slot was late, or hung and
        retried) or the configuration failed meanwhile; then its block need not fail. In a search that
        decides as it goes (ASHA), whose slots never end while a configuration is in flight, a hop whose
        input will never come (its slot ended for good) fails its configuration instead, with the cause, and
        the search goes on: else the search waited for it for ever."""
        now = time.time()
        for key, hop in list(self.given_up.items()):
            # its input may be committed with a marker no listing shows (one that landed after a later name):
            # looked up in the store every LOOK_SECONDS, as a waiting hop's is, or an ASHA slot kept the hop
            # given up for ever (the slot protocol's simulation, seeds 136875 and 212597)
            look = time.monotonic() - self.looked_at.get(key, 0.0) > LOOK_SECONDS
            if look:
                self.looked_at[key] = time.monotonic()
            if self.chains.before(hop.config_id, hop.hop, look=look) is not None:
                log.info("%s: its input came after all; taken back", hop.label)
                self.pending.append(hop)  # a failed configuration's hop is dropped (and settled) as any other
                self.pending.sort(key=lambda h: (-h.weight, h.order))
            elif self.more is not None and (hop.label in self.for_good or self._gone_for_good(hop, now)):
                self._fail_for_good(hop.config_id, hop.hop, hop.shard,
                                    f"was given up: {self.result.untrained[hop.label]}")
            else:
                continue
            del self.given_up[key]
            self.looked_at.pop(key, None)
            self.result.untrained.pop(hop.label, None)
            self.for_good.discard(hop.label)

    def _fail_dead_legs(self) -> None:
        """ASHA: a job in flight whose next hop is on a slot that ended for good (failed for good, or died
        on its last try) fails there, with the cause. When that hop is its leg's last, no slot waits for
        it, and the search would wait for the job for ever (found by the slot protocol's simulation,
        seed 539). Checked at most once a heartbeat, when the slot has nothing ready."""
        now = time.time()
        if now - self.legs_checked_at < HEARTBEAT_SECONDS:
            return
        self.legs_checked_at = now
        shards = self.more.shards
        for leg, t in self.more.ledger.next_hops():
            owner = ((leg.offset + t) % shards, leg.slot)
            if owner == self.slot_of:
                continue
            gone = self._peer(owner, now).gone(now, self.wait)
            if gone is None or not gone[1]:
                continue
            if t > leg.first:
                before = self.layout.hop_record_uri(leg.config_id, t - 1)
                if self.layout.store.exists(before) and HopRecord.read(self.layout.store, before).status != "ok":
                    continue  # failed already: its completion is on its way to the next decision
            self._fail_for_good(leg.config_id, t, owner[0], f"never trained: {gone[0]}")

    def _fail_for_good(self, config_id: str, t: int, shard: int, why: str) -> None:
        """ASHA: record configuration ``config_id`` failed at its hop ``t`` (on ``shard``), which will never
        train; the search goes on without it."""
        failure = record_failure(self.layout, Assignment(config_id, t - 1, None), t=t, shard=shard,
                                 shards=self.run.schedule.shards, where=self.where,
                                 error=TrainingError(f"its hop {t} on shard {shard} {why}"))
        self.marks.mark(failure)
        self.result.failed.append(failure)
        self.chains.learn(failure)
        log.error("%s t=%d: its hop %s; %s is recorded failed and the search goes on", config_id, t, why, config_id)

    def _gone_for_good(self, hop: BlockHop, now: float) -> bool:
        owner = self.owner.get((hop.config_id, hop.hop - 1))
        gone = None if owner is None else self._peer(owner, now).gone(now, self.wait)
        return gone is not None and gone[1]

    def _peer(self, owner: tuple[int, int], now: float) -> Peer:
        peer = self.peers.get(owner)
        if peer is None:
            peer = self.peers[owner] = Peer(self.layout, self.status.block, *owner, began=self.began, since=now)
        return peer
