"""The body of one model-hop: load the state, train on the local shard, evaluate, save, record.

Runs and is tested without Airflow; the hop operator only adapts Airflow's context to it. A hop
reads the configuration from the run record, its shard from the worker's local cache, the
checkpoint (weights and optimizer state) named by its :class:`~mop_airflow.records.Assignment`,
writes the new checkpoint atomically, then its :class:`~mop_airflow.records.HopRecord`, and hands
the next hop an assignment that holds only ids and the checkpoint URI.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from mop_airflow.errors import TrainingError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records.retention import stale_checkpoints  # noqa: F401 - the retention rule, re-exported
from mop_airflow.records import Assignment, HopRecord, Manifest, RunRecord
from mop_airflow.planning.schedule import config_seed
from mop_airflow.training import progress
from mop_airflow.training.session import TaskSession

log = logging.getLogger(__name__)


# A shard file larger than a quarter of data.batch_mb (32 MB) streams through the hop: read whole,
# a shard takes ~6x its file size in memory (table, arrays, the shuffled copy, Keras's own). A
# streamed hop holds one window of about an eighth of data.batch_mb (16 MB, whole row groups) of
# stored rows, its decoded arrays and one batch, whatever the shard's size; TensorFlow
# itself takes ~0.74 GB (measured with benchmarks/data_scale.py and benchmarks/task_parallel.py).
WINDOW_SHARE = 0.125
STREAM_ABOVE_BATCHES = 0.25


@dataclass(frozen=True)
class Where:
    """Where the hop runs: for the record only (Airflow fills it in; tests may leave it empty)."""

    task_id: str | None = None
    host: str | None = None
    queue: str | None = None
    pool: str | None = None
    map_index: int = -1
    try_number: int = 1
    started_at: float | None = None  # when the task instance started, before the process set up


def run_hop(layout: RunLayout, run: RunRecord, manifest: Manifest, assignment: Assignment, *, t: int, shard: int,
            rung_end: bool = False, cache_dir: str, where: Where = Where(), session: TaskSession | None = None
            ) -> tuple[HopRecord, Assignment]:
    """Train ``assignment``'s configuration for its global hop ``t`` on ``shard``, and commit it.

    ``session`` holds what the hops of one task process share (the shard read once, compiled
    models); without one, the hop reads and builds everything itself.
    """
    trained = train_hop(layout, run, manifest, assignment, t=t, shard=shard, rung_end=rung_end, cache_dir=cache_dir,
                        where=where, session=session)
    record = trained.commit()
    return record, state_after(record)


def state_after(record: HopRecord) -> Assignment:
    """The assignment a committed hop hands its configuration's next hop."""
    return Assignment(config_id=record.config_id, t=record.t, checkpoint=record.checkpoint,
                      checkpoint_sha256=record.checkpoint_sha256, best_t=record.best_t,
                      best_metric=record.best_metric)


@dataclass
class TrainedHop:
    """A hop trained and its state taken out of the model, not yet in the store: :meth:`commit` packs
    the state and writes the checkpoint, then the hop record (what makes the hop count as done), then
    drops stale checkpoints.

    The shard loop commits on a writer thread while the next hop trains: the state's values were
    taken out of the model before (:func:`~mop_airflow.training.checkpoint.take_state`), so the model
    is free to train another configuration at once, and packing and hashing them (tens of
    milliseconds for a few MB) is off the training thread too.
    """

    layout: RunLayout
    run: RunRecord
    assignment: Assignment
    state: dict[str, list[Any]]  # take_state's values, until commit packs them
    meta: dict[str, Any]  # the checkpoint's meta: configuration, hop, shard
    record: dict[str, Any]  # the HopRecord's fields but the checkpoint's bytes and sha256, saved_at and the save timing
    finished: float  # when training and evaluation ended

    won: bool = True  # whether the record commit() wrote stands (False: another copy's was first)

    def commit(self, fence: bool = True) -> HopRecord:
        """Pack, save and record the hop; returns the record that stands. ``fence`` (the slot protocol's
        Rules.fence): two copies of one hop may commit at once (a try taken for dead that resumed beside
        its retry), so nothing either writes replaces what the other wrote: the checkpoint is created only
        where none is (else under its content's name), the record likewise; the first record stands, and
        the copy that finds it there (``won`` False) leaves it, removes its own checkpoint and deletes no
        stale one (its view of the best hop may differ)."""
        from mop_airflow.training.checkpoint import pack_state  # noqa: PLC0415

        store, cid, t = self.layout.store, self.assignment.config_id, self.record["t"]
        began = time.time()
        state = pack_state(self.state, self.meta)
        sha256 = sha256_of(state)
        packed = time.time()
        uri = self.record["checkpoint"]
        if not fence:
            store.write_bytes(uri, state)  # atomic: a reader sees the previous object or this one
        elif not store.create_bytes(uri, state):
            # an earlier try's, dead before its record, or another copy's: never replaced. Same bytes, same name
            uri = self.layout.checkpoint_uri(cid, t, sha256)
            store.write_bytes(uri, state)
        saved = time.time()
        fields = dict(self.record, checkpoint=uri, checkpoint_bytes=len(state), checkpoint_sha256=sha256)
        fields["timings"] = {**fields["timings"], "pack": packed - began, "save": saved - self.finished}
        record = HopRecord(**fields, saved_at=saved)
        self.state = {}  # the values may hold device memory: let them go
        record_uri = self.layout.hop_record_uri(cid, t)
        if not fence:
            record.write(store, record_uri)
        elif not record.create(store, record_uri):
            self.won = False
            standing = HopRecord.read(store, record_uri)
            if standing.checkpoint != uri:
                CLEANUP.delete(store, [uri])
            log.warning("%s t=%d: try %d of %s recorded it first; its record stands", cid, t, standing.try_number,
                        standing.task_id or "another task")
            return standing
        # Only once this hop is recorded: a retry of it still finds the state it started from. A delete
        # that fails is logged and tried again later, never the configuration's failure: the hop is committed.
        stale = stale_checkpoints(t, self.run.store.keep_checkpoints, record.best_t, self.assignment.best_t)
        CLEANUP.delete(store, [self.layout.checkpoint_uri(cid, old) for old in stale])
        return record


# A stale checkpoint is tried this many times in all: at the commit that made it stale, then at this
# process's next commits to the same store; a store holds at most CLEANUP_HELD of them waiting.
CLEANUP_TRIES = 3
CLEANUP_HELD = 1000


class Cleanup:
    """Deletes stale checkpoints; a delete that fails (a bucket that forbids DeleteObject, a request that
    failed for good) warns, naming the object and the error, and is tried again with the next commit to
    the same store in this process (or :meth:`retry`), :data:`CLEANUP_TRIES` times in all. An object
    still there after that only takes room: it is left, with a warning that says so."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, dict[str, int]] = {}  # store root -> {uri: failed tries}

    def delete(self, store: Any, uris: list[str]) -> None:
        """Delete ``uris`` (one request each on S3), and those that failed before on this store."""
        with self._lock:  # taken out while they are tried: another commit's thread does not try them too
            todo = self._waiting.pop(store.root, {})
        todo.update((uri, 0) for uri in uris if uri not in todo)
        failed: dict[str, int] = {}
        for uri, tries in todo.items():
            try:
                store.delete_file(uri)  # a missing object is no error: deleted meanwhile is deleted
            except Exception as exc:  # noqa: BLE001 - the hop is committed whatever the cleanup does
                tries += 1
                if tries < CLEANUP_TRIES:
                    failed[uri] = tries
                    log.warning("could not delete the stale checkpoint %s (%s: %s); its hop stays committed and "
                                "the delete is tried again with a later commit (try %d of %d)", uri,
                                type(exc).__name__, exc, tries, CLEANUP_TRIES)
                else:
                    self._left(uri, f"after {tries} tries ({type(exc).__name__}: {exc})")
        if not failed:
            return
        with self._lock:
            waiting = self._waiting.setdefault(store.root, {})
            waiting.update(failed)
            while len(waiting) > CLEANUP_HELD:  # the oldest goes: memory stays bounded
                oldest = next(iter(waiting))
                del waiting[oldest]
                self._left(oldest, f"as {CLEANUP_HELD} others wait to be deleted")

    def retry(self, store: Any) -> None:
        """Try again the deletes that failed on ``store`` (e.g. at the end of a block)."""
        self.delete(store, [])

    def waiting(self, store: Any) -> list[str]:
        """The stale checkpoints of ``store`` whose delete failed and is to be tried again."""
        with self._lock:
            return sorted(self._waiting.get(store.root, {}))

    @staticmethod
    def _left(uri: str, why: str) -> None:
        log.warning("gave up deleting the stale checkpoint %s %s: it stays in the store, unused. Fix: let the "
                    "workers' credentials delete objects in the store (s3:DeleteObject), or delete it by hand", uri,
                    why)


CLEANUP = Cleanup()  # the process's: every slot and hop of this process commits through it


def train_hop(layout: RunLayout, run: RunRecord, manifest: Manifest, assignment: Assignment, *, t: int, shard: int,
              rung_end: bool = False, cache_dir: str, where: Where = Where(), session: TaskSession | None = None,
              read_checkpoint: Callable[[str], tuple[bytes, Callable[[], str]]] | None = None) -> TrainedHop:
    """:func:`run_hop` up to the commit: load, train, evaluate, and take the state out of the model.

    ``read_checkpoint(uri)`` reads the input checkpoint: its bytes, and a function that returns their
    sha256 (the shard loop reads and hashes the next hop's ahead while this one trains, or hashes them
    on another thread while they are decoded); by default both here, one after the other.
    """
    clock = {"entered": time.time()}
    clock["started"] = where.started_at or clock["entered"]
    session = session or TaskSession(run, manifest, cache_dir)
    check_arrival(assignment, t)
    config = run.config(assignment.config_id)
    iteration = t // run.schedule.shards
    data = read_shard(layout, run, manifest, shard, cache_dir, session)
    clock["shard_read"] = time.time()

    # Keras and its backend load here
    from mop_airflow.training.hop import train_on_shard, train_streamed  # noqa: PLC0415

    threads = session.start_backend()
    clock["imported"] = time.time()
    seed = config_seed(run.schedule.seed, assignment.config_id)
    model, reused = session.model(config, seed=seed, fresh=not assignment.checkpoint)
    clock["built"] = time.time()
    checkpoint_bytes = restore_input(model, layout.store, run, assignment, read_checkpoint)
    clock["loaded"] = time.time()
    if data.streamed:
        from mop_airflow.data.cache import load_table  # noqa: PLC0415

        train = train_streamed(model, data.path, lambda table: load_table(table, manifest),
                               batch_size=config["batch_size"], epochs=config["epochs_per_hop"], seed=seed,
                               iteration=iteration, shard=shard,
                               window_rows=window_rows(data.entry, run, config["batch_size"]))
    else:
        train = train_on_shard(model, data.x, data.y, batch_size=config["batch_size"],
                               epochs=config["epochs_per_hop"], seed=seed, iteration=iteration, shard=shard)
    clock["trained"] = time.time()
    val, val_bytes = validate_when_due(model, layout.store, manifest, run, cache_dir, t=t, rung_end=rung_end,
                                       batch_size=config["batch_size"], session=session)
    clock["evaluated"] = time.time()
    return trained_hop(layout, run, assignment, model, t=t, shard=shard, where=where, clock=clock, train=train,
                       val=val, bytes_read={"metadata": data.metadata_bytes, "data": data.data_bytes + val_bytes,
                                            "checkpoint": checkpoint_bytes},
                       threads=threads, reused=reused)


def check_arrival(assignment: Assignment, t: int) -> None:
    """A hop trains only the state its configuration's previous hop left."""
    if assignment.t != t - 1:
        raise TrainingError(f"{assignment.config_id} arrives from hop {assignment.t} but this is hop {t}: the DAG "
                            "and the plan disagree. Fix: re-parse the DAG file and clear the run")


@dataclass(frozen=True)
class ShardData:
    """A hop's shard: its cached file, and its arrays unless it streams."""

    entry: Any  # the manifest's entry
    path: str
    streamed: bool
    x: Any
    y: Any
    metadata_bytes: int  # what the store read before the shard (the run's records)
    data_bytes: int  # what reading the shard read from the store: 0 once it is in this worker's cache


def read_shard(layout: RunLayout, run: RunRecord, manifest: Manifest, shard: int, cache_dir: str,
               session: TaskSession) -> ShardData:
    """``shard`` from the worker's cache (fetched into it first), decoded once per session unless it streams."""
    from mop_airflow.data.cache import cached_shard  # noqa: PLC0415

    store = layout.store
    metadata_bytes = store.bytes_read
    entry = manifest.shards[shard]
    path = cached_shard(store, entry, cache_dir, max_bytes=run.store.cache_max_bytes, manifest=manifest)
    streamed = streams(entry, run)
    x, y = (None, None) if streamed else session.arrays(path)
    return ShardData(entry=entry, path=path, streamed=streamed, x=x, y=y, metadata_bytes=metadata_bytes,
                     data_bytes=store.bytes_read - metadata_bytes)


def restore_input(model: Any, store: Any, run: RunRecord, assignment: Assignment,
                  read_checkpoint: Callable[[str], tuple[bytes, Callable[[], str]]] | None = None) -> int:
    """Put the state a hop starts from into ``model``: its configuration's checkpoint (checked against the
    sha256 its hop recorded), an earlier run's weights at a warm-started first hop, or nothing (the model
    holds its fresh build's). Returns the checkpoint bytes read."""
    from mop_airflow.training.checkpoint import restore_state  # noqa: PLC0415

    cid = assignment.config_id
    if not assignment.checkpoint:
        # its first hop: the earlier run's weights instead of random ones
        return warm_start(model, store, run.warm_start[cid]) if cid in run.warm_start else 0
    read = read_checkpoint or (lambda uri: with_digest(*read_hashed(store, uri)))
    state_in, digest = read(assignment.checkpoint)

    def verify() -> None:  # before the state is assigned: a corrupt one never trains
        found = digest()
        if found != assignment.checkpoint_sha256:
            raise _Corrupt(
                f"checkpoint {assignment.checkpoint} is corrupt: its sha256 is {found}, hop {assignment.t} "
                f"wrote {assignment.checkpoint_sha256}. Fix: clear {cid}'s hop {assignment.t} (and the hops "
                "after it) so it is trained and written again")
    try:
        meta = restore_state(model, state_in, expect={"config_id": cid, "t": assignment.t},
                             verify=verify if assignment.checkpoint_sha256 else None)
    except _Corrupt:
        raise
    except TrainingError as exc:
        raise TrainingError(f"{assignment.checkpoint}: {exc}") from exc
    if meta.get("copied_from"):  # a PBT copy: the source's weights and moments, its own learning rate
        model.optimizer.learning_rate = run.config(cid)["optimizer_params"]["learning_rate"]
    return len(state_in)


def validate_when_due(model: Any, store: Any, manifest: Manifest, run: RunRecord, cache_dir: str, *, t: int,
                      rung_end: bool, batch_size: int,
                      session: TaskSession | None) -> tuple[dict[str, float] | None, int]:
    """The validation metrics after hop ``t`` when it ends a rung or an evaluated iteration, else None;
    and the bytes the validation shard cost to read."""
    iteration, hop = divmod(t, run.schedule.shards)
    if not (rung_end or (hop == run.schedule.shards - 1 and run.schedule.evaluates_after(iteration))):
        return None, 0
    before = store.bytes_read
    val = evaluate_validation(model, store, manifest, run, cache_dir, batch_size=batch_size, session=session)
    return val, store.bytes_read - before


def trained_hop(layout: RunLayout, run: RunRecord, assignment: Assignment, model: Any, *, t: int, shard: int,
                where: Where, clock: dict[str, float], train: dict[str, Any], val: dict[str, float] | None,
                bytes_read: dict[str, int], threads: int | None, reused: bool) -> TrainedHop:
    """The hop ``model`` (holding its trained state) has trained, as :meth:`TrainedHop.commit` takes it:
    the state taken out of the model, its record's fields. ``clock`` holds the hop's moments by name."""
    from mop_airflow.training.checkpoint import take_state  # noqa: PLC0415

    cid = assignment.config_id
    iteration, hop = divmod(t, run.schedule.shards)
    best_t, best_metric = best_so_far(assignment, val, run.metric, run.direction, t)
    state = take_state(model)  # packed and hashed by the commit, on the shard loop's writer thread
    serialized = time.time()
    c = clock
    record = dict(
        config_id=cid, t=t, iteration=iteration, hop=hop, shard=shard, task_id=where.task_id,
        host=where.host or socket.getfqdn(), pid=os.getpid(), queue=where.queue, pool=where.pool,
        map_index=where.map_index, try_number=where.try_number,
        started_at=c["started"], execute_at=c["entered"], train_begin=c["loaded"], train_end=c["trained"],
        released_at=serialized,
        timings={"startup": c["entered"] - c["started"], "shard_read": c["shard_read"] - c["entered"],
                 "imports": c["imported"] - c["shard_read"], "build": c["built"] - c["imported"],
                 "checkpoint_load": c["loaded"] - c["built"], "train": c["trained"] - c["loaded"],
                 "evaluate": c["evaluated"] - c["trained"], "serialize": serialized - c["evaluated"]},
        train_metrics=train, val_metrics=val, checkpoint=layout.checkpoint_uri(cid, t), bytes_read=bytes_read,
        best_t=best_t, best_metric=best_metric, threads=threads,
        model_reused=reused, input_sha256=assignment.checkpoint_sha256,
    )
    return TrainedHop(layout=layout, run=run, assignment=assignment, state=state, record=record,
                      finished=c["evaluated"], meta={"config_id": cid, "t": t, "iteration": iteration, "hop": hop,
                                                     "shard": shard})


class _Corrupt(TrainingError):
    """A hop's input checkpoint is not the one its hop wrote."""


def read_hashed(store: Any, uri: str, *, tally: bool = True) -> tuple[bytes, str]:
    """A checkpoint's bytes and their sha256, to check against the one its hop recorded (``tally``: as
    the store's ``read_bytes``)."""
    data = store.read_bytes(uri, tally=tally)
    return data, sha256_of(data)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def with_digest(data: bytes, sha256: str) -> tuple[bytes, Callable[[], str]]:
    """:func:`read_hashed`'s answer as ``read_checkpoint`` gives it: the digest behind a function."""
    return data, lambda: sha256


def streams(entry: Any, run: RunRecord) -> bool:
    """A file larger than a few batch budgets is streamed; a small one is read whole (faster)."""
    return entry.bytes > STREAM_ABOVE_BATCHES * run.data.batch_mb * 1e6


def window_rows(entry: Any, run: RunRecord, batch_size: int) -> int:
    window_bytes = WINDOW_SHARE * run.data.batch_mb * 1e6
    return max(batch_size, int(entry.rows * window_bytes / max(1, entry.bytes)))


def evaluate_validation(model: Any, store: Any, manifest: Manifest, run: RunRecord, cache_dir: str, *,
                        batch_size: int, session: TaskSession | None = None) -> dict[str, float]:
    """``model``'s validation loss and compiled metrics on the run's validation shard (``val_`` names),
    read from the worker's shard cache, streamed when it is large."""
    from mop_airflow.data.cache import cached_shard, load_shard, load_table  # noqa: PLC0415
    from mop_airflow.training.hop import evaluate, evaluate_streamed  # noqa: PLC0415

    progress.long_step()  # the validation set's first fetch comes mid-block, and may be large
    held = cached_shard(store, manifest.validation, cache_dir, max_bytes=run.store.cache_max_bytes,
                        manifest=manifest)
    eval_batch = max(batch_size, 256)
    if streams(manifest.validation, run):
        return evaluate_streamed(model, held, lambda table: load_table(table, manifest), batch_size=eval_batch,
                                 window_rows=window_rows(manifest.validation, run, batch_size))
    xv, yv = session.arrays(held) if session is not None else load_shard(held, manifest)
    return evaluate(model, xv, yv, batch_size=eval_batch)


def warm_start(model: Any, store: Any, source: dict[str, Any]) -> int:
    """Restore an earlier run's checkpoint into ``model``: its weights, and its optimizer state only when the
    optimizer settings are the same (else the new configuration's own optimizer, fresh). Returns bytes read."""
    from mop_airflow.training.checkpoint import restore_state  # noqa: PLC0415

    data = store.read_bytes(source["checkpoint"])
    found = sha256_of(data)
    if source.get("checkpoint_sha256") and found != source["checkpoint_sha256"]:
        raise TrainingError(f"warm-start checkpoint {source['checkpoint']} of run {source['run_id']} is corrupt: its "
                            f"sha256 is {found}, its hop wrote {source['checkpoint_sha256']}. Fix: start from "
                            "another run (search.warm_start.from) or without search.warm_start")
    try:
        restore_state(model, data, expect={"config_id": source["config_id"], "t": source["t"]},
                      optimizer=source["optimizer"])
    except TrainingError as exc:
        raise TrainingError(f"warm start from {source['checkpoint']}: {exc}") from exc
    return len(data)


def best_so_far(assignment: Assignment, val: dict[str, float] | None, metric: str, direction: str,
                t: int) -> tuple[int | None, float | None]:
    """The configuration's best evaluated hop and metric, after hop ``t`` evaluated ``val`` (or not)."""
    value = (val or {}).get(metric)
    if value is None or not math.isfinite(value):
        return assignment.best_t, assignment.best_metric
    best = assignment.best_metric
    if best is None or (value < best if direction == "min" else value > best):
        return t, float(value)
    return assignment.best_t, best


def failure_of(error: BaseException) -> tuple[str, str]:
    """A hop's failure as its record says it: its status ("diverged" or "failed") and its cause."""
    status = "diverged" if str(error).startswith("diverged") else "failed"
    reason = f"{type(error).__name__}: {error}"
    if isinstance(error, MemoryError) or "ResourceExhausted" in type(error).__name__:
        reason = f"out of memory: {reason}. Fix: a smaller batch_size or model, or a worker with more memory"
    return status, reason[:1000]


def record_failure(layout: RunLayout, assignment: Assignment, *, t: int, shard: int, shards: int,
                   error: BaseException, where: Where = Where(), fence: bool = False) -> HopRecord:
    """Record why a configuration's hop failed: the report marks it failed with that reason, and an
    adaptive search prunes it. ``fence``: only where no record of the hop is; the record that stands is
    returned (another copy's, when one was first)."""
    iteration, hop = divmod(t, shards)
    status, reason = failure_of(error)
    record = HopRecord(config_id=assignment.config_id, t=t, iteration=iteration, hop=hop, shard=shard, status=status,
                       task_id=where.task_id, error=reason, try_number=where.try_number,
                       input_sha256=assignment.checkpoint_sha256)
    uri = layout.hop_record_uri(assignment.config_id, t)
    if not fence:
        record.write(layout.store, uri)
    elif not record.create(layout.store, uri):
        return HopRecord.read(layout.store, uri)
    return record
