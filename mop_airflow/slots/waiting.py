"""What a slot with nothing ready decides: read a peer, yield, give a hop up, look it up, take it back.

Part of :class:`~mop_airflow.slots.machine.SlotMachine` (a mixin on its state): while its hops wait for
other slots' it reads their statuses (:class:`~mop_airflow.slots.peers.PeerView`), gives its pool slot
back to a slot ranked before it that has not started, gives up the hops whose input comes from a slot
gone (after looking their input up in the store), takes a hop given up back when its input comes after
all, and says until when it waits. Apart from the rest of the machine because these are the decisions
that depend on time and on other slots, where the simulation's liveness faults land.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from mop_airflow.slots.messages import (ASHA_EVERY, HEARTBEAT, NEVER, READ_AGAIN, Look, ReadPeers, Record, Yield,
                                        label_of, priority)
from mop_airflow.slots.peers import PeerView


class Waiting:
    """How :class:`~mop_airflow.slots.machine.SlotMachine` waits for other slots (the state it sets up:
    ``peers``, ``watched``, ``waited_since``, ``given_up``, ``looked_at``, ``untrained``, ``for_good``)."""

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
                self.untrained[label_of(hop)] = why
                if for_good:
                    self.for_good.add(label_of(hop))

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
                              if label_of(self.given_up[k]) not in self.for_good], now, min(HEARTBEAT, self.wait / 2))
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
            label = label_of(hop)
            if self._before(hop.config_id, hop.hop) is not None:
                self.pending.append(hop)  # a failed configuration's hop is dropped (and settled) as any other
                self.pending.sort(key=priority)
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
