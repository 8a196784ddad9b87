"""What a slot of an ASHA search decides that a grid's does not.

Part of :class:`~mop_airflow.slots.machine.SlotMachine` (a mixin on its state): in ASHA the hops come
from the search's decisions as they are taken, every leg crosses every shard, and the slots never end
while a configuration is in flight. So hops join as decisions land, an idle slot decides again when a
completion landed or a peer is newly judged ended for good, and a slot of the block absent for good ends
the try naming it (else the search waited for it for ever; :mod:`~mop_airflow.slots.block_end` names it).
Apart from the rest of the machine because a grid's slot takes none of these decisions.
"""

from __future__ import annotations

from typing import Any, Iterable

from mop_airflow.slots.messages import HEARTBEAT, priority


class AshaRules:
    """ASHA's decisions inside :class:`~mop_airflow.slots.machine.SlotMachine` (the state it sets up:
    ``asha``, ``alone``, ``ended``, ``decide_due``, ``gone_seen``, ``absent_wait``, ``shape``)."""

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
            self.pending.sort(key=priority)
        self.ended = self.ended or ended
        return added

    def store_changed(self) -> None:
        """ASHA: a completion or a decision landed, so a decision taken now may differ."""
        self.decide_due = True

    def _judge_gone(self, now: float) -> None:
        """ASHA, its search not ended: a slot newly judged ended for good may end legs whose next hop is on
        it (the ledger's dead legs): a decision then, though nothing landed in the store (slot_sim seed 992
        waited for ever). Only a slot not judged so before: the slots watched change from one call to the next
        (a Decide returns before the waiting hops' slots are watched again), and a set compared whole flipped
        between them and none, a decision every ASHA_EVERY on every slot (seed 342654 ran away)."""
        seen = self.gone_seen  # (those judged before need no judging again: only a new one counts)
        peers, wait = self.peers, self.wait
        gone = frozenset(o for o in self.watched if o not in seen and peers[o].may_have_ended(now, wait)
                         and (g := peers[o].gone(now, wait)) is not None and g[1])
        if gone:
            self.gone_seen, self.decide_due = seen | gone, True

    def _absent_anywhere(self, now: float) -> Any:
        """ASHA: every slot of the block must run, since every leg crosses every shard; one that has not
        started for the wait bound stalls the search even where no hop waits for it yet (a leg's last hop
        on it: no slot waits for that). Its status is read until it is seen started (once per heartbeat,
        then never again); past the bound this try ends, naming it."""
        if self.unstarted is None:  # every other slot of the block, watched from the first call on
            shards, slots = self.shape
            self.others = [(s, k) for s in range(shards) for k in range(slots) if (s, k) != self.slot_of]
            self.unstarted = self.others
        self.watched.update(self.others)
        # a slot seen started stays so (PeerView.started): only those not seen yet are judged again
        unseen = self.unstarted = [o for o in self.unstarted if not self.peer(o, now).started(now, self.wait)]
        act = self._read(unseen, now, HEARTBEAT)
        if act is not None or self.commits or self.outbox:
            return act
        return self._end() if self._absent_for_good(now, unseen) else None

    def _absent_given_up(self, now: float) -> bool:
        """ASHA: a hop is given up because its slot has not started (or its retry has not) for
        :attr:`absent_wait`: :meth:`_absent_for_good`."""
        if not (self.asha and self.rules.absent_peers and self.given_up) or self.commits or self.outbox:
            return False
        return self._absent_for_good(now, {self.owner.get((cid, t - 1)) for cid, t in self.given_up})
