"""One shard slot's decisions in a block, as a pure state machine (sans-IO).

The rules of :mod:`~mop_airflow.training.shard_loop` (what to train next, when to wait, settle a failed
configuration forward, give a hop up or take it back, yield the pool slot, end), with every read, write,
thread and clock left to a driver: :meth:`SlotMachine.decide` takes the time and returns one action;
what the action found, and whatever arrived meanwhile (markers, commits, peers' statuses, ASHA's
decisions), comes back as events. Deterministic: the same events give the same actions. So
:mod:`~mop_airflow.training.slot_sim` can run many slots on a virtual clock against a store that
injects faults, and replay any schedule from its seed, as FoundationDB and TigerBeetle check theirs.

It mirrors the production loop rule for rule (``_Loop._ready``, ``_settle_dropped``, ``_give_up``,
``_take_back``, ``_committed_before``, ``Chains.before``, ``slot_status.Peer``); a change to one is a
change to the other. Hops are anything shaped like ``shard_loop.BlockHop`` (``config_id``, ``hop``,
``shard``, ``slot``, ``weight``, ``order``, ``start``); records like ``HopRecord`` (the fields of
:class:`Record`). :class:`Rules` switches a rule off (or a proposed one on) to show that the simulation
fails without it. No Airflow, no Keras, no store.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from mop_airflow.training.slot_messages import (  # noqa: F401 - the machine's words, re-exported
    ASHA_EVERY, HEARTBEAT, NEVER, STATES_HELD, Check, Decide, End, Facts, Look, PeerStatus, ReadPeers, Record,
    Rules, State, Train, Wait, Write, Yield, died_on_last_try, state_after)


class _Peer:
    """slot_status.Peer, fed by the driver's reads."""

    def __init__(self, began: float, since: float, dies: bool) -> None:
        self.began, self.alive_at, self.read_at = began - 1.0, since, -NEVER
        self.dies = dies  # Rules.last_try_dies
        self.latest: PeerStatus | None = None
        self.status: PeerStatus | None = None
        self.seen = False

    def read(self, status: PeerStatus | None, at: float) -> None:
        if status is None:
            return
        before = self.latest
        if before is not None and status.try_number < before.try_number:
            return  # a late word of an older try
        if before is None or (status.try_number, status.state, status.progress) != (
                before.try_number, before.state, before.progress):
            self.alive_at = max(self.alive_at, at)
        self.latest = status
        # an end said before the waiting slot began may be an earlier run's: only its progress counts
        self.status = status if status.state == "running" or status.heartbeat >= self.began else None

    def started(self, now: float, wait: float) -> bool:
        if not self.seen:
            s = self.latest
            self.seen = s is not None and (s.state == "done" or (s.state == "failed" and s.final) or (
                s.state == "running" and s.heartbeat >= self.began) or (self.dies and died_on_last_try(s, now, wait)))
        return self.seen

    def gone(self, now: float, wait: float, name: str) -> tuple[str, bool] | None:
        s = self.status
        if s is not None and s.state == "failed" and s.final:
            return f"{name} failed for good on its try {s.try_number}", True
        if self.dies and died_on_last_try(self.latest, now, wait):
            return f"{name} died on its last try {self.latest.try_number}", True
        if s is not None and s.state == "done":
            return f"{name} finished its block without this hop's input", True
        if now - self.alive_at > wait:
            return f"{name} made no progress for {now - self.alive_at:.0f} s", False
        return None


def _priority(hop: Any) -> tuple:
    return -hop.weight, hop.order


class SlotMachine:
    """Slot ``(shard, slot)``'s try ``try_number`` of a block whose hops are ``hops`` (every slot's; its own
    are those on it). ``partners``: fused groups, ``(config_id, hop) -> configurations``; ``asha``: the
    hops come from decisions as they are taken (:meth:`asha_hops`) on ``shards`` shards; ``give_back``:
    seconds before a slot that took nothing from another yields to a slot ranked before it not started
    (None: never)."""

    def __init__(self, hops: Iterable[Any], *, shard: int, slot: int, try_number: int, began: float, wait: float,
                 give_back: float | None = None, partners: Mapping[tuple, frozenset] | None = None,
                 asha: bool = False, shards: int = 1, rules: Rules = Rules(),
                 yielding_since: float | None = None) -> None:
        hops = list(hops)
        self.slot_of, self.try_number, self.began, self.wait = (shard, slot), try_number, began, wait
        self.give_back, self.partners, self.asha, self.rules = give_back, dict(partners or {}), asha, rules
        self.yielding_since = yielding_since  # when this task first gave its pool slot back, if it did
        self.pending = sorted((h for h in hops if (h.shard, h.slot) == self.slot_of), key=_priority)
        self.owner = {(h.config_id, h.hop): (h.shard, h.slot) for h in hops}
        self.before = sorted({(h.shard, h.slot) for h in hops if (h.shard, h.slot) < self.slot_of})
        self.states: dict[str, dict[int, State]] = {}
        for h in hops:
            if h.start is not None:
                self.states.setdefault(h.config_id, {})[h.start.t] = h.start
        self.failed: dict[str, Any] = {}
        self.listed: set = set()  # hops whose markers were seen, records not read yet (Chains.listed)
        self.records: dict[tuple, Any] = {}  # the record each seen marker names, as read
        self.known: set = set()  # every hop whose marker was seen (CommitPoller.known)
        self.given_up: dict[tuple, Any] = {}
        self.looked_at: dict[tuple, float] = {}  # a given-up hop's input: when it was last looked up
        self.clock = began  # the latest time decide() was given
        self.for_good: set = set()
        self.untrained: dict[str, str] = {}
        self.commits: list = []  # this slot's hops in the writer's hands, oldest first
        self.outbox: list = []
        self.taking: list | None = None  # [members, checked]: chosen and out of pending, not trained yet
        self.peers: dict[tuple, _Peer] = {}
        self.watched: set = set()
        self.waited_since: dict[tuple, float] = {}
        self.joined = False
        self.ended, self.decide_due, self.decided_at = False, True, -NEVER
        mine = {(h.shard, h.slot) for h in self.pending}
        self.polled = sorted({self.slot_of, ((shard - 1) % shards, slot)} if asha else mine | {
            self.owner[h.config_id, h.hop - 1] for h in self.pending if (h.config_id, h.hop - 1) in self.owner})
        self.wants_poll = True

    # ----------------------------------------------------------------- events
    def markers(self, records: Iterable[Any]) -> None:
        """A poll listed markers; each record is the one its marker names, as read."""
        for r in records:
            key = (r.config_id, r.t)
            self.known.add(key)
            self.listed.add(key)
            self.records[key] = r

    def committed(self, record: Any) -> None:
        """The writer committed this slot's oldest hop in its hands (checkpoint, record, marker)."""
        self.commits.pop(0)
        self._learn(record)

    def trained_ok(self, hop: Any) -> None:
        """A hop trained: its commit goes to the writer."""
        self.commits.append(hop)

    def trained_failed(self, hop: Any, state: State, status: str, error: str) -> None:
        """A hop failed (its builder raised, it diverged): record_failure, its marker; the others go on."""
        failure = Record(hop.config_id, hop.hop, hop.shard, status, state.checkpoint_sha256, error=error,
                         try_number=self.try_number)
        self.outbox.append((failure, "write"))
        self._learn(failure)

    def peer_status(self, owner: tuple, status: PeerStatus | None, asked_at: float) -> None:
        self.peers[owner].read(status, asked_at)

    def looked(self, hops: Sequence[tuple], found: Mapping[tuple, Any]) -> None:
        """The answer to :class:`Look`: the records there (None: none). A hop whose peer is gone and whose
        input is not there (or from another state) is given up (shard_loop._give_up); one looked up while
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

    def checked(self, facts: Mapping[tuple, Facts]) -> None:
        """The answer to :class:`Check` (shard_loop._committed_before, slot_commits.committed)."""
        members, _ = self.taking
        todo = []
        for hop, state in members:
            earlier = self._earlier(hop, state, facts.get((hop.config_id, hop.hop)))
            if earlier is None:
                todo.append((hop, state))
                continue
            self._learn(earlier)
            if self.rules.mark_found:
                self.outbox.append((earlier, "mark"))
        self.taking = [todo, True]

    def asha_hops(self, hops: Iterable[Any], ended: bool) -> None:
        """ASHA's decisions read since the last call: every slot's hops (shard_loop._extend)."""
        added = False
        for h in hops:
            self.owner[h.config_id, h.hop] = (h.shard, h.slot)
            if h.start is not None:
                self.states.setdefault(h.config_id, {}).setdefault(h.start.t, h.start)
            if (h.shard, h.slot) == self.slot_of:
                self.pending.append(h)
                added = True
        if added:
            self.pending.sort(key=_priority)
        self.ended = self.ended or ended

    def store_changed(self) -> None:
        """ASHA: a completion or a decision landed, so a decision taken now may differ."""
        self.decide_due = True

    # ----------------------------------------------------------------- the loop
    def decide(self, now: float) -> Any:
        """The next action at ``now``: one iteration of shard_loop._Loop._train_all, up to its first I/O."""
        self.clock = now
        if self.outbox:
            out = tuple(self.outbox)
            self.outbox.clear()
            return Write(out)
        if self.taking is not None:
            return self._take(now)
        if not (self.pending or self.commits or (self.asha and not self.ended)):
            return self._end()
        step = self._ready(now)
        if not isinstance(step, tuple):
            return step
        ready, waiting = step
        if self.partners:
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
        return Train(tuple(members)) if members else self.decide(now)  # all committed before: go on

    def _ready(self, now: float) -> Any:
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
        ready, waiting, failed = [], [], {}
        since, self.waited_since = self.waited_since, {}
        for h in self.pending:
            if h.hop != earliest[h.config_id]:
                continue
            state = h.start or self._before(h.config_id, h.hop)
            if state is None:
                waiting.append(h)
                self.waited_since[h.config_id, h.hop - 1] = since.get((h.config_id, h.hop - 1), now)
            elif isinstance(state, State):
                ready.append((h, state))
            else:
                failed[h.config_id] = state
        if failed:
            for h in [h for h in self.pending if h.config_id in failed]:
                self.pending.remove(h)
                if h.hop == earliest[h.config_id] and self.rules.settle_forward:
                    self._settle_dropped(h, failed[h.config_id])
        waiting += [h for h in self.pending if h.hop != earliest[h.config_id]]
        self.wants_poll = bool(waiting or self.given_up)
        if self.outbox:
            out = tuple(self.outbox)
            self.outbox.clear()
            return Write(out)
        return ready, waiting

    def _before(self, cid: str, t: int) -> Any:
        """Chains.before: the state hop ``t`` starts from, a failure record, or None (not committed yet)."""
        failed = self.failed.get(cid)
        if failed is not None and failed.t < t:
            return failed
        states = self.states.get(cid)
        if not states:
            return None
        if t - 1 in states:
            return states[t - 1]
        key = (cid, t - 1)
        if key not in self.listed:
            return None
        record = self.records[key]
        self.listed.discard(key)
        known = states.get(t - 2)
        if known is not None and record.dropped_after is None and record.input_sha256 != known.checkpoint_sha256:
            return None  # left by an earlier run from another state
        if record.status != "ok":
            self.failed[cid] = record
            return record
        states[record.t] = state_after(record)
        return states[record.t]

    def _learn(self, record: Any) -> None:
        if record.status != "ok":
            self.failed[record.config_id] = record
        else:
            self.states.setdefault(record.config_id, {})[record.t] = state_after(record)

    def _earlier(self, hop: Any, state: State, facts: Facts | None) -> Any:
        """slot_commits.committed: the hop as an earlier try left it when that try started from ``state``."""
        record = None if facts is None else facts.record
        if record is None or record.input_sha256 != state.checkpoint_sha256:
            return None
        if record.status != "ok" or facts.checkpoint_there:
            return record
        if self.try_number == 1 and (hop.config_id, hop.hop + 1) in self.known:
            return record
        return record if facts.next_there else None

    def _settle_dropped(self, hop: Any, failure: Any) -> None:
        """Write down where ``hop`` was due that it will never train, so the next shard's slot learns it."""
        first = failure.t if failure.dropped_after is None else failure.dropped_after
        self.outbox.append((Record(hop.config_id, hop.hop, hop.shard, failure.status, error=failure.error,
                                   dropped_after=first, try_number=self.try_number), "settle"))

    def _peer(self, owner: tuple, now: float) -> _Peer:
        peer = self.peers.get(owner)
        if peer is None:
            peer = self.peers[owner] = _Peer(self.began, now, self.rules.last_try_dies)
        self.watched.add(owner)
        return peer

    def _read(self, owners: Iterable[tuple], now: float, every: float) -> ReadPeers | None:
        due = sorted(o for o in set(owners) if now - self._peer(o, now).read_at >= every)
        for o in due:
            self.peers[o].read_at = now
        return ReadPeers(tuple(due)) if due else None

    def _give_up(self, waiting: list, now: float) -> Any:
        """shard_loop._give_up: yield to a slot ranked before this one not started, or give up the waiting
        hops whose input comes from a slot gone (ended for good, or no progress within the wait bound)."""
        bounded = self.rules.yield_bound and self.yielding_since is not None and now - self.yielding_since > self.wait
        if self.give_back is not None and not self.joined and now - self.began > self.give_back and not bounded:
            act = self._read([o for o in self.before if not self._peer(o, now).seen], now, HEARTBEAT)
            if act is not None:
                return act
            for owner in self.before:
                if not self.peers[owner].started(now, self.wait):
                    return Yield(f"shard {owner[0]} slot {owner[1]} has not started")
        owners = {h: self.owner.get((h.config_id, h.hop - 1)) for h in waiting}
        act = self._read([o for o in owners.values() if o is not None], now, min(HEARTBEAT, self.wait / 2))
        if act is not None:
            return act
        look = []
        for h in waiting:
            owner, key = owners[h], (h.config_id, h.hop - 1)
            if owner is None:
                continue
            gone = self.peers[owner].gone(now, self.wait, f"shard {owner[0]} slot {owner[1]}")
            stale = self.rules.look_after is not None and now - self.waited_since.get(key, now) > self.rules.look_after
            if (gone is not None or stale) and self._before(h.config_id, h.hop) is None:
                if stale and gone is None:
                    self.waited_since[key] = now  # looked up now: again after look_after
                look.append((h, *(gone or ("", False))))
        return Look(tuple(look)) if look else None

    def _take_back(self, now: float) -> Any:
        """shard_loop._take_back: a hop given up is taken back when its input comes after all; in ASHA one
        whose slot ended for good fails its configuration instead, so the search goes on."""
        if self.asha and self.given_up:
            act = self._read([self.owner[k[0], k[1] - 1] for k in self.given_up
                              if _label(self.given_up[k]) not in self.for_good], now, min(HEARTBEAT, self.wait / 2))
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
        gone = None if owner is None else self._peer(owner, now).gone(now, self.wait, "")
        return gone is not None and gone[1]

    def _deadline(self, now: float) -> float:
        """When time alone may change what this slot does: a peer's status due to be read again, the
        wait bound of one, the yield bound, ASHA's next decision."""
        every = min(HEARTBEAT, self.wait / 2)
        times = [self.peers[o].read_at + every for o in self.watched]
        times += [self.peers[o].alive_at + self.wait + 1e-6 for o in self.watched]
        if self.give_back is not None and not self.joined:
            times.append(self.began + self.give_back + 1e-6)
            if self.rules.yield_bound and self.yielding_since is not None:
                times.append(self.yielding_since + self.wait + 1e-6)
        if self.asha and self.decide_due:
            times.append(self.decided_at + ASHA_EVERY)
        if self.rules.look_after is not None:
            times += [at + self.rules.look_after + 1e-6 for at in self.waited_since.values()]
            times += [at + self.rules.look_after + 1e-6 for at in self.looked_at.values()]
        return min((t for t in times if t > now), default=NEVER)

    def _end(self) -> End:
        return End(dict(self.untrained), frozenset(self.for_good))


def _label(hop: Any) -> str:
    return f"{hop.config_id} t={hop.hop}"
