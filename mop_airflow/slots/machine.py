"""One shard slot's decisions in a block, as a pure state machine (sans-IO).

The rules of :mod:`~mop_airflow.slots.driver` (what to train next, when to wait, settle a failed
configuration forward, give a hop up or take it back, yield the pool slot, end), with every read, write,
thread and clock left to a driver: :meth:`SlotMachine.decide` takes the time and returns one action;
what the action found, and whatever arrived meanwhile (markers, commits, peers' statuses, ASHA's
decisions), comes back as events. Deterministic: the same events give the same actions. So
:mod:`~slot_sim` can run many slots on a virtual clock against a store that
injects faults, and replay any schedule from its seed, as FoundationDB and TigerBeetle check theirs.

It is the production rules, not a copy of them: the shard loop (:mod:`~mop_airflow.slots.driver`)
is a driver of this machine that carries its actions out with the store, its threads and the clock,
as the simulation's world does on a virtual clock; so production takes exactly the decisions the
simulation checks. Hops are anything shaped like :class:`~mop_airflow.planning.placement.BlockHop`
(``config_id``, ``hop``, ``shard``, ``slot``, ``weight``, ``order``, ``start``); records like
``HopRecord`` (the fields of :class:`Record`) and states like ``Assignment`` (``config_id``, ``t``,
``checkpoint_sha256``), the state a record leaves given by ``state_after``. :class:`Rules` switches a rule off (or a proposed one on) to
show that the simulation fails without it. No Airflow, no Keras, no store.

The machine's decisions live in modules named after them, mixed into :class:`SlotMachine`, whose
state they share: :mod:`~mop_airflow.slots.inputs` (whether a hop's input is committed),
:mod:`~mop_airflow.slots.outcomes` (what became of a hop: commits, failures, fenced writes, an earlier
try's), :mod:`~mop_airflow.slots.waiting` (reading peers, yielding, giving up, looking up, taking back),
:mod:`~mop_airflow.slots.asha_rules` (ASHA's) and :mod:`~mop_airflow.slots.peers` (how a peer is
judged). This module keeps the loop that calls them (:meth:`SlotMachine.decide`) and what the machine
is made with; the names the slot protocol used from here are still here.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from mop_airflow.slots.asha_rules import AshaRules
from mop_airflow.slots.block_end import BlockEnd
from mop_airflow.slots.inputs import Inputs
from mop_airflow.slots.messages import (  # noqa: F401 - the machine's words, re-exported
    ASHA_EVERY, CLOCK_SKEW, HEARTBEAT, NEVER, READ_AGAIN, STATES_HELD, Check, Decide, End, Facts, Look, PeerStatus,
    Read, ReadPeers, Record, Rules, State, Stopped, Superseded, Train, Wait, Write, Yield, died_on_last_try,
    priority, state_after, takes_standing, write_step)
from mop_airflow.slots.outcomes import Outcomes
from mop_airflow.slots.peers import PeerView  # noqa: F401 - how a slot judges a peer, re-exported
from mop_airflow.slots.waiting import Waiting


def _failure(state: Any) -> bool:
    """Whether what a hop starts from is a failure record (a state has no status)."""
    return getattr(state, "status", "ok") != "ok"


class SlotMachine(Inputs, Outcomes, Waiting, AshaRules, BlockEnd):
    """Slot ``(shard, slot)``'s try ``try_number`` of a block whose hops are ``hops`` (every slot's; its own
    are those on it, or ``own``: every hop of the block when one process trains them all, ``dag.test()``).
    ``partners``: fused groups, ``(config_id, hop) -> configurations``; ``asha``: the hops come from
    decisions as they are taken (:meth:`asha_hops`) on ``shards`` shards of ``slots`` slots (``alone``:
    every slot's are this process's); ``give_back``: seconds before a slot that took nothing from another
    yields to a slot ranked before it not started (None: never). ``state_after(record)``: the state a
    committed hop hands its configuration's next hop (production's carries the checkpoint's URI)."""

    def __init__(self, hops: Iterable[Any], *, shard: int, slot: int, try_number: int, began: float, wait: float,
                 give_back: float | None = None, partners: Mapping[tuple, frozenset] | None = None,
                 asha: bool = False, shards: int = 1, rules: Rules = Rules(),
                 yielding_since: float | None = None, own: Iterable[Any] | None = None, alone: bool = False,
                 slots: int = 1, state_after: Callable[[Any], Any] = state_after,
                 absent_wait: float | None = None) -> None:
        hops = list(hops)
        self.slot_of, self.try_number, self.began, self.wait = (shard, slot), try_number, began, wait
        self.give_back, self.partners, self.asha, self.rules = give_back, dict(partners or {}), asha, rules
        self.yielding_since = yielding_since  # when this task first gave its pool slot back, if it did
        # an earlier run of this task (a try before, or this try before it gave its pool slot back) may have
        # committed hops this one knows no marker of: it asks the store before training (Check)
        self.rerun = try_number > 1 or (yielding_since is not None and rules.yield_checks)
        self.alone, self.state_after = alone, state_after
        self.shape = (shards, slots)  # the block's shards and slots per shard
        # ASHA: how long a slot of the block may stay not started before this try fails for good naming it.
        # Its tries never end on a hop given up (a late slot's hops are taken back), so it waits the wait
        # bound of every try it has left at once: what a grid's slots wait over their tries
        self.absent_wait = wait if absent_wait is None else absent_wait
        self.pending = sorted((h for h in hops if (h.shard, h.slot) == self.slot_of) if own is None else own,
                              key=priority)
        self.owner = {(h.config_id, h.hop): (h.shard, h.slot) for h in hops}
        self.before = sorted({(h.shard, h.slot) for h in hops if (h.shard, h.slot) < self.slot_of})
        self.states: dict[str, dict[int, State]] = {}
        for h in hops:
            if h.start is not None:
                self.states.setdefault(h.config_id, {})[h.start.t] = h.start
        self.failed: dict[str, Any] = {}
        self.listed: set = set()  # hops whose markers were seen, their records not taken in yet
        self.records: dict[tuple, Any] = {}  # the record a seen marker names, once read (Read)
        self.unread_at: dict[tuple, float] = {}  # a listed marker's record this reader could not read yet: when
        self.known: set = set()  # every hop whose marker was seen (CommitPoller.known)
        self.given_up: dict[tuple, Any] = {}
        self.looked_at: dict[tuple, float] = {}  # a given-up hop's input: when it was last looked up
        self.clock = began  # the latest time decide() was given
        self.for_good: set = set()
        self.untrained: dict[str, str] = {}
        self.commits: list = []  # this slot's hops in the writer's hands, oldest first
        self.outbox: list = []
        self.taking: list | None = None  # [members, checked]: chosen and out of pending, not trained yet
        self.peers: dict[tuple, PeerView] = {}
        self.watched: set = set()
        self.waited_since: dict[tuple, float] = {}
        # a retry's first hops waited for count as waited for look_after: looked up at once
        self.waits_from: float | None = (began - rules.look_after - 1.0 if try_number > 1 and rules.retry_looks
                                         and rules.look_after is not None else None)
        self.joined = False  # it took a hop another slot handed it: the block runs, it keeps its pool slot
        self.ended, self.decide_due, self.decided_at = False, True, -NEVER
        self.gone_seen: frozenset = frozenset()  # ASHA: the slots judged ended for good so far
        self.others: list = []  # ASHA: every other slot of the block; those not seen started yet
        self.unstarted: list | None = None
        self.dropped: list = []  # (hop, failure): hops dropped after their configuration failed, in order
        self.ahead: list = []  # the ready hops after those taken: the next one's input may be read meanwhile
        # the slots whose markers tell this one's hops are ready (the previous shard's slot that trains the
        # same configurations; a leg's hops keep the deciding slot's index) and itself (an earlier try's)
        mine = {(h.shard, h.slot) for h in self.pending}
        if asha:
            self.polled = sorted({(s, k) for s in range(shards) for k in range(slots)} if alone
                                 else {self.slot_of, ((shard - 1) % shards, slot)})
        else:
            self.polled = sorted(mine | {self.owner[h.config_id, h.hop - 1] for h in self.pending
                                         if (h.config_id, h.hop - 1) in self.owner})
        self.wants_poll = True  # it waits for other slots' hops: list their markers
        self.idle = False  # and has nothing to train meanwhile
        self.superseded_by: int | None = None  # a later try of this slot that runs meanwhile (Rules.fence)
        self.stopping = False  # asked to stop (SIGTERM)

    # ----------------------------------------------------------------- events
    def flush(self) -> Write | None:
        """The writes still to do (the slot stops: what it learnt reaches the store first)."""
        out, self.outbox = tuple(self.outbox), []
        return Write(out) if out and self.superseded_by is None else None

    def later_try(self, try_number: int) -> None:
        """A marker that a later try ``try_number`` of this slot left since this try began was listed in this
        slot's own folder: Airflow took this try for dead (its host paused or cut off) and runs its retry.
        Fenced (Rules.fence), this copy writes nothing more and ends without a last word (:class:`Superseded`):
        the later try's status and records are the slot's."""
        if self.rules.fence and try_number > self.try_number:
            self.superseded_by = max(self.superseded_by or 0, try_number)

    def stop(self) -> None:
        """The slot is asked to stop (SIGTERM: its task's on_kill). It takes nothing more: it ends after the
        action in progress once the writer committed what it holds and what the slot learnt is written
        (a failed commit recorded), with :class:`Stopped`; its task's retry trains the rest."""
        self.stopping = True

    # ----------------------------------------------------------------- the loop
    def decide(self, now: float) -> Any:
        """The next action at ``now``: what to train, read, write or wait for."""
        self.clock = now
        if self.asha and not self.ended:
            self._judge_gone(now)
        if self.superseded_by is not None:
            self.outbox.clear()  # the later try writes what it finds; a copy taken for dead writes nothing more
            return Superseded(f"try {self.superseded_by} of shard {self.slot_of[0]} slot {self.slot_of[1]} runs "
                              f"since this try {self.try_number} began (this one was taken for dead: its host "
                              "paused or cut off): this copy writes nothing more and ends")
        if self.stopping:
            if self.commits:
                return Wait(NEVER, commit=True)
            if self.outbox:
                return self.flush()
            return Stopped(f"asked to stop with {len(self.pending) + len(self.taking[0] if self.taking else ())} "
                           "hop(s) left")
        if self.outbox:
            out = tuple(self.outbox)
            self.outbox.clear()
            return Write(out)
        if self.taking is not None:
            return self._take(now)
        if not (self.pending or self.commits or (self.asha and not self.ended)):
            return self._absent_at_end(now) or self._silent_at_end(now) or self._end()
        if self._absent_given_up(now):
            return self._end()
        step = self._ready(now)
        if not isinstance(step, tuple):
            return step
        ready, waiting = step
        self.idle = not ready
        if self.partners:  # a fused group trains whole, so its members train the same program whatever
            # order their inputs came in: none while a member waits at the same hop
            late = {(h.config_id, h.hop) for h in waiting}
            ready = [(h, s) for h, s in ready
                     if not any((c, h.hop) in late for c in self.partners.get((h.config_id, h.hop), ()))]
        if not ready:
            if self.commits:  # the next hop may wait for this slot's own commit
                return Wait(NEVER, commit=True)
            if self.asha and not self.ended:
                if self.decide_due and now - self.decided_at >= ASHA_EVERY:
                    self.decide_due, self.decided_at = False, now
                    return Decide()
            elif not waiting:
                return self._end()
            act = self._give_up(waiting, now)
            if act is not None:
                return act
            if self.pending or self.asha:
                return Wait(self._deadline(now))
            return self._end()
        hop, state = ready[0]
        group = self.partners.get((hop.config_id, hop.hop))
        members = [(h, s) for h, s in ready if h.config_id in group and h.hop == hop.hop] if group else [(hop, state)]
        self.joined = self.joined or hop.start is None
        for member, _ in members:
            self.pending.remove(member)
        self.ahead = [r for r in ready if r not in members][:1]
        self.taking = [members, False]
        return self._take(now)

    def _take(self, now: float) -> Any:
        members, checked = self.taking
        if len(self.commits) >= STATES_HELD:  # a store slower than training slows the slot instead
            return Wait(NEVER, commit=True)
        if not checked:
            # a retry asks the store (its earlier try may have died between a record and its marker)
            ask = [(h, s) for h, s in members if self.rerun or (h.config_id, h.hop) in self.known]
            if ask:
                return Check(tuple(ask))
        self.taking = None
        # all committed before: go on
        return Train(tuple(members), tuple(self.ahead)) if members else self.decide(now)

    def _ready(self, now: float) -> Any:
        """The pending hops whose input state is committed (in priority order), and those still waiting.
        A hop whose configuration failed before it, anywhere, is dropped, with the configuration's later
        hops. A listed marker's record is read when it names the hop a configuration waits for (its
        earliest pending one: its later ones cannot be ready before it)."""
        self.watched = set()
        if self.given_up:
            act = self._take_back(now)
            if act is not None:
                return act
        earliest: dict[str, int] = {}
        for h in self.pending:
            e = earliest.get(h.config_id)
            if e is None or h.hop < e:
                earliest[h.config_id] = h.hop
        act = self._unread(h for h in self.pending if h.hop == earliest[h.config_id])
        if act is not None:
            return act
        ready, waiting, failed = [], [], {}
        since, self.waited_since = self.waited_since, {}
        # a hop waited for counts from now, but a retry's first waits as if waited out (Rules.retry_looks)
        start = now if self.waits_from is None else self.waits_from
        self.waits_from = None
        for h in self.pending:
            if h.hop != earliest[h.config_id]:
                continue
            state = h.start or self._before(h.config_id, h.hop)
            if state is None:
                waiting.append(h)
                self.waited_since[h.config_id, h.hop - 1] = since.get((h.config_id, h.hop - 1), start)
            elif _failure(state):
                failed[h.config_id] = state
            else:
                ready.append((h, state))
        if failed:
            for h in [h for h in self.pending if h.config_id in failed]:
                self.pending.remove(h)
                self.dropped.append((h, failed[h.config_id]))
                if h.hop == earliest[h.config_id] and self.rules.settle_forward:
                    self._settle_dropped(h, failed[h.config_id])
        waiting += [h for h in self.pending if h.hop != earliest[h.config_id]]
        self.wants_poll = bool(waiting or self.given_up)
        if self.outbox:
            out = tuple(self.outbox)
            self.outbox.clear()
            return Write(out)
        return ready, waiting

    def _end(self) -> End:
        now = self.clock
        absent = frozenset(o for o, p in self.peers.items() if self.untrained and p.absent(now, min(self.wait, self.absent_wait)))
        return End(dict(self.untrained), frozenset(self.for_good), absent)

    def block_slots(self) -> set:
        """Every slot of the block that has hops: those of the hops known (a plain block's are all known at
        its start), or every slot of the shards in ASHA (its legs cross them all)."""
        if self.asha:
            return {(s, k) for s in range(self.shape[0]) for k in range(self.shape[1])}
        return set(self.owner.values())
