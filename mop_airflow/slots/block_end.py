"""When a slot may end: the slots of its block that never started.

Part of :class:`~mop_airflow.slots.machine.SlotMachine` (a mixin on its state): a slot whose hops are done
waits, before it ends, for each slot of its block that holds a hop still needed and has not started (no
slot waits for a configuration's last hop), and past :attr:`absent_wait` ends failed for good naming it;
it names the never-started slots it leaves nothing to do, which the driver marks done once no other slot
of the block runs. ASHA's slots give up a slot absent for good by the same rule. Apart from the rest of
the machine because these decide how a block ends when a task never starts (no worker on its queue, no
free slot in its pool), not what trains.
"""

from __future__ import annotations

from typing import Any, Iterable

from mop_airflow.slots.messages import HEARTBEAT, Wait, never_started, silent_on_last_try


class BlockEnd:
    """How :class:`~mop_airflow.slots.machine.SlotMachine` ends with slots of its block not started (the
    state it sets up: ``owner``, ``failed``, ``known``, ``peers``, ``absent_wait``, ``untrained``,
    ``for_good``)."""

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

    def _silent_at_end(self, now: float) -> Any:
        """This slot's hops done, and its end leaves never-started slots to mark done (:meth:`unneeded_slots`,
        which the driver marks once no other slot of the block runs): a slot of the block "running" on its
        last try whose heartbeat stopped is waited for until it is heard again (it lives, and ends them
        itself) or judged dead (its heartbeat silent for the wait bound), once per heartbeat. Killed, that
        slot's failure callback found this one alive and left the never-started slots to it; this one then
        ended first, counted the silent slot as running, and their tasks waited in Airflow for ever (slot_sim
        seed 372655). None: nothing to wait for, the slot ends."""
        if self.alone or self.untrained or not self.rules.absent_peers or (self.asha and not self.ended):
            return None
        unneeded = self.unneeded_slots()
        if not unneeded:
            return None
        others = sorted(self.block_slots() - {self.slot_of})
        act = self._read(others, now, HEARTBEAT)
        if act is not None:
            return act
        if not any(never_started(self.peers[o].latest) for o in unneeded):
            return None  # no slot left waiting in Airflow for this end to mark
        if any(silent_on_last_try(self.peers[o].latest, now, self.wait) for o in others):
            return Wait(now + HEARTBEAT)
        return None

    def _absent_for_good(self, now: float, owners: Iterable[tuple]) -> bool:
        """Whether one of these slots has not started for :attr:`absent_wait`; then it is given up for good,
        with the hops given up for it, and this try ends failed for good naming it (which ends the absent
        slot's task too). ASHA's slots never end while a configuration is in flight, and a grid's slot
        whose hops are done waits for a slot holding a hop still needed: without it, both waited for ever."""
        absent = [o for o in owners if o in self.peers and self.peers[o].absent(now, self.absent_wait)]
        for owner in absent:
            label = f"the search's hops on shard {owner[0]} slot {owner[1]}"
            self.untrained[label] = self.peers[owner]._absent_why(now, self.absent_wait)
            self.for_good.add(label)
        return bool(absent)
