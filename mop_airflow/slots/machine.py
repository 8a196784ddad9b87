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
simulation checks. Hops are anything shaped like ``shard_loop.BlockHop`` (``config_id``, ``hop``,
``shard``, ``slot``, ``weight``, ``order``, ``start``); records like ``HopRecord`` (the fields of
:class:`Record`) and states like ``Assignment`` (``config_id``, ``t``, ``checkpoint_sha256``), the state
a record leaves given by ``state_after``. :class:`Rules` switches a rule off (or a proposed one on) to
show that the simulation fails without it. No Airflow, no Keras, no store.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

from mop_airflow.slots.messages import (  # noqa: F401 - the machine's words, re-exported
    ASHA_EVERY, CLOCK_SKEW, HEARTBEAT, NEVER, READ_AGAIN, STATES_HELD, Check, Decide, End, Facts, Look, PeerStatus,
    Read, ReadPeers, Record, Rules, State, Stopped, Superseded, Train, Wait, Write, Yield, died_on_last_try,
    state_after)
from mop_airflow.slots.peers import PeerView  # noqa: F401 - how a slot judges a peer, re-exported


def _failure(state: Any) -> bool:
    """Whether what a hop starts from is a failure record (a state has no status)."""
    return getattr(state, "status", "ok") != "ok"


def _priority(hop: Any) -> tuple:
    return -hop.weight, hop.order


class SlotMachine:
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
        self.alone, self.state_after = alone, state_after
        self.shape = (shards, slots)  # the block's shards and slots per shard
        # ASHA: how long a slot of the block may stay not started before this try fails for good naming it.
        # Its tries never end on a hop given up (a late slot's hops are taken back), so it waits the wait
        # bound of every try it has left at once: what a grid's slots wait over their tries
        self.absent_wait = wait if absent_wait is None else absent_wait
        self.pending = sorted((h for h in hops if (h.shard, h.slot) == self.slot_of) if own is None else own,
                              key=_priority)
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
        self.joined = False  # it took a hop another slot handed it: the block runs, it keeps its pool slot
        self.ended, self.decide_due, self.decided_at = False, True, -NEVER
        self.gone_seen: frozenset = frozenset()  # ASHA: the watched slots last judged ended for good
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
    def markers(self, listed: Iterable[Any]) -> None:
        """A poll listed markers: each a hop ``(config_id, t)``, its record read when a decision needs it
        (:class:`Read`: a listing costs one request, not a read per configuration), or the record itself."""
        for item in listed:
            key = item if isinstance(item, tuple) else (item.config_id, item.t)
            self.known.add(key)
            self.listed.add(key)
            if isinstance(item, tuple):
                self.records.pop(key, None)  # a hop marked again (trained again): its record is read again
            else:
                self.records[key] = item

    def read(self, found: Mapping[tuple, Any]) -> None:
        """The answer to :class:`Read`: the record each listed marker names."""
        self.records.update(found)
        for key in found:
            self.unread_at.pop(key, None)

    def unreadable(self, keys: Iterable[tuple]) -> None:
        """The answer to :class:`Read` for markers whose record this reader cannot read yet (a 404 though
        the marker was listed: a store whose readers disagree for a while). Read again :data:`READ_AGAIN`
        later; meanwhile the hop waits as if its marker had not been listed (its peer judged as ever)."""
        if not self.rules.read_again:
            raise LookupError(f"the records of {sorted(keys)} are listed but cannot be read")
        for key in keys:
            self.unread_at[key] = self.clock

    def flush(self) -> Write | None:
        """The writes still to do (the slot stops: what it learnt reaches the store first)."""
        out, self.outbox = tuple(self.outbox), []
        return Write(out) if out and self.superseded_by is None else None

    def committed(self, record: Any) -> None:
        """The writer committed this slot's oldest hop in its hands (checkpoint, record, marker)."""
        self.commits.pop(0)
        self._learn(record)

    def commit_lost(self, standing: Any) -> None:
        """The writer's create of this slot's oldest hop's record found ``standing`` there (Rules.fence):
        another copy of the hop committed first (an earlier try that was taken for dead and resumed, a
        later try of this slot running at once). The record there stands: learnt as this hop's, its
        checkpoint untouched, and marked for the slots waiting for it (its writer may not have yet)."""
        self.commits.pop(0)
        self._stands(standing)

    def lost(self, record: Any, standing: Any) -> None:
        """A fenced create of ``record`` (a failure, a drop settled, Write) found ``standing`` there. A settle
        leaves an earlier record as it is; a failure learnt when it was written is taken back for what
        stands (another copy of the hop committed it: the configuration is healthy, and not recorded failed)."""
        if record.dropped_after is not None:
            return
        if self.failed.get(record.config_id) is record:
            del self.failed[record.config_id]
        self._stands(standing)

    def _stands(self, standing: Any) -> None:
        self._learn(standing)
        if self.rules.mark_found:
            self.outbox.append((standing, "mark"))

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

    def commit_failed(self, hop: Any, state: Any, status: str, error: str) -> None:
        """The writer could not commit this slot's oldest hop: its configuration fails, as if it failed."""
        self.commits.pop(0)
        self.trained_failed(hop, state, status, error)

    def recorded(self, record: Any) -> None:
        """A record the driver wrote of its own accord (ASHA: a leg whose next hop is on a dead slot)."""
        self._learn(record)

    def trained_ok(self, hop: Any) -> None:
        """A hop trained: its commit goes to the writer."""
        self.commits.append(hop)

    def trained_failed(self, hop: Any, state: Any, status: str, error: str) -> None:
        """A hop failed (its builder raised, it diverged): record_failure, its marker; the others go on."""
        failure = Record(hop.config_id, hop.hop, hop.shard, status, state.checkpoint_sha256, error=error,
                         try_number=self.try_number)
        self.outbox.append((failure, "write"))
        self._learn(failure)

    def peer_status(self, owner: tuple, status: Any, asked_at: float) -> None:
        """The answer to :class:`ReadPeers`: slot ``owner``'s status (None: no file), read at ``asked_at``."""
        self.peer(owner, asked_at).read(status, asked_at)

    def peer(self, owner: tuple, now: float) -> PeerView:
        """Slot ``owner`` as this one sees it (the driver's own checks share what it read)."""
        peer = self.peers.get(owner)
        if peer is None:
            name = f"shard {owner[0]} slot {owner[1]}"
            peer = self.peers[owner] = PeerView(self.began, now, self.rules.last_try_dies, name,
                                                stale_ends=self.rules.stale_ends, absent=self.rules.absent_peers,
                                                shard=owner[0])
        return peer

    def looked(self, hops: Sequence[tuple], found: Mapping[tuple, Any]) -> None:
        """The answer to :class:`Look`: the records there (None: none). A hop whose peer is gone and whose
        input is not there (or from another state) is given up; one looked up while
        its peer lives (``why`` empty: Rules.look_after) waits on."""
        for hop, why, for_good in hops:
            key = (hop.config_id, hop.hop - 1)
            if found.get(key) is not None:
                self.listed.add(key)
                self.records[key] = found[key]
            if why and hop in self.pending and self._before(hop.config_id, hop.hop) is None:
                self.pending.remove(hop)
                self.given_up[hop.config_id, hop.hop] = hop
                self.looked_at[hop.config_id, hop.hop] = self.clock
                self.untrained[_label(hop)] = why
                if for_good:
                    self.for_good.add(_label(hop))

    def checked(self, facts: Mapping[tuple, Facts]) -> list:
        """The answer to :class:`Check`; returns ``(hop, record)`` of each hop an earlier try committed
        (then learnt here, and not trained again)."""
        members, _ = self.taking
        todo, found = [], []
        for hop, state in members:
            earlier = self._earlier(hop, state, facts.get((hop.config_id, hop.hop)))
            if earlier is None:
                todo.append((hop, state))
                continue
            found.append((hop, earlier))
            self._learn(earlier)
            if self.rules.mark_found:
                # the earlier try may have died between the record and its marker: the slot waiting for this
                # hop lists markers, and would wait for ever (seed 164). Marked again even when this slot
                # listed its marker: one PUT a hop found on a retry, and a marker seen here may be one that
                # landed after a name the waiting slot's poller had listed past
                self.outbox.append((earlier, "mark"))
        self.taking = [todo, True]
        return found

    def asha_hops(self, hops: Iterable[Any], ended: bool) -> int:
        """ASHA's decisions read since the last call: every slot's hops, which tell whom a hop waits for and
        where each configuration's leg starts; this slot's (every one, ``alone``) join its pending ones.
        Returns how many joined."""
        added = 0
        for h in hops:
            self.owner[h.config_id, h.hop] = (h.shard, h.slot)
            if h.start is not None:
                self.states.setdefault(h.config_id, {}).setdefault(h.start.t, h.start)
            if self.alone or (h.shard, h.slot) == self.slot_of:
                self.pending.append(h)
                added += 1
        if added:
            self.pending.sort(key=_priority)
        self.ended = self.ended or ended
        return added

    def store_changed(self) -> None:
        """ASHA: a completion or a decision landed, so a decision taken now may differ."""
        self.decide_due = True

    # ----------------------------------------------------------------- the loop
    def decide(self, now: float) -> Any:
        """The next action at ``now``: what to train, read, write or wait for."""
        self.clock = now
        if self.asha and not self.ended:
            # a slot newly judged ended for good may end legs whose next hop is on it (the ledger's dead
            # legs): a decision then, though nothing landed in the store (slot_sim seed 992 waited for ever)
            gone = frozenset(o for o in self.watched if (g := self.peers[o].gone(now, self.wait)) is not None and g[1])
            if gone != self.gone_seen:
                self.gone_seen, self.decide_due = gone, True
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
        if not (self.pending or self.commits or (self.asha and not self.ended)) or self._absent_given_up(now):
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
            ask = [(h, s) for h, s in members if self.try_number > 1 or (h.config_id, h.hop) in self.known]
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
        for h in self.pending:
            if h.hop != earliest[h.config_id]:
                continue
            state = h.start or self._before(h.config_id, h.hop)
            if state is None:
                waiting.append(h)
                self.waited_since[h.config_id, h.hop - 1] = since.get((h.config_id, h.hop - 1), now)
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

    def _needs(self, cid: str, t: int) -> bool:
        """Whether :meth:`_before` of hop ``t`` takes the record of hop ``t - 1`` in."""
        failed = self.failed.get(cid)
        states = self.states.get(cid)
        return not (failed is not None and failed.t < t) and bool(states) and t - 1 not in states

    def _unread(self, hops: Iterable[Any]) -> Read | None:
        """Read the records of the listed markers that name these hops' inputs, unless read already."""
        due = self.clock - READ_AGAIN
        keys = sorted({(h.config_id, h.hop - 1) for h in hops if h.start is None
                       and (h.config_id, h.hop - 1) in self.listed and (h.config_id, h.hop - 1) not in self.records
                       and self.unread_at.get((h.config_id, h.hop - 1), -NEVER) <= due
                       and self._needs(h.config_id, h.hop)})
        return Read(tuple(keys)) if keys else None

    def _before(self, cid: str, t: int) -> Any:
        """The state hop ``t`` starts from, a failure record when the configuration failed before it, or
        None while the hop before it is not committed (as far as this slot knows).

        The hop before it was trained by the previous shard's slot, whose markers this slot lists; the
        hops between this slot's last knowledge of the configuration and that one were trained by slots
        it does not list. So the record a marker names is taken as it is (its slot checked its own input
        against the record before it), and checked here against the state before it when this slot
        knows that state: walking the records between would cost a read per shard and hop."""
        failed = self.failed.get(cid)
        if failed is not None and failed.t < t:
            return failed
        states = self.states.get(cid)
        if not states:
            return None
        if t - 1 in states:
            return states[t - 1]
        key = (cid, t - 1)
        if key not in self.listed or key not in self.records:
            return None  # not listed, or not read yet (its Read comes first)
        record = self.records[key]
        self.listed.discard(key)  # taken in: a later marker of it (trained again) brings it back
        known = states.get(t - 2)
        # a dropped hop's record started from nothing: it says the configuration failed before it
        if known is not None and record.dropped_after is None and record.input_sha256 != known.checkpoint_sha256:
            return None  # left by an earlier run from another state: its hop will be trained again
        if record.status != "ok":
            self.failed[cid] = record
            return record
        states[record.t] = self.state_after(record)
        return states[record.t]

    def _learn(self, record: Any) -> None:
        if record.status != "ok":
            self.failed[record.config_id] = record
        else:
            self.states.setdefault(record.config_id, {})[record.t] = self.state_after(record)

    def _earlier(self, hop: Any, state: Any, facts: Facts | None) -> Any:
        """Hop ``hop`` as an earlier try left it, when that try started from ``state``: a failure, or a
        commit (its record written, and its checkpoint there, or already taken on by the next hop).

        The hop after it is trained on the next shard, by a slot whose markers this one does not list:
        whether it took the state on is asked of the store, never of the markers known. A retry that
        took an unlisted next hop for "not committed" trained a committed hop again from a checkpoint
        already cleaned up, and overwrote its record. A first try knows its earlier tries' hops from the
        markers (a retry asks the store: its earlier try may have died between a record and its marker)."""
        record = None if facts is None else facts.record
        if record is None or record.input_sha256 != state.checkpoint_sha256:
            return None
        if record.status != "ok" or facts.checkpoint_there:
            return record
        if self.try_number == 1 and (hop.config_id, hop.hop + 1) in self.known:
            return record
        return record if facts.next_there else None

    def _settle_dropped(self, hop: Any, failure: Any) -> None:
        """Write down, where ``hop`` was due, that it will never train: the slot of the next shard waits for
        this hop's record (its marker in this slot's folder), and learns from it that the configuration
        failed. Without it that slot, and every one after it along the chain, waited for a hop that never
        came. The configuration's later hops on this slot need no record: its next hop's slot drops them
        (and settles its own) as this one did. An earlier try's record of the hop is left as it is
        ("settle": the driver writes it only where no record is)."""
        first = failure.t if failure.dropped_after is None else failure.dropped_after
        self.outbox.append((Record(hop.config_id, hop.hop, hop.shard, failure.status, error=failure.error,
                                   dropped_after=first, try_number=self.try_number), "settle"))

    def _peer(self, owner: tuple, now: float) -> PeerView:
        self.watched.add(owner)
        return self.peer(owner, now)

    def _read(self, owners: Iterable[tuple], now: float, every: float) -> ReadPeers | None:
        due = sorted(o for o in set(owners) if now - self._peer(o, now).read_at >= every)
        for o in due:
            self.peers[o].read_at = now
        return ReadPeers(tuple(due)) if due else None

    def _give_up(self, waiting: list, now: float) -> Any:
        """Yield to a slot ranked before this one not started (when this slot has taken no hop from another
        slot), or give up the waiting hops whose input comes from a slot gone (ended for good, or no
        progress within the wait bound; the peer may have committed the hop just before it stopped: its
        input is looked up first). A hop waited for ``look_after``, its slot alive, has its input looked
        up too: the marker that names it may have landed after a name the poller had already listed past
        (a commit and a failure marked at once, a marker PUT retried, a listing that lags), and then no
        listing ever shows it (seeds 432, 1909)."""
        if self.asha and self.rules.absent_peers and not self.alone:
            act = self._absent_anywhere(now)
            if act is not None:
                return act
        bounded = self.rules.yield_bound and self.yielding_since is not None and now - self.yielding_since > self.wait
        if self.give_back is not None and not self.joined and now - self.began > self.give_back and not bounded:
            act = self._read([o for o in self.before if not self._peer(o, now).seen], now, HEARTBEAT)
            if act is not None:
                return act
            for owner in self.before:
                if not self.peers[owner].started(now, self.wait):
                    return Yield(f"shard {owner[0]} slot {owner[1]} of this block has not started within "
                                 f"{self.give_back:.0f} s: this slot gives its pool slot back and tries again "
                                 "later, so a block that holds the shards before it can finish")
        owners = {h: self.owner.get((h.config_id, h.hop - 1)) for h in waiting}
        act = self._read([o for o in owners.values() if o is not None], now, min(HEARTBEAT, self.wait / 2))
        if act is not None:
            return act
        judged = [(h, self.peers[owners[h]].gone(now, self.wait), self.rules.look_after is not None
                   and now - self.waited_since.get((h.config_id, h.hop - 1), now) > self.rules.look_after)
                  for h in waiting if owners[h] is not None]
        act = self._unread(h for h, gone, stale in judged if gone is not None or stale)
        if act is not None:
            return act
        look = []
        for h, gone, stale in judged:
            key = (h.config_id, h.hop - 1)
            if (gone is not None or stale) and self._before(h.config_id, h.hop) is None:
                if stale and gone is None:
                    self.waited_since[key] = now  # looked up now: again after look_after
                look.append((h, *(gone or ("", False))))
        return Look(tuple(look)) if look else None

    def _take_back(self, now: float) -> Any:
        """A hop given up is taken back when its input comes after all (its slot was late, or hung and
        retried) or the configuration failed meanwhile; then its block need not fail. In a search that
        decides as it goes (ASHA), whose slots never end while a configuration is in flight, a hop whose
        input will never come (its slot ended for good) fails its configuration instead, with the cause,
        and the search goes on: else the search waited for it for ever."""
        if self.asha and self.given_up:
            act = self._read([self.owner[k[0], k[1] - 1] for k in self.given_up
                              if _label(self.given_up[k]) not in self.for_good], now, min(HEARTBEAT, self.wait / 2))
            if act is not None:
                return act
        act = self._unread(self.given_up.values())
        if act is not None:
            return act
        if self.rules.look_after is not None and self.rules.look_given_up:
            # its input may be committed with a marker never listed (landed after a later name): looked up
            # as a waiting hop's is, or an ASHA slot kept it given up for ever (seeds 136875, 212597)
            stale = [(hop, "", False) for key, hop in self.given_up.items()
                     if now - self.looked_at.get(key, now) > self.rules.look_after
                     and self._before(hop.config_id, hop.hop) is None]
            if stale:
                for hop, _, _ in stale:
                    self.looked_at[hop.config_id, hop.hop] = now
                return Look(tuple(stale))
        for key, hop in list(self.given_up.items()):
            label = _label(hop)
            if self._before(hop.config_id, hop.hop) is not None:
                self.pending.append(hop)  # a failed configuration's hop is dropped (and settled) as any other
                self.pending.sort(key=_priority)
            elif self.asha and (label in self.for_good or self._for_good(hop, now)):
                failure = Record(hop.config_id, hop.hop, hop.shard, "failed", None, try_number=self.try_number,
                                 error=f"TrainingError: its hop {hop.hop} on shard {hop.shard} was given up: "
                                       f"{self.untrained[label]}")
                self.outbox.append((failure, "write"))
                self._learn(failure)
            else:
                continue
            del self.given_up[key]
            self.looked_at.pop(key, None)
            self.untrained.pop(label, None)
            self.for_good.discard(label)
        return None

    def _for_good(self, hop: Any, now: float) -> bool:
        owner = self.owner.get((hop.config_id, hop.hop - 1))
        gone = None if owner is None else self._peer(owner, now).gone(now, self.wait)
        return gone is not None and gone[1]

    def _deadline(self, now: float) -> float:
        """When time alone may change what this slot does: a peer's status due to be read again, the
        wait bound of one, the yield bound, ASHA's next decision."""
        every = min(HEARTBEAT, self.wait / 2)
        times = [self.peers[o].read_at + every for o in self.watched]
        times += [self.peers[o].alive_at + self.wait + 1e-6 for o in self.watched]
        if self.asha:
            times += [self.peers[o].alive_at + self.absent_wait + 1e-6 for o in self.watched]
        if self.give_back is not None and not self.joined:
            times.append(self.began + self.give_back + 1e-6)
            if self.rules.yield_bound and self.yielding_since is not None:
                times.append(self.yielding_since + self.wait + 1e-6)
        if self.asha and self.decide_due:
            times.append(self.decided_at + ASHA_EVERY)
        times += [at + READ_AGAIN for at in self.unread_at.values()]
        if self.rules.look_after is not None:
            times += [at + self.rules.look_after + 1e-6 for at in self.waited_since.values()]
            times += [at + self.rules.look_after + 1e-6 for at in self.looked_at.values()]
        return min((t for t in times if t > now), default=NEVER)

    def _end(self) -> End:
        now = self.clock
        absent = frozenset(o for o, p in self.peers.items() if self.untrained and p.absent(now, min(self.wait, self.absent_wait)))
        return End(dict(self.untrained), frozenset(self.for_good), absent)

    def unneeded_slots(self) -> set:
        """ASHA, its search finished: the slots of the block no decision put a hop on (they need not run)."""
        return self.block_slots() - set(self.owner.values()) - {self.slot_of}

    def block_slots(self) -> set:
        """Every slot of the block that has hops: those of the hops known (a plain block's are all known at
        its start), or every slot of the shards in ASHA (its legs cross them all)."""
        if self.asha:
            return {(s, k) for s in range(self.shape[0]) for k in range(self.shape[1])}
        return set(self.owner.values())

    def _absent_anywhere(self, now: float) -> Any:
        """ASHA: every slot of the block must run, since every leg crosses every shard; one that has not
        started for the wait bound stalls the search even where no hop waits for it yet (a leg's last hop
        on it: no slot waits for that). Its status is read until it is seen started (once per heartbeat,
        then never again); past the bound this try ends, naming it."""
        shards, slots = self.shape
        unseen = [(s, k) for s in range(shards) for k in range(slots)
                  if (s, k) != self.slot_of and not self._peer((s, k), now).started(now, self.wait)]
        act = self._read(unseen, now, HEARTBEAT)
        if act is not None or self.commits or self.outbox:
            return act
        self.watched.update(unseen)
        return self._end() if self._absent_for_good(now, unseen) else None

    def _absent_for_good(self, now: float, owners: Iterable[tuple]) -> bool:
        """ASHA: whether one of these slots has not started for :attr:`absent_wait`; then it is given up
        for good, with the hops given up for it, and this try ends failed for good naming it (which ends
        the absent slot's task too): ASHA's slots never end while a configuration is in flight, so the
        search waited for it for ever."""
        absent = [o for o in owners if o in self.peers and self.peers[o].absent(now, self.absent_wait)]
        for owner in absent:
            label = f"the search's hops on shard {owner[0]} slot {owner[1]}"
            self.untrained[label] = self.peers[owner]._absent_why(now, self.absent_wait)
            self.for_good.add(label)
        return bool(absent)

    def _absent_given_up(self, now: float) -> bool:
        """ASHA: a hop is given up because its slot has not started (or its retry has not) for
        :attr:`absent_wait`: :meth:`_absent_for_good`."""
        if not (self.asha and self.rules.absent_peers and self.given_up) or self.commits or self.outbox:
            return False
        return self._absent_for_good(now, {self.owner.get((cid, t - 1)) for cid, t in self.given_up})


def _label(hop: Any) -> str:
    return f"{hop.config_id} t={hop.hop}"
