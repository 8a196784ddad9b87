"""The machine's hops trained and committed by the shard loop: training, the writer's commits, failures.

Part of the shard loop (:mod:`~mop_airflow.slots.driver`, a mixin on its state): a hop trained (a fused
group as one program, its members alone if the program fails; once more after letting the kept models
go when the device ran out of memory), its input read and hashed ahead, its commit on the writer thread
(fenced), the finished commits taken in, and a configuration that failed told to the machine. Apart from
the loop because this is the work the slot does for the machine's decisions, and decides nothing.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable

from mop_airflow.records import Assignment, HopRecord
from mop_airflow.slots.messages import Train
from mop_airflow.planning.placement import BlockHop
from mop_airflow.training import progress
from mop_airflow.training.fused import train_fused_hop
from mop_airflow.training.model_hop import failure_of, read_hashed, sha256_of, train_hop, with_digest
from mop_airflow.training.session import out_of_memory

# the driver's logger: the loop's lines keep the name they had (a deployment may set its level)
log = logging.getLogger("mop_airflow.slots.driver")


class TrainActions:
    """How the shard loop carries out the machine's :class:`~mop_airflow.slots.messages.Train` and
    tells it of each commit (``trained_ok``, ``committed``, ``commit_lost``, ``commit_failed``,
    ``trained_failed``)."""

    def _train_hops(self, act: Train, commits: list[tuple[BlockHop, Assignment, Future]], ahead: dict[str, Future],
                    writer: ThreadPoolExecutor, reader: ThreadPoolExecutor, hasher: ThreadPoolExecutor) -> None:
        """The machine's :class:`~mop_airflow.slots.messages.Train`: its hops trained (one fused program when
        several) while the next ready one's checkpoint is read ahead; each that trained goes to the writer."""
        for _, later in act.ahead:  # read and hash the next ready model's checkpoint while this one trains
            if later.checkpoint and later.checkpoint not in ahead:
                # not tallied on that thread: the hop that takes it counts it (store.bytes_read
                # deltas are a hop's own reads)
                ahead[later.checkpoint] = reader.submit(read_hashed, self.layout.store, later.checkpoint,
                                                        tally=False)
        members = list(act.members)
        trained = (self._train_fused(members, ahead, hasher) if len(members) > 1
                   else [(hop, state, self._train(hop, state, ahead, hasher)) for hop, state in members])
        for member, member_state, done in trained:
            if done is not None:
                self.machine.trained_ok(member)
                commits.append((member, member_state, writer.submit(self._commit, done)))

    def _train(self, hop: BlockHop, state: Assignment, ahead: dict[str, Future], hasher: ThreadPoolExecutor) -> Any:
        """Train one hop; returns what to commit, or None (it failed, and is recorded)."""
        layout = self.layout
        taken = time.time()
        self.status.training = hop.label
        where = replace(self.where, started_at=taken)
        read = self._reader(ahead, hasher)
        log.info("%s on shard %d from %s", hop.label, hop.shard, state.checkpoint or "its initial weights")
        try:
            for again in (False, True):
                held = self.session.held
                try:
                    return train_hop(layout, self.run, self.manifest, state, t=hop.hop, shard=hop.shard,
                                     rung_end=hop.rung_end, cache_dir=self.cache_dir, where=where,
                                     session=self.session, read_checkpoint=read)
                except Exception as exc:
                    if self.fatal(exc):
                        raise
                    # the models this process keeps may be what filled the device: let them go and train the
                    # hop again before the configuration is blamed (its own model is built afresh)
                    if again or not out_of_memory(exc) or held == 0:
                        self._failed(hop, state, exc)
                        return None
                    log.warning("%s ran out of memory with %d compiled model(s) kept (%s): they are let go and the "
                                "hop trains again", hop.label, held, exc)
                    self.session.empty()
            return None
        finally:
            self.status.training = None

    def _train_fused(self, members: list[tuple[BlockHop, Assignment]], ahead: dict[str, Future],
                     hasher: ThreadPoolExecutor) -> list[tuple[BlockHop, Assignment, Any]]:
        """Train a fused group's hops (``schedule.fuse``: one shard, one hop, one program) and return each
        member's to commit (None: failed and recorded). A member whose input does not restore or whose
        loss diverges fails alone; if the group's program itself fails, its members train alone."""
        first = members[0][0]
        where = replace(self.where, started_at=time.time())
        self.status.training = ", ".join(hop.label for hop, _ in members)
        log.info("%s fused on shard %d", self.status.training, first.shard)
        try:
            results = train_fused_hop(self.layout, self.run, self.manifest, [state for _, state in members],
                                      t=first.hop, shard=first.shard, rung_end=first.rung_end,
                                      cache_dir=self.cache_dir, where=where, session=self.session,
                                      read_checkpoint=self._reader(ahead, hasher))
        except Exception as exc:
            if self.fatal(exc):
                raise
            log.warning("%s: the fused program failed (%s: %s); its members train alone", self.status.training,
                        type(exc).__name__, exc)
            self.session.empty()
            return [(hop, state, self._train(hop, state, ahead, hasher)) for hop, state in members]
        finally:
            self.status.training = None
        out = []
        for (hop, state), result in zip(members, results):
            if isinstance(result, Exception):
                if self.fatal(result):
                    raise result
                self._failed(hop, state, result)
                result = None
            out.append((hop, state, result))
        return out

    def _reader(self, ahead: dict[str, Future], hasher: ThreadPoolExecutor) -> Callable[[str], tuple[bytes, Any]]:
        """How a hop reads its input checkpoint: read and hashed ahead (``ahead``), or hashed on another thread
        (hashlib lets go of the GIL) while the bytes are decoded."""
        store = self.layout.store

        def read(uri: str) -> tuple[bytes, Callable[[], str]]:
            future = ahead.pop(uri, None)
            if future is None:
                data = store.read_bytes(uri)
                return data, hasher.submit(sha256_of, data).result
            data, sha256 = future.result()
            store.bytes_read += len(data)
            return with_digest(data, sha256)

        return read

    def _settle(self, commits: list[tuple[BlockHop, Assignment, Future]], *, block: bool, every: bool = False) -> None:
        """Take the finished commits (``block``: wait for the oldest, ``every``: for all). A commit that
        failed goes the way of a hop that failed: a fatal error (the store went away) ends the task, any
        other fails its configuration."""
        while commits and (commits[0][2].done() or block):
            hop, state, future = commits.pop(0)
            try:
                record, won = future.result()
            except Exception as exc:
                if self.fatal(exc):
                    raise
                self._failed(hop, state, exc, commit=True)
                continue
            progress.tick()
            if not won:  # another copy of the hop committed it first (Rules.fence): its record stands
                self.result.committed.append(hop.label)
                self.machine.commit_lost(record)
                log.warning("%s: try %d of %s committed it first; its record stands and this copy's is not written",
                            hop.label, record.try_number, record.task_id or "another task")
                continue
            self.result.trained.append(record)
            self.machine.committed(record)
            self.status.hop_done()
            if self.on_hop is not None:
                self.on_hop(record)
            if not every:
                block = False

    def _commit(self, trained: Any) -> tuple[HopRecord, bool]:
        """On the writer thread: the hop's checkpoint and record, then its marker for the waiting slots; the
        record that stands, and whether it is this one (fenced, another copy's may have been first)."""
        record = trained.commit(fence=self.machine.rules.fence)
        if trained.won:
            self.marks.mark(record)
        return record, trained.won

    def _failed(self, hop: BlockHop, state: Assignment, exc: BaseException, *, commit: bool = False) -> None:
        """Configuration ``hop.config_id`` failed at ``hop`` (or its commit did): the machine has it recorded
        next; the other configurations go on."""
        self.session.forget(self.run.config(hop.config_id))
        status, reason = failure_of(exc)
        (self.machine.commit_failed if commit else self.machine.trained_failed)(hop, state, status, reason)
        log.error("%s %s; its remaining hops are dropped, the other configurations go on", hop.label, status,
                  exc_info=exc)
