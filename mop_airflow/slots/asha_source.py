"""A shard slot's hops of an ASHA search, as its decisions come (:mod:`mop_airflow.planning.asha_slots`).

The shard loop (:func:`mop_airflow.slots.driver.run_slot`) asks :meth:`AshaSource.new_hops`
for the hops decided since it last asked, on every slot (it keeps every slot's, to know whom a hop
waits for), and :meth:`AshaSource.idle` when it has nothing ready to train: the slot then takes the
search's next decision, whose first hop lands on its own shard. The store is read at most once per
``every`` seconds (one listing of the decisions), so a waiting slot costs a request per poll.
"""

from __future__ import annotations

import time

from mop_airflow.planning.asha_slots import Ledger, leg_owner, legs_of
from mop_airflow.records import RunRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.planning.placement import BlockHop

EVERY_LOCAL, EVERY_REMOTE = 0.05, 0.5  # seconds between two reads of the decisions: a stat, or a request


class AshaSource:
    """The hops an ASHA search's decisions put on the shard slots, for slot ``(shard, slot)``;
    ``alone``: this process trains every slot's hops (``dag.test()``), so it decides for them all."""

    def __init__(self, layout: RunLayout, run: RunRecord, *, shard: int, slot: int, shards: int, slots: int,
                 alone: bool = False) -> None:
        self.ledger = Ledger(layout, run, shards, slots)
        self.shard, self.slot, self.shards, self.slots, self.alone = shard, slot, shards, slots, alone
        self.every = EVERY_LOCAL if layout.store.protocol == "file" else EVERY_REMOTE
        self.read_at = self.decided_at = 0.0
        self.taken = 0  # decisions already turned into hops

    @property
    def ended(self) -> bool:
        """The search's last decision is taken: nothing more will be decided."""
        return self.ledger.finished

    def new_hops(self) -> list[BlockHop]:
        """Every hop of the decisions taken since the last call, on every slot, in decision order."""
        now = time.monotonic()
        if now - self.read_at >= self.every:
            self.read_at = now
            self.ledger.read()
        hops = []
        for decision in self.ledger.decisions[self.taken:]:
            for leg in legs_of(decision):
                for t in range(leg.first, leg.end):
                    shard, slot = leg_owner(leg.offset, leg.slot, t, self.shards)
                    hops.append(BlockHop(config_id=leg.config_id, offset=leg.offset, step=t,
                                         shard=shard, slot=slot, hop=t,
                                         rung_end=t == leg.end - 1, start=leg.start if t == leg.first else None,
                                         order=leg.decision * 100_000 + t))
        self.taken = len(self.ledger.decisions)
        return hops

    def idle(self) -> None:
        """The slot has nothing ready: take the search's next decision (at most once per ``every``)."""
        now = time.monotonic()
        if self.ended or now - self.decided_at < self.every:
            return
        self.decided_at = now
        # alone, one process is every slot: it spreads the jobs' first hops over the shards
        shard = len(self.ledger.decisions) % self.shards if self.alone else self.shard
        self.ledger.decide(shard=shard, slot=0 if self.alone else self.slot)
