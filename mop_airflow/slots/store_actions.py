"""The machine's reads and writes, carried out on the store by the shard loop.

Part of the shard loop (:mod:`~mop_airflow.slots.driver`, a mixin on its state): the records the listed
markers name, the peers' statuses, the inputs looked up though no marker named them, what an earlier
try committed (asking only what the machine's rule reads, in its order), and the machine's writes, each
record created fenced where the rules fence. Each answer goes back to the machine as an event. Apart
from the loop because these are the I/O the machine's decisions need, and decide nothing themselves.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from mop_airflow.records import Assignment, HopRecord
from mop_airflow.slots.messages import Check, Facts, Look, Read, ReadPeers, Write, takes_standing, write_step
from mop_airflow.slots.outcomes import ask_facts
from mop_airflow.planning.placement import BlockHop
from mop_airflow.slots.status import read_status

# the driver's logger: the loop's lines keep the name they had (a deployment may set its level)
log = logging.getLogger("mop_airflow.slots.driver")


class StoreActions:
    """How the shard loop answers the machine's :class:`~mop_airflow.slots.messages.Read`,
    :class:`~mop_airflow.slots.messages.ReadPeers`, :class:`~mop_airflow.slots.messages.Look`,
    :class:`~mop_airflow.slots.messages.Check` and :class:`~mop_airflow.slots.messages.Write`."""

    def _read_records(self, act: Read) -> None:
        """The records the listed markers name; one that a reader of this store cannot read yet (listed, but
        404 here for a while) is read again later: the machine waits for it as for a hop not listed."""
        found, missing = {}, []
        for key in act.keys:
            data = self.layout.store.read_if_there(self.layout.hop_record_uri(*key))
            if data is None:
                missing.append(key)
                log.warning("%s t=%d: its marker is listed but its record cannot be read yet; read again shortly", *key)
            else:
                found[key] = HopRecord.from_dict(json.loads(data))
        self.machine.read(found)
        if missing:
            self.machine.unreadable(missing)

    def _read_peers(self, act: ReadPeers) -> None:
        """The statuses of the slots the machine judges, read now."""
        now = time.time()
        for owner in act.owners:
            self.machine.peer_status(owner, read_status(self.layout, self.status.block, *owner), now)

    def _look(self, act: Look) -> None:
        """Whether the records of the hops' inputs are in the store though no marker named them."""
        store, found = self.layout.store, {}
        for hop, _, _ in act.hops:
            uri = self.layout.hop_record_uri(hop.config_id, hop.hop - 1)
            found[hop.config_id, hop.hop - 1] = record = HopRecord.read(store, uri) if store.exists(uri) else None
            if record is not None:
                log.info("%s: its input's record is in the store, though no marker named it", hop.label)
        self.machine.looked(act.hops, found)

    def _check(self, act: Check) -> None:
        """Whether an earlier try committed these hops (then learnt, and not trained again)."""
        for hop, earlier in self.machine.checked({(hop.config_id, hop.hop): self._facts(hop, state)
                                                  for hop, state in act.members}):
            self.result.committed.append(hop.label)
            if earlier.status != "ok" and earlier.dropped_after is None:
                self.result.failed.append(earlier)
            log.info("%s: already committed by try %d of %s; not trained again", hop.label, earlier.try_number,
                     earlier.task_id or "an earlier task")

    def _facts(self, hop: BlockHop, state: Assignment) -> Facts:
        """What the store says of ``hop`` for the machine's check, asking only what its rule reads, in its
        order (:func:`~mop_airflow.slots.outcomes.ask_facts`): a first try asks only of hops whose markers
        were listed, and reads their records at once."""
        store, cid, t = self.layout.store, hop.config_id, hop.hop
        uri = self.layout.hop_record_uri(cid, t)
        first_try = not self.machine.rerun  # (a run after a yield asks as a retry)
        return ask_facts(
            state, first_try=first_try, next_known=(cid, t + 1) in self.machine.known,
            record=lambda: HopRecord.read(store, uri) if first_try or store.exists(uri) else None,
            checkpoint_there=lambda record: bool(record.checkpoint) and store.exists(record.checkpoint),
            next_there=lambda: store.exists(self.layout.hop_record_uri(cid, t + 1)))

    def _write(self, act: Write | None) -> None:
        """The machine's writes, in order: a failure, a drop settled forward (unless a record is there: an
        earlier try's stays), a marker a retry found missing; each record then its marker."""
        store, fence = self.layout.store, self.machine.rules.fence
        for record, how in () if act is None else act.records:
            step = write_step(how, fence)
            if step == "mark":
                self.marks.mark(record)
                continue
            uri = self.layout.hop_record_uri(record.config_id, record.t)
            written = self._hop_record(record)
            if step == "create":
                # created only where no record is: one request, where a look and a write were two; a record
                # there (an earlier try's settle, or another copy's commit of the hop) stands
                if not written.create(store, uri):
                    self.machine.lost(record, HopRecord.read(store, uri) if takes_standing(how) else None)
                    continue
            elif step == "unless there" and store.exists(uri):
                continue
            else:
                written.write(store, uri)
            self.marks.mark(written)
            if how == "write":
                self.result.failed.append(written)
                log.info("%s t=%d recorded %s: %s", written.config_id, written.t, written.status, written.error)

    def _hop_record(self, record: Any) -> HopRecord:
        """The machine's record as this try writes it."""
        iteration, hop = divmod(record.t, self.run.schedule.shards)
        return HopRecord(config_id=record.config_id, t=record.t, iteration=iteration, hop=hop, shard=record.shard,
                         status=record.status, task_id=self.where.task_id, error=record.error,
                         try_number=self.where.try_number, input_sha256=record.input_sha256,
                         dropped_after=record.dropped_after)
