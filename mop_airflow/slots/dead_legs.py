"""ASHA: a leg whose next hop is on a slot ended for good fails there, and the search goes on.

Part of the shard loop (:mod:`~mop_airflow.slots.driver`, a mixin on its state): before an idle slot
takes ASHA's next decision it checks the legs in flight (:func:`~mop_airflow.planning.asha_slots.dead_legs`),
judging their slots as its machine does (:class:`~mop_airflow.slots.peers.PeerView`), and records the
failure of a leg whose next hop will never train. When that hop is its leg's last no slot waits for it,
and the search would wait for the job for ever (the slot protocol's simulation, seed 539). Apart from
the loop because it is ASHA's alone, and writes to the store of its own accord (Rules.asha_dead_legs).
"""

from __future__ import annotations

import logging
import time

from mop_airflow.errors import TrainingError
from mop_airflow.planning.asha_slots import dead_leg_error, dead_legs
from mop_airflow.records import Assignment, HopRecord
from mop_airflow.slots.peers import PeerView
from mop_airflow.slots.status import HEARTBEAT_SECONDS, read_status
from mop_airflow.training.model_hop import record_failure

# the driver's logger: the loop's lines keep the name they had (a deployment may set its level)
log = logging.getLogger("mop_airflow.slots.driver")


class DeadLegs:
    """How the shard loop of an ASHA search fails the legs in flight whose next hop is on a dead slot."""

    def _fail_dead_legs(self) -> None:
        """ASHA: a job in flight whose next hop is on a slot that ended for good (failed for good, or died
        on its last try) fails there, with the cause. When that hop is its leg's last, no slot waits for
        it, and the search would wait for the job for ever (found by the slot protocol's simulation,
        seed 539). Checked at most once a heartbeat, when the slot has nothing ready."""
        now = time.time()
        if now - self.legs_checked_at < HEARTBEAT_SECONDS:
            return
        self.legs_checked_at = now
        store = self.layout.store

        def failed(config_id: str, t: int) -> bool:
            uri = self.layout.hop_record_uri(config_id, t)
            return store.exists(uri) and HopRecord.read(store, uri).status != "ok"

        for leg, t, shard, why in dead_legs(self.more.ledger.next_hops(), shards=self.more.shards, me=self.slot_of,
                                            gone=lambda owner: self._peer(owner, now).gone(now, self.wait),
                                            failed=failed):
            self._fail_for_good(leg.config_id, t, shard, why)

    def _fail_for_good(self, config_id: str, t: int, shard: int, why: str) -> None:
        """ASHA: record configuration ``config_id`` failed at its hop ``t`` (on ``shard``), which will never
        train; the search goes on without it."""
        failure = record_failure(self.layout, Assignment(config_id, t - 1, None), t=t, shard=shard,
                                 shards=self.run.schedule.shards, where=self.where,
                                 error=TrainingError(dead_leg_error(t, shard, why)),
                                 fence=self.machine.rules.fence)
        self.marks.mark(failure)
        self.machine.recorded(failure)
        if failure.error and why in failure.error:
            self.result.failed.append(failure)
        else:  # another copy recorded the hop first (Rules.fence): its record stands
            log.warning("%s t=%d: try %d of %s recorded it first; its record stands", config_id, t,
                        failure.try_number, failure.task_id)
        log.error("%s t=%d: its hop %s; %s is recorded failed and the search goes on", config_id, t, why, config_id)

    def _peer(self, owner: tuple[int, int], now: float) -> PeerView:
        """Slot ``owner`` as the machine sees it, its status read again at most once per heartbeat."""
        peer = self.machine.peer(owner, now)
        if now - peer.read_at >= min(HEARTBEAT_SECONDS, self.wait / 2):
            peer.read_at = now
            peer.read(read_status(self.layout, self.status.block, *owner), now)
        return peer
