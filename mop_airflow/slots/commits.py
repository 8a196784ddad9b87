"""Which hops of a block are committed, learnt with one listing a poll, off the training thread.

After each hop it records (its checkpoint, then its record: a commit or a failure), a slot leaves an
empty marker in its own folder, ``slots/<block>/commits/shard_<s>_slot_<k>/``, named so that the
names sort in the order they were left: ``<try>.<sequence>.<config>.<hop>``. A slot waiting for
hops lists only the folders of the slots its hops come from (the previous shard's slot that trains
the same configurations: one, whatever the number of configurations), each from the last name it
saw: on S3 one LIST request a poll that returns only the new names, where looking each waiting
configuration's next record up cost a request per configuration per poll. A poller thread does the
listing, backing off while nothing arrives; while the slot has a hop to train it lists only every
:data:`POLL_MOST_REMOTE` (0.5 s on S3), and the training thread only reads the sets it fills.

The slot's state machine (:class:`~mop_airflow.slots.machine.SlotMachine`) then asks for the
hop record a marker names when the hop it waits for is that one.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterable

from mop_airflow.records import HopRecord
from mop_airflow.records.layout import RunLayout

log = logging.getLogger(__name__)

# Polling for markers: fast while hops arrive, backing off while they don't. A local listing is a
# directory read (a GPU hop of the 1 M-weight CNN takes a tenth of a second, and each may wait for
# another slot's commit); on an object store it is a request.
POLL_FIRST, POLL_MOST = 0.002, 0.05
POLL_FIRST_REMOTE, POLL_MOST_REMOTE = 0.05, 0.5

Key = tuple[str, int]  # (configuration, global hop)


class CommitLog:
    """The markers one slot's try leaves, in order."""

    def __init__(self, layout: RunLayout, block: str, shard: int, slot: int, try_number: int) -> None:
        self.layout, self.try_number = layout, try_number
        self.folder = layout.slot_commits_uri(block, shard, slot)
        # The sequence is the wall clock in ns, kept rising: pollers list each folder from the last name
        # they saw, so a later try's names must sort after an earlier try's even when both have the same
        # try number (a run re-run outside Airflow, dag.test()). A count from 0 sorted before and went unseen.
        self._last = 0
        # The writer thread and the training thread both mark. The lock is held through the PUT: a poller
        # lists from the last name it saw, so a marker named earlier that landed after a later one (the
        # failure marked by the training thread while the writer's commit marker was still on its way) was
        # never listed, and the slot waiting for that hop found it only by looking it up after 60 s
        # (slot_sim seed 30812). In order, one PUT at a time: a marker is a few tens of ms on S3.
        self._lock = threading.Lock()

    def mark(self, record: HopRecord) -> None:
        """Say hop ``record`` is recorded; only after its record is written."""
        with self._lock:
            self._last = max(self._last + 1, time.time_ns())
            name = f"{self.try_number:04d}.{self._last:020d}.{record.config_id}.{record.t}"
            self.layout.store.write_bytes(f"{self.folder}/{name}", b"")


def later_try(names: Iterable[str], try_number: int, since_ns: int) -> int:
    """The latest try after ``try_number`` that left one of these markers (names) after ``since_ns`` (0: none).
    A marker of a later try from before (a run started again under the same id, tries counted from 1
    again) is not one: only a try that marks while this one runs has taken its place. The names' clock is
    the marking host's, a second or so apart from this one's at most: far less than Airflow takes to
    find a try gone and start its retry."""
    latest = 0
    for name in names:
        parts = name.split(".")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            number, sequence = int(parts[0]), int(parts[1])
            if number > try_number and sequence > since_ns:
                latest = max(latest, number)
    return latest


def _key(name: str) -> Key | None:
    parts = name.split(".")
    if name.startswith(".") or len(parts) < 4 or not parts[-1].isdigit():
        return None  # a local store's temporary file, or something else
    return ".".join(parts[2:-1]), int(parts[-1])


class CommitPoller:
    """Lists the markers of ``slots`` (``(shard, slot)``) while the loop waits for hops (:attr:`wanted`)."""

    def __init__(self, layout: RunLayout, block: str, slots: Iterable[tuple[int, int]], *,
                 own: tuple[int, int] | None = None, try_number: int = 0, began: float = 0.0) -> None:
        self.layout = layout
        self.folders = [layout.slot_commits_uri(block, s, k) for s, k in sorted(set(slots))]
        # this slot's own folder, listed like the others (an earlier try's markers): a marker a later try
        # left there since this try began says Airflow runs that try meanwhile (later_try)
        self.own = None if own is None else layout.slot_commits_uri(block, *own)
        self.try_number, self.began_ns = try_number, int(began * 1e9)
        self.later_try = 0  # the latest try of this slot seen marking since this one began (0: none)
        self.after = dict.fromkeys(self.folders, "")
        self.known: set[Key] = set()  # every hop whose marker was seen
        self._fresh: set[Key] = set()  # seen since the loop last took them
        self._lock = threading.Lock()
        self.arrived = threading.Event()  # set when a poll finds something new
        self.wanted = threading.Event()  # the loop has hops waiting for others: poll
        self.idle = threading.Event()  # and nothing to train meanwhile: poll fast
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.polls = 0
        remote = layout.store.protocol not in ("file", "memory")
        self.first, self.most = (POLL_FIRST_REMOTE, POLL_MOST_REMOTE) if remote else (POLL_FIRST, POLL_MOST)

    def poll(self) -> int:
        """One listing of each folder from its last name; returns how many hops it learnt of."""
        self.polls += 1
        found = set()
        for folder in self.folders:
            names = self.layout.store.names_after(folder, self.after[folder])
            if names:
                self.after[folder] = names[-1]
                if folder == self.own:
                    self.later_try = max(self.later_try, later_try(names, self.try_number, self.began_ns))
            found.update(k for k in map(_key, names) if k is not None)
        if found:
            with self._lock:
                self.known |= found
                self._fresh |= found
            self.arrived.set()
        return len(found)

    def look_own(self) -> int:
        """One listing of this slot's own folder for a marker a later try left since this one began;
        :attr:`later_try`."""
        if self.own is not None:
            names = self.layout.store.names_after(self.own, self.after.get(self.own, ""))
            self.later_try = max(self.later_try, later_try(names, self.try_number, self.began_ns))
        return self.later_try

    def take(self) -> set[Key]:
        """The hops learnt of since the last take (a poll's error is raised here, on the loop's thread)."""
        if self._error is not None:
            raise self._error
        with self._lock:
            fresh, self._fresh = self._fresh, set()
        self.arrived.clear()
        return fresh

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mop-commit-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wanted.set()  # wake it
        self.idle.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        interval = self.first
        while not self._stop.is_set():
            if not self.wanted.wait(1.0):
                continue
            if self._stop.is_set():
                return
            try:
                found = self.poll()
            except BaseException as exc:  # noqa: BLE001 - the loop raises it (a store gone fails the task)
                self._error = exc
                self.arrived.set()
                return
            if self.idle.is_set():  # the loop has nothing to train and waits for this: fast, backing off
                interval = self.first if found else min(interval * 2, self.most)
                self._stop.wait(interval)
            else:  # it trains: slowly, but at once when it runs out of work
                interval = self.first
                self.idle.wait(self.most)


def rewritten_after_marked(layout: RunLayout) -> list[str]:
    """The hops of a run whose record a later try wrote after a try had marked them committed: a retry
    that trained a committed hop again and overwrote its record. Every marker names the try that wrote
    it; a retry that finds a hop committed marks it again and leaves the earlier try's record as it was,
    so a hop may have several markers, and its record's try is never later than any of them."""
    store, out = layout.store, set()
    for folder in store.glob(f"{layout.run_uri}/slots/*/commits/*"):
        for name in store.names_after(folder):
            key = _key(name)
            if key is not None and HopRecord.read(store, layout.hop_record_uri(*key)).try_number > int(name[:4]):
                out.add(f"{key[0]} t={key[1]}")
    return sorted(out)
