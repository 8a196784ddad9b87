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
- a slot that waits for a slot which failed for good, or which showed no sign of life for
  ``MOP_SHARD_WAIT_SECONDS`` (600 s by default: longer than Airflow takes to find a lost task and
  retry it), gives those hops up, trains everything else, and fails naming the slot and the hops
  left untrained (:class:`~mop_airflow.errors.BlockIncompleteError`).

A block's slots wait for each other's hops, so they must all run at once. Two blocks that share
the shard pools at once (two selections, two DAGs) could each hold some of them and wait for the
rest; so a slot waiting while a slot of its block ranked before it (by shard, then slot) has not
started within ``MOP_SHARD_YIELD_SECONDS`` (30 s) gives its pool slot back (:class:`SlotYielded`;
the operator reschedules the task; what it committed stays) and tries again later. The block
holding the first shard's slot keeps every slot it gets, so it always gets the rest (with one slot
per shard; with several, two blocks may each hold a slot of the first shard and wait, up to the
wait bound).

Runs and is tested without Airflow; the shard operator maps Airflow's context onto :func:`run_slot`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection, Iterable, Sequence

from mop_airflow.errors import BlockIncompleteError
from mop_airflow.planning.schedule import DEFAULT_PRIORITY, priority_weight, shard_at
from mop_airflow.records import Assignment, BundleAssignment, HopRecord, Manifest, RunRecord, SlotStatus
from mop_airflow.records.layout import RunLayout
from mop_airflow.training.model_hop import (Where, read_hashed, record_failure, sha256_of, state_after, train_hop,
                                            with_digest)
from mop_airflow.training.session import WARM_MODELS, TaskSession

log = logging.getLogger(__name__)

WAIT_ENV = "MOP_SHARD_WAIT_SECONDS"
# How long a slot waits for a slot that shows no sign of life before it gives up the hops that
# depend on it. Longer than Airflow needs to find a lost task instance (its heartbeat timeout, 300 s
# by default) and start its retry (10 s, then 20 s).
WAIT_SECONDS = 600.0
HEARTBEAT_SECONDS = 5.0  # how often a slot refreshes its status while it lives
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


# Polling the store for committed hops: fast while hops arrive, backing off to the most when they
# don't. A local store's look is a stat, so it stays quick (a GPU hop of the 1 M-weight CNN takes a
# tenth of a second, and with as many configurations as shards each hop waits for another slot's
# commit); an object store's is a request, so it backs off further.
POLL_FIRST, POLL_MOST, POLL_MOST_REMOTE = 0.002, 0.05, 0.5
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
    bundle: int | None = None
    weight: int = 1
    order: int = 0

    @property
    def label(self) -> str:
        return f"{self.config_id} t={self.hop}"


def block_hops(classes: Sequence[Sequence[BundleAssignment]], *, shards: int, slots: int, start: int, end: int,
               relative: bool = False, rung_end: bool = False, priority: str = DEFAULT_PRIORITY,
               chain_end: int | None = None, shift: int = 0, ends: Collection[str] | None = None) -> list[BlockHop]:
    """Every hop of a block, on every shard slot, in the plan's order.

    ``classes[o]`` lists offset class ``o``'s configurations (as bundles), each with the state it
    enters the block in. Its hop at step ``t`` (``start <= t < end``) is on shard ``(o + t) mod shards``;
    with ``relative`` the steps count within the block and the configuration's own hop follows its
    state (a search decided between blocks); else its global hop is ``shift + t`` (a run continuing a
    search renders its block's steps from 0). Configuration ``i`` of the block (counted over the
    classes in order) trains on slot ``i mod slots`` of every shard. ``rung_end``: the block's last
    hop ends a rung and evaluates. The priority rule ranks a slot's ready hops as Airflow ranked hop
    tasks (:func:`~mop_airflow.planning.schedule.priority_weight`; ``chain_end`` is where the search
    ends, by default the block's end).
    """
    hops: list[BlockHop] = []
    index = 0
    for offset, bundles in enumerate(classes):
        for bundle in bundles:
            for assignment in bundle.assignments:
                slot = index % max(1, slots)
                index += 1
                for step in range(start, end):
                    hops.append(BlockHop(
                        config_id=assignment.config_id, offset=offset, step=step,
                        shard=shard_at(offset, step, shards), slot=slot,
                        hop=assignment.t + 1 + (step - start) if relative else shift + step,
                        rung_end=rung_end and step == end - 1 and (ends is None or assignment.config_id in ends),
                        start=assignment if step == start else None,
                        bundle=bundle.bundle, weight=priority_weight(priority, step, chain_end or end),
                        order=len(hops)))
    return hops


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
             stop: threading.Event | None = None, more: Any = None) -> SlotResult:
    """Train the hops of ``hops`` (the whole block) that fall on ``(shard, slot)``, or ``mine``.

    ``mine`` lets one process train more than its slot: every hop of the block when tasks run one
    at a time (``dag.test()``), which can then never wait for another process. ``block`` names the
    block in the slots' status files. ``fatal(exc)``: errors that end the task instead of failing
    one configuration (the store going away, ``search.fail_fast``); ``final(exc)``: whether no retry
    follows such an error (then the slots waiting for this one stop waiting). ``on_hop(record)`` is
    called as each hop is committed (the task's log). Raises :class:`SlotYielded` when the slot gives
    its pool slot back (``yield_seconds``, by default ``MOP_SHARD_YIELD_SECONDS``; never with ``mine``).
    ``stop`` set (the task's ``on_kill``): the slot ends after its hop in progress and its commits,
    raising :class:`SlotStopped`. ``more``: where hops decided while the block trains come from (an
    ASHA search, :class:`~mop_airflow.training.asha_source.AshaSource`): the slot asks it for new hops
    as it polls, and to decide when it has nothing ready, until it says the search has ended.
    """
    own = list(mine) if mine is not None else [h for h in hops if h.shard == shard and h.slot == slot]
    loop = _Loop(layout, run, manifest, hops, own, block=block, shard=shard, slot=slot, cache_dir=cache_dir,
                 where=where, fatal=fatal, session=session, on_hop=on_hop,
                 wait=wait_seconds if wait_seconds is not None else float(os.environ.get(WAIT_ENV) or WAIT_SECONDS),
                 give_back=None if mine is not None else (
                     yield_seconds if yield_seconds is not None else float(os.environ.get(YIELD_ENV) or YIELD_SECONDS)),
                 stop=stop, more=more)
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
    if result.untrained:
        error = BlockIncompleteError(shard, slot, result.untrained)
        loop.status.stop("failed", final=True, error=str(error)[:1000])
        raise error
    loop.status.stop("done")
    return result


class _Loop:
    def __init__(self, layout: RunLayout, run: RunRecord, manifest: Manifest, hops: Sequence[BlockHop],
                 own: list[BlockHop], *, block: str, shard: int, slot: int, cache_dir: str, where: Where,
                 fatal: Callable[[BaseException], bool], session: TaskSession | None,
                 on_hop: Callable[[HopRecord], object] | None, wait: float, give_back: float | None,
                 stop: threading.Event | None = None, more: Any = None) -> None:
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
        self.chains = _Chains(layout, [h for h in hops if h.start is not None])
        self.status = _Status(layout, block, shard, slot, where, left=len(self.pending))
        self.result = SlotResult()
        self.peers: dict[tuple[int, int], _Peer] = {}
        self.more = more
        self.slot_of = (shard, slot)
        self.alone = give_back is None  # this process trains every slot's hops (dag.test())

    def train_all(self) -> SlotResult:
        result = self.result
        self.began = time.time()
        self.status.start()
        with ThreadPoolExecutor(1, thread_name_prefix="mop-commit") as writer, \
                ThreadPoolExecutor(1, thread_name_prefix="mop-read-ahead") as reader, \
                ThreadPoolExecutor(1, thread_name_prefix="mop-hash") as hasher:
            commits: list[tuple[BlockHop, Future]] = []
            ahead: dict[str, Future] = {}
            poll = POLL_FIRST
            local = self.layout.store.protocol == "file"
            while self.pending or commits or (self.more is not None and not self.more.ended):
                if self.stop.is_set():
                    self._settle(commits, block=True, every=True)
                    raise SlotStopped(f"asked to stop with {len(self.pending)} hop(s) left; the {len(result.trained)} "
                                      "committed stay, and a retry trains the rest")
                self._settle(commits, block=False)
                if self.more is not None:
                    self._extend(self.more.new_hops())
                ready, waiting = self._ready()
                if not ready:
                    if commits:  # its next hop waits for this slot's own commit, or for another slot's: whichever comes
                        wait_for([commits[0][1]], timeout=poll)
                        if not local:  # a look is a request there
                            poll = min(poll * 2, POLL_MOST_REMOTE)
                        continue
                    if self.more is not None and not self.more.ended:  # nothing ready: what trains next?
                        self.more.idle()
                        self._extend(self.more.new_hops())
                        if self._ready()[0]:
                            continue
                    elif not waiting:
                        break
                    self._give_up(waiting)
                    if self.pending or self.more is not None:
                        self.stop.wait(poll)  # a stop wakes the slot at once
                        result.waited += poll
                        poll = min(poll * 2, POLL_MOST if local else POLL_MOST_REMOTE)
                    continue
                poll = POLL_FIRST
                hop, state = ready[0]
                for _, later in ready[1:2]:  # read and hash the next ready model's checkpoint while this one trains
                    if later.checkpoint and later.checkpoint not in ahead:
                        # not tallied on that thread: the hop that takes it counts it (store.bytes_read
                        # deltas are a hop's own reads)
                        ahead[later.checkpoint] = reader.submit(read_hashed, self.layout.store, later.checkpoint,
                                                                tally=False)
                self.pending.remove(hop)
                # a trained hop holds its taken state (on a GPU, in its memory) until its commit packs it:
                # at most STATES_HELD at once, so a store slower than training slows the slot instead
                if len(commits) >= STATES_HELD:
                    self._settle(commits, block=True)
                trained = self._train(hop, state, ahead, hasher)
                if trained is not None:
                    commits.append((hop, writer.submit(trained.commit)))
            self._settle(commits, block=True, every=True)
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
        later hops. Only each configuration's earliest pending hop is looked up in the store (its later
        ones cannot be ready before it): one look per waiting configuration, not per hop."""
        earliest: dict[str, int] = {}
        for hop in self.pending:
            earliest[hop.config_id] = min(earliest.get(hop.config_id, hop.hop), hop.hop)
        ready, waiting, failed = [], [], {}
        for hop in self.pending:
            if hop.hop != earliest[hop.config_id]:
                continue
            state = self.chains.before(hop)
            if isinstance(state, HopRecord):
                failed[hop.config_id] = state
            elif state is None:
                waiting.append(hop)
            else:
                ready.append((hop, state))
        for hop in [h for h in self.pending if h.config_id in failed]:
            record = failed[hop.config_id]
            self.pending.remove(hop)
            self.result.dropped.append(hop.label)
            log.info("%s: dropped, %s %s at hop %d", hop.label, hop.config_id, record.status, record.t)
        waiting += [h for h in self.pending if h.hop != earliest[h.config_id] and h.config_id not in failed]
        return ready, waiting  # in the pending hops' order: by priority

    def _train(self, hop: BlockHop, state: Assignment, ahead: dict[str, Future], hasher: ThreadPoolExecutor) -> Any:
        """Train one hop (or find it committed by an earlier try); returns what to commit, or None."""
        layout, result = self.layout, self.result
        earlier = committed(layout, state, hop.hop)
        if earlier is not None:
            result.committed.append(hop.label)
            if earlier.status != "ok":
                result.failed.append(earlier)
            self.chains.learn(earlier)
            log.info("%s: already committed by try %d of %s; not trained again", hop.label, earlier.try_number,
                     earlier.task_id or "an earlier task")
            return None
        taken = time.time()
        self.status.training = hop.label
        where = replace(self.where, started_at=taken)

        def read(uri: str) -> tuple[bytes, Callable[[], str]]:
            future = ahead.pop(uri, None)
            if future is None:  # hashed on another thread (hashlib lets go of the GIL) while the bytes are decoded
                data = layout.store.read_bytes(uri)
                return data, hasher.submit(sha256_of, data).result
            data, sha256 = future.result()
            layout.store.bytes_read += len(data)
            return with_digest(data, sha256)

        log.info("%s on shard %d from %s", hop.label, hop.shard, state.checkpoint or "its initial weights")
        try:
            return train_hop(layout, self.run, self.manifest, state, t=hop.hop, shard=hop.shard,
                             rung_end=hop.rung_end, cache_dir=self.cache_dir, where=where, session=self.session,
                             bundle=hop.bundle, read_checkpoint=read)
        except Exception as exc:
            if self.fatal(exc):
                raise
            self.session.forget(self.run.config(hop.config_id))
            failure = record_failure(layout, state, t=hop.hop, shard=hop.shard, shards=self.run.schedule.shards,
                                     error=exc, where=where)
            result.failed.append(failure)
            self.chains.learn(failure)
            log.exception("%s %s; its remaining hops are dropped, the other configurations go on", hop.label,
                          failure.status)
            return None
        finally:
            self.status.training = None

    def _settle(self, commits: list[tuple[BlockHop, Future]], *, block: bool, every: bool = False) -> None:
        """Take the finished commits (``block``: wait for the oldest, ``every``: for all); a commit
        that failed (the store went away) fails the task."""
        while commits and (commits[0][1].done() or block):
            hop, future = commits.pop(0)
            record = future.result()
            self.result.trained.append(record)
            self.chains.learn(record)
            self.status.hop_done()
            if self.on_hop is not None:
                self.on_hop(record)
            if not every:
                block = False

    def _give_up(self, waiting: list[BlockHop]) -> None:
        """Drop the waiting hops whose input comes from a slot that failed for good or shows no sign of
        life; give the pool slot back when nothing trained yet and a slot ranked before this one has
        not started."""
        now = time.time()
        self.status.beat()
        if self.give_back is not None and now - self.began > self.give_back:
            for owner in self.before:
                peer = self.peers.setdefault(owner, _Peer(self.layout, self.status.block, *owner, began=self.began,
                                                          since=now))
                if not peer.started(now):
                    raise SlotYielded(f"shard {owner[0]} slot {owner[1]} of this block has not started within "
                                      f"{self.give_back:.0f} s: this slot gives its pool slot back and tries again "
                                      "later, so a block that holds the shards before it can finish")
        for hop in waiting:
            owner = self.owner.get((hop.config_id, hop.hop - 1))
            if owner is None:
                continue
            peer = self.peers.setdefault(owner, _Peer(self.layout, self.status.block, *owner, began=self.began,
                                                      since=now))
            why = peer.gone(now, self.wait)
            # the peer may have committed the hop just before it stopped: its status is written after its records
            if why is not None and self.chains.before(hop) is None:
                self.pending.remove(hop)
                self.result.untrained[hop.label] = why
                log.error("%s: given up, %s", hop.label, why)


def committed(layout: RunLayout, state: Assignment, t: int) -> HopRecord | None:
    """Hop ``t`` as an earlier try left it, when that try started from ``state``: a failure, or a
    commit (its record written, and its checkpoint there, or already taken on by the next hop)."""
    uri = layout.hop_record_uri(state.config_id, t)
    store = layout.store
    if not store.exists(uri):
        return None
    record = HopRecord.read(store, uri)
    if record.input_sha256 != state.checkpoint_sha256:
        return None  # it started from another state (a run cleared after its data or code changed)
    if record.status != "ok" or (record.checkpoint and store.exists(record.checkpoint)):
        return record
    return record if store.exists(layout.hop_record_uri(state.config_id, t + 1)) else None


class _Chains:
    """Each configuration's state before each of its hops, followed through the hop records in the
    store: a record counts only when it started from the state the one before it left."""

    def __init__(self, layout: RunLayout, firsts: Iterable[BlockHop]) -> None:
        self.layout = layout
        # configuration -> global hop -> the state after it (verified along the chain from the block's start)
        self.states: dict[str, dict[int, Assignment]] = {h.config_id: {h.start.t: h.start} for h in firsts
                                                         if h.start is not None}
        self.failed: dict[str, HopRecord] = {}

    def learn(self, record: HopRecord) -> None:
        """A hop this process committed or found committed."""
        if record.status != "ok":
            self.failed[record.config_id] = record
        else:
            self.states.setdefault(record.config_id, {})[record.t] = state_after(record)

    def before(self, hop: BlockHop) -> Assignment | HopRecord | None:
        """The state hop ``hop`` starts from; a failure record when the configuration failed before
        it; None while the hop before it is not committed."""
        if hop.start is not None:
            return hop.start
        cid = hop.config_id
        failed = self.failed.get(cid)
        if failed is not None and failed.t < hop.hop:
            return failed
        states = self.states.get(cid)
        if not states:
            return None
        if hop.hop - 1 in states:
            return states[hop.hop - 1]
        known = states[max(states)]
        store = self.layout.store
        while known.t < hop.hop - 1:
            uri = self.layout.hop_record_uri(cid, known.t + 1)
            if not store.exists(uri):
                return None
            record = HopRecord.read(store, uri)
            if record.input_sha256 != known.checkpoint_sha256:
                return None  # left by an earlier run from another state: its hop will be trained again
            if record.status != "ok":
                self.failed[cid] = record
                return record
            known = states[record.t] = state_after(record)
        return known if known.t == hop.hop - 1 else None


class _Status:
    """This slot's :class:`~mop_airflow.records.SlotStatus`, refreshed by a thread while the process lives."""

    def __init__(self, layout: RunLayout, block: str, shard: int, slot: int, where: Where, *, left: int) -> None:
        self.layout, self.block, self.shard, self.slot, self.where = layout, block, shard, slot, where
        self.uri = layout.slot_status_uri(block, shard, slot)
        self.trained = 0
        self.left = left
        self.training: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = 0.0

    def start(self) -> None:
        self.write("running")
        self._thread = threading.Thread(target=self._beat_forever, name="mop-slot-heartbeat", daemon=True)
        self._thread.start()

    def hop_done(self) -> None:
        self.trained += 1
        self.left -= 1

    def beat(self) -> None:
        if time.time() - self._last >= HEARTBEAT_SECONDS:
            self.write("running")

    def _beat_forever(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.write("running")
            except Exception:  # noqa: BLE001 - a missed heartbeat is retried; the hops' own writes report the store
                log.warning("could not refresh the status of shard %d slot %d", self.shard, self.slot, exc_info=True)

    def stop(self, state: str, *, final: bool = False, error: str | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_SECONDS)
        try:
            self.write(state, final=final, error=error)
        except Exception:  # noqa: BLE001 - the task's own error is the one to report
            log.warning("could not record shard %d slot %d as %s", self.shard, self.slot, state, exc_info=True)

    def write(self, state: str, *, final: bool = False, error: str | None = None) -> None:
        self._last = time.time()
        SlotStatus(block=self.block, shard=self.shard, slot=self.slot, state=state, heartbeat=self._last,
                   try_number=self.where.try_number, final=final, host=self.where.host or socket.getfqdn(),
                   pid=os.getpid(), task_id=self.where.task_id, trained=self.trained, left=max(0, self.left),
                   training=self.training, error=error).write(self.layout.store, self.uri)


class _Peer:
    """Another slot of the block, as its status file shows it; read at most once per heartbeat."""

    def __init__(self, layout: RunLayout, block: str, shard: int, slot: int, *, began: float, since: float) -> None:
        self.layout, self.shard, self.slot = layout, shard, slot
        self.uri = layout.slot_status_uri(block, shard, slot)
        self.began = began - 1.0  # when the waiting slot's task began (a second for clocks apart)
        self.alive_at = since  # the last sign of life (or when the waiting slot began to wait for it)
        self.read_at = 0.0
        self.status: SlotStatus | None = None
        self.seen = False  # it ran since the waiting slot's task began

    def started(self, now: float) -> bool:
        """Whether the peer has run (or ended its block) since the waiting slot's task began: a slot
        that gave its pool slot back has not."""
        self._refresh(now, HEARTBEAT_SECONDS)
        self.seen = self.seen or (self.status is not None and self.status.state != "yielded"
                                  and self.status.heartbeat >= self.began)
        return self.seen

    def _refresh(self, now: float, every: float) -> None:
        if now - self.read_at >= every:
            self.read_at = now
            if self.layout.store.exists(self.uri):
                status = SlotStatus.read(self.layout.store, self.uri)
                if status.state == "running":
                    self.alive_at = max(self.alive_at, status.heartbeat)
                # an end said before the waiting slot's task began may be an earlier try's of a run cleared since:
                # only its heartbeat counts then, and the peer's new try says more soon
                self.status = status if status.state == "running" or status.heartbeat >= self.began else None

    def gone(self, now: float, wait: float) -> str | None:
        """Why the hops this slot waits for from the peer will never come, or None while they may."""
        self._refresh(now, min(HEARTBEAT_SECONDS, wait / 2))
        status = self.status
        name = f"shard {self.shard} slot {self.slot}"
        if status is not None and status.state == "failed" and status.final:
            return (f"{name} failed for good on its try {status.try_number} "
                    f"({(status.error or 'no error recorded').splitlines()[0]})")
        if status is not None and status.state == "done":
            return f"{name} finished its block without this hop's input (it lost it too)"
        if now - self.alive_at > wait:
            return f"{name} showed no sign of life for {now - self.alive_at:.0f} s (the bound is {wait:.0f} s)"
        return None
