"""What a slot of an ASHA search decides that a grid's does not.

Part of :class:`~mop_airflow.slots.machine.SlotMachine` (a mixin on its state): in ASHA the hops come
from the search's decisions as they are taken, every leg crosses every shard, and the slots never end
while a configuration is in flight. So hops join as decisions land, an idle slot decides again when a
completion landed or a peer is newly judged ended for good, the slots no decision needed are named at
the end, and a slot of the block absent for good ends the try naming it (else the search waited for it
for ever). Apart from the rest of the machine because a grid's slot takes none of these decisions.
"""

from __future__ import annotations

from typing import Any, Iterable

from mop_airflow.slots.messages import HEARTBEAT, Wait, never_started, priority


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
        waited for ever)."""
        gone = frozenset(o for o in self.watched if (g := self.peers[o].gone(now, self.wait)) is not None and g[1])
        if gone != self.gone_seen:
            self.gone_seen, self.decide_due = gone, True

    def unneeded_slots(self) -> set:
        """The slots of the block this one's end leaves nothing to do, when they have not started (the
        driver ends only those, their tasks still waiting in Airflow, and only once no other slot of the
        block runs: one may wait for a failure they would settle). ASHA, its search finished: every other
        slot (a hop a decision put on one that never ran belongs to a leg that failed before it, or the
        search would not have finished; slot_sim seed 90431 waited for ever on such a slot, when only
        slots no decision put a hop on were ended). A plain block: each slot whose every hop is of a
        configuration this one knows failed (its hops would only settle the failure forward, which no
        reader needs: a configuration's records are read up to its first failure; seed 24973)."""
        if self.asha:
            return self.block_slots() - {self.slot_of}
        return self.block_slots() - self._needed_slots() - {self.slot_of}

    def _needed_slots(self) -> set:
        """A plain block: the other slots that own a hop of a configuration not known to have failed, and
        not known committed (its marker listed): the block is not over until each has run."""
        return {owner for key, owner in self.owner.items()
                if owner != self.slot_of and key[0] not in self.failed and key not in self.known}

    def _absent_at_end(self, now: float) -> Any:
        """A plain block, this slot's hops done: a slot of the block that owns a hop still needed and has not
        started is waited for before this one ends, as a slot waiting for its hops would. A needed hop
        no slot waits for (a configuration's last hop in the block, on a slot whose task never starts: no
        worker serves its queue, its pool has no free slot) otherwise left the run running for ever once
        the other slots ended done. Its status is read until it is seen started (once per heartbeat, then
        never again); past :attr:`absent_wait` this try ends failed for good naming it, which ends its
        task too. None: nothing to wait for, the slot ends."""
        if self.asha or self.alone or self.untrained or not self.rules.absent_peers:
            return None  # (a slot that gave hops up ends failed, and its end deals with the absent)
        # started as the driver's end_never_started judges: any word but none, a yield or a failure a retry
        # follows (a "running" whose heartbeat is older than this try began is a slot that started before
        # it: seed 92244 waited a heartbeat for one)
        unseen = [o for o in sorted(self._needed_slots())
                  if not self._peer(o, now).started(now, self.wait) and never_started(self.peers[o].latest)]
        if not unseen:
            return None
        act = self._read(unseen, now, HEARTBEAT)
        if act is not None:
            return act
        if self._absent_for_good(now, unseen):
            return self._end()
        return Wait(now + HEARTBEAT)

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
