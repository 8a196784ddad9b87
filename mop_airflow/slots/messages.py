"""What a shard slot's state machine (:mod:`~mop_airflow.slots.machine`) hears and says.

The data of its events (a state, a hop record, a peer's status, what the store says of a hop), the
actions it asks its driver to carry out, and the :class:`Rules` a test may switch. Plain frozen
dataclasses: no I/O, no Airflow, no Keras, as h11 keeps its events apart from its connection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

HEARTBEAT = 5.0  # slot_status.HEARTBEAT_SECONDS: a peer's status is read at most this often
STATES_HELD = 2  # trained hops waiting for their commit, at most (shard_loop.STATES_HELD)
ASHA_EVERY = 0.05  # asha_source.EVERY_LOCAL: an idle slot takes a decision at most this often
NEVER = math.inf
# The seconds two hosts' clocks may differ by that the protocol absorbs at no cost: a peer's status is
# stamped with its own host's clock and read against the reader's (PeerView). Skew past it costs at most
# the wait bound (an end stamped too early is taken for an earlier try's, and counts once it has stood
# for the wait bound), and below the wait bound less a heartbeat it judges no live slot dead.
CLOCK_SKEW = 1.0
READ_AGAIN = 1.0  # a record whose marker was listed but which one reader cannot read yet: read again after


@dataclass(frozen=True)
class State:
    """What a configuration's hop ``t`` left (``t``: the hop before the next), as an Assignment says it."""

    config_id: str
    t: int
    checkpoint_sha256: Any = None


@dataclass(frozen=True)
class Record:
    """A hop record's fields the protocol reads (``HopRecord``'s names)."""

    config_id: str
    t: int
    shard: int
    status: str = "ok"
    input_sha256: Any = None
    checkpoint_sha256: Any = None
    error: str | None = None
    dropped_after: int | None = None
    try_number: int = 1


def state_after(record: Any) -> State:
    return State(record.config_id, record.t, record.checkpoint_sha256)


def label_of(hop: Any) -> str:
    """How the machine names a hop in what it says (:class:`End`'s ``untrained`` and ``for_good``)."""
    return f"{hop.config_id} t={hop.hop}"


def priority(hop: Any) -> tuple:
    """The order a slot takes its ready hops in: the plan's priority weight, heaviest first, then its order."""
    return -hop.weight, hop.order


@dataclass(frozen=True)
class PeerStatus:
    """A slot's status file (``SlotStatus``'s fields the waiting slot reads)."""

    try_number: int
    state: str  # running, done, yielded, failed
    heartbeat: float
    progress: int = 0
    final: bool = False
    last_try: bool = False
    error: str | None = None


def died_on_last_try(status: Any, now: float, wait: float) -> bool:
    """Whether ``status`` (a ``SlotStatus``, or a :class:`PeerStatus`) is a try that died with no retry to
    follow: "running" on its last try, its heartbeat silent for longer than ``wait``. A try killed (by its
    watchdog, or with its worker) writes no last word, and Airflow runs no callback for a task process
    killed under a live supervisor; its heartbeat thread stops with it, and no retry writes again. A
    live try heartbeats every few seconds whatever it does, and its watchdog kills it within the stall
    bound, shorter than the wait bound; the seconds between two machines' clocks are far below it."""
    return (status is not None and status.state == "running" and status.last_try
            and now - status.heartbeat > wait)


@dataclass(frozen=True)
class Facts:
    """What the store says of hop ``t`` for ``committed()``: its record (None: not there), whether that
    record's checkpoint is still there, and whether hop ``t + 1``'s record is."""

    record: Any = None
    checkpoint_there: bool = False
    next_there: bool = False


# Actions: what the driver does next, then it reports back and asks again.
@dataclass(frozen=True)
class Write:  # in order, each (record, how): "write" it then its marker, "settle" the same unless a record is
    records: tuple  # there (an earlier try's stays), "mark": its marker only. Fenced (Rules.fence), "write" and
    # "settle" create the record only where none is, and a record found there goes back as lost()


def write_step(how: str, fence: bool) -> str:
    """How the driver carries out one ``(record, how)`` of a :class:`Write`: "mark" (its marker only),
    "create" (fenced: the record created only where none is, then its marker; a record found there goes
    back as ``lost()``, with the record that stands unless the write was a settle, which never takes one
    over), "unless there" (an unfenced settle: written, then marked, only where no record is) or "write"
    (written, then marked). The shard loop and the slot simulation both ask it."""
    if how == "mark":
        return "mark"
    if fence:
        return "create"
    return "unless there" if how == "settle" else "write"


def takes_standing(how: str) -> bool:
    """Whether a fenced create that found a record there hands that record to ``lost()``: not a settle's."""
    return how != "settle"


@dataclass(frozen=True)
class Read:  # read the records these markers name (``(config_id, t)``, listed earlier) -> read()
    keys: tuple


@dataclass(frozen=True)
class ReadPeers:  # read these slots' status files -> peer_status()
    owners: tuple


@dataclass(frozen=True)
class Look:  # is the record of each hop's input there though no marker named it? -> looked()
    hops: tuple  # ((hop, why, for_good), ...): given up unless it is


@dataclass(frozen=True)
class Check:  # did an earlier try commit these hops? -> checked()
    members: tuple  # ((hop, state), ...)


@dataclass(frozen=True)
class Train:  # train these hops (one fused program when several) -> trained_ok() / trained_failed()
    members: tuple
    ahead: tuple = ()  # ((hop, state), ...): the next ready hop, whose input the driver may read meanwhile


@dataclass(frozen=True)
class Decide:  # ASHA: nothing ready, take the search's next decision -> asha_hops()
    pass


@dataclass(frozen=True)
class Wait:  # until ``until`` or anything arrives; ``commit``: for this slot's own commit
    until: float
    commit: bool = False


@dataclass(frozen=True)
class Yield:  # give the pool slot back (SlotYielded); the task comes again with the same try
    why: str


@dataclass(frozen=True)
class Stopped:  # asked to stop (SIGTERM): its commits and writes are done; the task ends, a retry trains the rest
    why: str


@dataclass(frozen=True)
class Superseded:  # a later try of this slot runs (this one was taken for dead): write nothing more, say nothing
    why: str


@dataclass(frozen=True)
class End:  # the block is over for this slot: done, or incomplete (BlockIncompleteError)
    untrained: Mapping[str, str]
    for_good: frozenset
    # the slots ((shard, slot)) its hops waited for that never started (no worker on their queue, no free
    # slot in their pool): a last try's failure ends their tasks too, or the run waited for them for ever
    absent: frozenset = frozenset()

    @property
    def done(self) -> bool:
        return not self.untrained


@dataclass(frozen=True)
class Rules:
    """The protocol's rules that a test may switch. The defaults are the rules the shard loop drives the
    machine with: ``settle_forward`` (a slot that drops a failed configuration's hops writes a record at
    its earliest one), ``mark_found``, ``look_after`` (shard_loop.LOOK_SECONDS), ``last_try_dies``
    (peers.PeerView) and ``asha_dead_legs`` (the driver's check of the legs in flight before an
    ASHA decision, dead_legs.DeadLegs._fail_dead_legs, which the simulation's world does as production
    does), ``yield_bound``, ``stale_ends``, ``absent_peers`` and ``read_again`` (issue 70: a slot that never
    starts, a final failure read late, a record one reader cannot read yet)."""

    settle_forward: bool = True
    mark_found: bool = True  # a retry marks a hop an earlier try committed but may not have marked
    look_after: float | None = 60.0  # look up the input of a hop waited for this long, peer alive or not
    # ... and of a hop given up, every look_after, until it is taken back (seeds 136875, 212597)
    look_given_up: bool = True
    # a retry looks up at once the inputs its hops wait for when it first waits: its earlier try may have
    # waited out a listing that lost the marker already (off: the retry waited look_after again, seed 403972)
    retry_looks: bool = True
    # a slot started again after it gave its pool slot back asks the store of the hops it takes, as a retry
    # does: its earlier run of the same try may have committed one whose marker no listing shows, and it
    # trained it again from a checkpoint deleted since (off: seed 16628)
    yield_checks: bool = True
    # a peer "running" on its last try whose heartbeat stopped for the wait bound ended for good
    # (died_on_last_try): neither yielded to nor waited for, ASHA fails its given-up hops (seeds 544, 1581)
    last_try_dies: bool = True
    # ASHA's decisions fail a job whose next hop is on a slot that ended for good: when that is the
    # leg's last hop no slot waits for it, and the search waited for ever (seed 539)
    asha_dead_legs: bool = True
    # a slot that has given its pool slot back for the wait bound in all stops yielding: it keeps its pool
    # slot and waits as any slot does (off: it yielded for ever to a slot that never starts, issue 70)
    yield_bound: bool = True
    # an end (failed for good, done) a peer said before the waiting slot began counts once it has stood
    # for the wait bound with no later try (off: it was never for good, and ASHA hung, issue 70)
    stale_ends: bool = True
    # a peer that has not started (no status, yielded, or its retry not begun) for the wait bound is named
    # with its pool and queue; ASHA ends the waiting try then (off: ASHA waited for it for ever)
    absent_peers: bool = True
    # a slot's markers are left one at a time, in the order named (CommitLog's lock held through the PUT):
    # off, a marker named earlier could land after a later one and no poll listed it (seed 30812 waited
    # for its look-up a minute; seed 1909 for ever, before look_after). The slot simulation's world reads it
    marks_in_order: bool = True
    # a record whose marker was listed but which this reader cannot read yet is read again a second later
    # (off: a read of it fails the try, as a StoreError did)
    read_again: bool = True
    # writes fenced by try: every record is created only where none is (a copy that finds another's keeps
    # it, learns it and marks it), a checkpoint never replaces another, and a try that lists a marker of a
    # later try of its own slot (it was paused or cut off, and Airflow runs its retry) writes nothing more
    fence: bool = True
    # a train task lost on its last try (its worker or host gone: Airflow fails it when its heartbeat stops)
    # runs its failure callback (operators/train.end_block_after_final_failure), which fails its block's
    # never-started tasks when no slot of the block lives on to (off: the run waited for them for ever)
    lost_ends_block: bool = True


def silent_on_last_try(status: Any, now: float, wait: float) -> bool:
    """Whether ``status`` is a last try "running" whose heartbeat has missed beats (three, and the clocks'
    skew) and is not yet judged dead (:func:`died_on_last_try`): it may have been killed, or be late."""
    return (status is not None and status.state == "running" and status.last_try
            and now - status.heartbeat > 3 * HEARTBEAT + CLOCK_SKEW and not died_on_last_try(status, now, wait))


def never_started(status: Any) -> bool:
    """Whether a slot whose status says ``status`` has not started as far as its block can tell: no
    status, a yield, or a failure a retry follows (its task waits in Airflow). A slot running (even one
    whose try died and whose retry follows: its "running" stays), done or failed for good has."""
    return status is None or (status.state in ("yielded", "failed") and not status.final)


def ended_or_never_started(statuses: Iterable[Any], now: float, wait: float) -> bool:
    """Whether no slot of these statuses may still need a record from another: each has ended its block
    (done, failed for good, or died on its last try: :func:`died_on_last_try`, judged at ``now`` against
    the wait bound) or never started. The last slot of a block to end sees this, and ends the slots that
    never started and had nothing left to do (:meth:`~mop_airflow.slots.machine.SlotMachine.
    unneeded_slots`): before, a slot still running might wait for a failure they would have settled."""
    return all(never_started(s) or s.state == "done" or (s.state == "failed" and s.final)
               or died_on_last_try(s, now, wait) for s in statuses)
