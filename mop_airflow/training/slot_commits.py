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

Each configuration's state before its next hop (:class:`Chains`) is then read from the hop record
the marker names.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterable

from mop_airflow.records import Assignment, HopRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.training.model_hop import state_after

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
        self._lock = threading.Lock()  # the writer thread and the training thread both mark

    def mark(self, record: HopRecord) -> None:
        """Say hop ``record`` is recorded; only after its record is written."""
        with self._lock:
            self._last = max(self._last + 1, time.time_ns())
            sequence = self._last
        name = f"{self.try_number:04d}.{sequence:020d}.{record.config_id}.{record.t}"
        self.layout.store.write_bytes(f"{self.folder}/{name}", b"")


def _key(name: str) -> Key | None:
    parts = name.split(".")
    if name.startswith(".") or len(parts) < 4 or not parts[-1].isdigit():
        return None  # a local store's temporary file, or something else
    return ".".join(parts[2:-1]), int(parts[-1])


class CommitPoller:
    """Lists the markers of ``slots`` (``(shard, slot)``) while the loop waits for hops (:attr:`wanted`)."""

    def __init__(self, layout: RunLayout, block: str, slots: Iterable[tuple[int, int]]) -> None:
        self.layout = layout
        self.folders = [layout.slot_commits_uri(block, s, k) for s, k in sorted(set(slots))]
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
            found.update(k for k in map(_key, names) if k is not None)
        if found:
            with self._lock:
                self.known |= found
                self._fresh |= found
            self.arrived.set()
        return len(found)

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


def committed(layout: RunLayout, state: Assignment, t: int, known: set[Key] | None = None) -> HopRecord | None:
    """Hop ``t`` as an earlier try left it, when that try started from ``state``: a failure, or a
    commit (its record written, and its checkpoint there, or already taken on by the next hop).
    ``known``: the hops whose markers were listed (then an unlisted hop costs no request); None: the
    store is asked (a retried slot: an earlier try may have written a record and died before its marker).

    The hop after ``t`` is trained on the next shard, by a slot whose markers this one does not list:
    whether it took the state on is asked of the store, never of ``known``. A retry that took an
    unlisted next hop for "not committed" trained a committed hop again from a checkpoint already
    cleaned up, and overwrote its record."""
    cid = state.config_id
    store = layout.store
    if known is not None and (cid, t) not in known:
        return None
    uri = layout.hop_record_uri(cid, t)
    if known is None and not store.exists(uri):
        return None
    record = HopRecord.read(store, uri)
    if record.input_sha256 != state.checkpoint_sha256:
        return None  # it started from another state (a run cleared after its data or code changed)
    if record.status != "ok" or (record.checkpoint and store.exists(record.checkpoint)):
        return record
    if known is not None and (cid, t + 1) in known:
        return record
    return record if store.exists(layout.hop_record_uri(cid, t + 1)) else None


class Chains:
    """Each configuration's state before each of its hops, followed through the hop records in the
    store: a record counts only when it started from the state the one before it left."""

    def __init__(self, layout: RunLayout, firsts: Iterable[Assignment]) -> None:
        self.layout = layout
        # configuration -> global hop -> the state after it (verified along the chain from the block's start)
        self.states: dict[str, dict[int, Assignment]] = {}
        for start in firsts:
            self.states.setdefault(start.config_id, {})[start.t] = start
        self.failed: dict[str, HopRecord] = {}
        self.listed: set[Key] = set()  # hops whose markers were seen and whose records are still to read

    def learn(self, record: HopRecord) -> None:
        """A hop this process committed or found committed."""
        if record.status != "ok":
            self.failed[record.config_id] = record
        else:
            self.states.setdefault(record.config_id, {})[record.t] = state_after(record)

    def listen(self, keys: Iterable[Key]) -> None:
        """Hops whose markers a poll saw (a hop trained again, after a record from another state, too)."""
        self.listed.update(keys)

    def before(self, cid: str, t: int, *, look: bool = False) -> Assignment | HopRecord | None:
        """The state configuration ``cid``'s hop ``t`` starts from; a failure record when it failed
        before it; None while the hop before it is not committed (``look``: look in the store for a
        record no marker named, before giving a hop up).

        The hop before it was trained by the previous shard's slot, whose markers this slot lists; the
        hops between this slot's last knowledge of the configuration and that one were trained by slots
        it does not list. So the record a marker names is taken as it is (its slot checked its own input
        against the record before it), and checked here against the state before it when this slot
        knows that state: walking the records between would cost a read per shard and hop."""
        failed = self.failed.get(cid)
        if failed is not None and failed.t < t:
            return failed
        states = self.states.get(cid)
        if not states:
            return None
        if t - 1 in states:
            return states[t - 1]
        key = (cid, t - 1)
        uri = self.layout.hop_record_uri(*key)
        if key not in self.listed and not (look and self.layout.store.exists(uri)):
            return None
        record = HopRecord.read(self.layout.store, uri)
        self.listed.discard(key)  # read: a later marker of it (trained again) brings it back
        known = states.get(t - 2)
        # a dropped hop's record started from nothing: it says the configuration failed before it
        if known is not None and record.dropped_after is None and record.input_sha256 != known.checkpoint_sha256:
            return None  # left by an earlier run from another state: its hop will be trained again
        if record.status != "ok":
            self.failed[cid] = record
            return record
        states[record.t] = state_after(record)
        return states[record.t]
