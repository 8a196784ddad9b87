"""What a shard slot says about itself, and what it makes of the slots it waits for.

Each slot writes its :class:`~mop_airflow.records.SlotStatus` (``slots/<block>/shard_<s>_slot_<k>.json``):
"running" with a heartbeat every :data:`HEARTBEAT_SECONDS` while its process lives, then once its
final word (done, yielded, failed). Every write goes through one lock, held for the whole write: a
heartbeat in flight when the slot ends (an S3 write retries for up to a minute) lands before the
final word, and none follows it, so the slots waiting for this one never read "running" after
"failed" or "done".

A slot waiting for another (:class:`Peer`) judges it by its progress count moving (batches trained,
hops committed, looks for hops), not by its heartbeat: a process whose training hangs may heartbeat
for ever. A try killed says no last word; on its last try (no retry writes again) a heartbeat silent
for the wait bound says it ended for good (:func:`~mop_airflow.training.slot_messages.died_on_last_try`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from mop_airflow.records import SlotStatus
from mop_airflow.records.layout import RunLayout
from mop_airflow.training import progress
from mop_airflow.training.model_hop import Where
from mop_airflow.training.slot_messages import died_on_last_try

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0  # how often a slot refreshes its status while it lives


class StatusWriter:
    """This slot's status, refreshed by a thread while the process lives; :meth:`stop` writes the last word."""

    def __init__(self, layout: RunLayout, block: str, shard: int, slot: int, where: Where, *, left: int,
                 last_try: bool = False) -> None:
        self.layout, self.block, self.shard, self.slot, self.where = layout, block, shard, slot, where
        self.last_try = last_try  # no retry follows this try: said in every write
        self.uri = layout.slot_status_uri(block, shard, slot)
        self.trained = 0
        self.left = left
        self.training: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._ended = False

    def start(self) -> None:
        self.write("running")
        self._thread = threading.Thread(target=self._beat_forever, name="mop-slot-heartbeat", daemon=True)
        self._thread.start()

    def hop_done(self) -> None:
        self.trained += 1
        self.left -= 1

    def _beat_forever(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.write("running")
            except Exception:  # noqa: BLE001 - a missed heartbeat is retried; the hops' own writes report the store
                log.warning("could not refresh the status of shard %d slot %d", self.shard, self.slot, exc_info=True)

    def stop(self, state: str, *, final: bool = False, error: str | None = None) -> None:
        self._stop.set()
        try:
            self.write(state, final=final, error=error, last=True)
        except Exception:  # noqa: BLE001 - the task's own error is the one to report
            log.warning("could not record shard %d slot %d as %s", self.shard, self.slot, state, exc_info=True)
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_SECONDS)

    def write(self, state: str, *, final: bool = False, error: str | None = None, last: bool = False) -> None:
        with self._lock:  # held for the whole write: see the module's docstring
            if self._ended:
                return
            self._ended = last
            SlotStatus(block=self.block, shard=self.shard, slot=self.slot, state=state, heartbeat=time.time(),
                       try_number=self.where.try_number, final=final, host=self.where.host or socket.getfqdn(),
                       pid=os.getpid(), task_id=self.where.task_id, trained=self.trained, left=max(0, self.left),
                       training=self.training, error=error, progress=progress.count(),
                       last_try=self.last_try).write(self.layout.store, self.uri)


class Peer:
    """Another slot of the block, as its status file shows it; read at most once per heartbeat."""

    def __init__(self, layout: RunLayout, block: str, shard: int, slot: int, *, began: float, since: float) -> None:
        self.layout, self.shard, self.slot = layout, shard, slot
        self.uri = layout.slot_status_uri(block, shard, slot)
        self.began = began - 1.0  # when the waiting slot's task began (a second for clocks apart)
        self.alive_at = since  # when its progress last moved (or when the waiting slot began to wait for it)
        self.read_at = 0.0
        self.latest: SlotStatus | None = None  # the newest try's last word, whenever it was said
        self.status: SlotStatus | None = None  # the same, unless an end said before the waiting slot began
        self.seen = False

    @property
    def name(self) -> str:
        return f"shard {self.shard} slot {self.slot}"

    def started(self, now: float, wait: float) -> bool:
        """Whether the peer runs (it ran since the waiting slot's task began) or ended its block (done,
        failed for good, or died on its last try) whenever that was; once seen, it is not read again for
        this. A peer that gave its pool slot back, or fails and waits for its retry, has not: another
        block may hold its pool."""
        if not self.seen:
            self._refresh(now, HEARTBEAT_SECONDS)
            latest = self.latest
            # a "done" said before this slot began counts too: a retried slot whose peers ended must not
            # give its pool slot back for them (in a run cleared since, their hops are committed anyway)
            self.seen = latest is not None and (latest.state == "done" or (latest.state == "failed" and latest.final)
                                                or (latest.state == "running" and latest.heartbeat >= self.began)
                                                or died_on_last_try(latest, now, wait))
        return self.seen

    def _refresh(self, now: float, every: float) -> None:
        if now - self.read_at < every:
            return
        self.read_at = now
        data = self.layout.store.read_if_there(self.uri)
        if data is None:
            return
        status = SlotStatus.from_dict(json.loads(data))
        before = self.latest
        if before is not None and status.try_number < before.try_number:
            return  # a late word of a try older than one already read
        if before is None or (status.try_number, status.state, status.progress) != (
                before.try_number, before.state, before.progress):
            self.alive_at = max(self.alive_at, now)
        self.latest = status
        # an end said before the waiting slot's task began may be an earlier try's of a run cleared since:
        # only its progress counts then, and the peer's new try says more soon
        self.status = status if status.state == "running" or status.heartbeat >= self.began else None

    def gone(self, now: float, wait: float) -> tuple[str, bool] | None:
        """Why the hops the waiting slot needs from the peer will not come, and whether never (the peer
        ended for good) or not within ``wait`` (it may still come: a retry of the waiting slot waits
        again); None while they may."""
        self._refresh(now, min(HEARTBEAT_SECONDS, wait / 2))
        status = self.status
        if status is not None and status.state == "failed" and status.final:
            return (f"{self.name} failed for good on its try {status.try_number} "
                    f"({(status.error or 'no error recorded').splitlines()[0]})", True)
        if status is not None and status.state == "done":
            return f"{self.name} finished its block without this hop's input (it lost it too)", True
        if died_on_last_try(self.latest, now, wait):
            return (f"{self.name} died on its last try {self.latest.try_number}: its heartbeat stopped "
                    f"{now - self.latest.heartbeat:.0f} s ago and no retry follows", True)
        if now - self.alive_at > wait:
            return (f"{self.name} made no progress for {now - self.alive_at:.0f} s (the bound is {wait:.0f} s, "
                    "MOP_SHARD_WAIT_SECONDS): it may be late (its pool slots held elsewhere) or hung", False)
        return None
