"""What a shard slot says about itself, and what it makes of the slots it waits for.

Each slot writes its :class:`~mop_airflow.records.SlotStatus` (``slots/<block>/shard_<s>_slot_<k>.json``):
"running" with a heartbeat every :data:`HEARTBEAT_SECONDS` while its process lives, then once its
final word (done, yielded, failed). Every write goes through one lock, held for the whole write: a
heartbeat in flight when the slot ends (an S3 write retries for up to a minute) lands before the
final word, and none follows it, so the slots waiting for this one never read "running" after
"failed" or "done".

A slot waiting for another judges it by its progress count moving (batches trained, hops committed,
looks for hops), not by its heartbeat: a process whose training hangs may heartbeat for ever
(:class:`~mop_airflow.slots.peers.PeerView`, fed with :func:`read_status`). A try killed says
no last word; on its last try (no retry writes again) a heartbeat silent for the wait bound says it ended for good
(:func:`~mop_airflow.slots.messages.died_on_last_try`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from mop_airflow.records import SlotStatus
from mop_airflow.slots.messages import ended_or_never_started, never_started  # noqa: F401 - re-exported
from mop_airflow.records.layout import RunLayout
from mop_airflow.training import progress
from mop_airflow.training.model_hop import Where

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0  # how often a slot refreshes its status while it lives


class StatusWriter:
    """This slot's status, refreshed by a thread while the process lives; :meth:`stop` writes the last word."""

    def __init__(self, layout: RunLayout, block: str, shard: int, slot: int, where: Where, *, left: int,
                 last_try: bool = False) -> None:
        self.layout, self.block, self.shard, self.slot, self.where = layout, block, shard, slot, where
        self.last_try = last_try  # no retry follows this try: said in every write
        self.yielding_since: float | None = None  # when this try first gave its pool slot back, if it did
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

    def abandon(self) -> None:
        """End without a last word (a later try of the slot runs: the status is its own now)."""
        self._stop.set()
        with self._lock:
            self._ended = True
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
                       last_try=self.last_try, yielding_since=self.yielding_since).write(self.layout.store, self.uri)


def read_status(layout: RunLayout, block: str, shard: int, slot: int) -> SlotStatus | None:
    """Slot ``(shard, slot)``'s status file as it is now (None: it wrote none yet)."""
    data = layout.store.read_if_there(layout.slot_status_uri(block, shard, slot))
    return None if data is None else SlotStatus.from_dict(json.loads(data))


def yielding_since(layout: RunLayout, block: str, shard: int, slot: int, try_number: int) -> float | None:
    """When this try of slot ``(shard, slot)`` first gave its pool slot back, as its last word says (None:
    it has not yielded). A reschedule keeps the try's number; a retry or a cleared task does not."""
    status = read_status(layout, block, shard, slot)
    if status is None or status.state != "yielded" or status.try_number != try_number:
        return None
    return status.yielding_since if status.yielding_since is not None else status.heartbeat


def end_never_started(layout: RunLayout, block: str, owners: list[tuple[int, int]], why: str,
                      state: str = "failed") -> list[tuple[int, int]]:
    """Say for each slot ``(shard, slot)`` that never started that it failed for good (its task is failed
    in Airflow at the same time): the slots of the block still waiting for it then stop waiting, and
    ASHA fails the configurations whose next hop is on it, instead of waiting for ever. Written with the
    slot's own try number if it said anything (a yield), so readers take it as its latest word. Returns
    the slots said so (a slot running, done, or failed for good already is left as it is)."""
    ended = []
    for shard, slot in owners:
        before = read_status(layout, block, shard, slot)
        if not never_started(before):
            continue  # it started meanwhile, or ended: its own words stand
        ended.append((shard, slot))
        SlotStatus(block=block, shard=shard, slot=slot, state=state, heartbeat=time.time(),
                   try_number=before.try_number if before is not None else 1, final=state == "failed",
                   error=f"never started: {why}"[:1000]).write(layout.store, layout.slot_status_uri(block, shard, slot))
    return ended
