"""A worker's local copy of its shard, and reading a shard into the arrays Keras trains on.

A shard stays in place: its worker copies it from the store once and every later hop on that
worker reads the local file. Cache files are named by their sha256, so a new sharding never
reuses a stale file, and two processes copying the same shard at once both end with a good file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import time
import uuid

import numpy as np

from typing import Any, Iterator

from mop_airflow.data.decoded import DecodedShard, decoded_path, decodes, folder_bytes, is_decoded, write_decoded
from mop_airflow.data.inputs import SCALAR_INPUT, InputSpec, input_columns, to_arrays
from mop_airflow.errors import DataValidationError, StoreError
from mop_airflow.records import Manifest, ShardEntry
from mop_airflow.store import Store

_HASH_CHUNK = 1 << 20


# A cached file used this recently is never evicted: another hop on this worker may be about to
# open the path it was handed (every hop touches its shard, so a worker's own shard stays).
IN_USE_SECONDS = 600.0


def cached_shard(store: Store, entry: ShardEntry, cache_dir: str, *, max_bytes: int | None = None,
                 manifest: Manifest | None = None) -> str:
    """Local path of the shard (or validation set) described by manifest ``entry``.

    The first call copies it from the store and checks its sha256 (every part's, for a shard the
    slices scattered in parts, which are then gathered into one file); later calls only check the
    cached file and read nothing from the store. Each call marks the file used; after a copy, the
    least recently used files go until the cache holds at most ``max_bytes``.

    Given the ``manifest``, numeric rows are cached decoded instead (:mod:`~mop_airflow.data.decoded`):
    the path is then a folder of arrays, which :func:`load_shard` and the stream read.
    """
    if manifest is not None and decodes(manifest_inputs(manifest), entry):
        path = decoded_path(cache_dir, entry, _recipe(manifest))

        def present() -> bool:
            return os.path.isdir(path)

        def make() -> None:
            _decode_verified(store, entry, manifest, path)
    else:
        path = os.path.join(cache_dir, f"{entry.sha256}.parquet")

        def present() -> bool:  # a gathered file appears whole; a copied one is checked for its size
            return os.path.exists(path) and (bool(entry.parts) or os.path.getsize(path) == entry.bytes)

        def make() -> None:
            _gathered_shard(store, entry, cache_dir) if entry.parts else _copy_verified(store, entry, path)
    copied = False
    if not present():  # a hit (every hop's call) takes no lock
        with _one_maker(path):
            if not present():
                make()
                copied = True
    os.utime(path)  # the file's mtime is its last use
    if copied and max_bytes is not None:
        evict(cache_dir, max_bytes)
    return path


@contextlib.contextmanager
def _one_maker(path: str) -> Iterator[None]:
    """Only one process of this machine copies or decodes ``path`` at a time; the others wait for it
    and then find it made. Several shard pools of one machine (a laptop, the demo) stage at once, and
    each caches the validation set: without this, each copied and decoded it in full.

    Only a saving, not what keeps the cache whole (every copy is renamed into place complete), so
    the lock file goes afterwards, even though a process arriving then may make its own.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    lock = f"{path}.lock"
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_bytes(cache_dir: str) -> int:
    """What the shard cache holds on this machine's disk."""
    return sum(size for _, _, size in _cached_files(cache_dir))


def evict(cache_dir: str, max_bytes: int, *, now: float | None = None) -> list[str]:
    """Delete the least recently used cached shards until at most ``max_bytes`` remain; return them.

    Files used in the last :data:`IN_USE_SECONDS` stay even over the bound.
    """
    now = time.time() if now is None else now
    files = sorted(_cached_files(cache_dir), key=lambda f: f[1])  # least recently used first
    total = sum(size for _, _, size in files)
    evicted = []
    for path, used, size in files:
        if total <= max_bytes:
            break
        if now - used < IN_USE_SECONDS:
            continue
        try:
            shutil.rmtree(path) if is_decoded(path) else os.unlink(path)
        except FileNotFoundError:  # another process on this worker evicted it first
            pass
        total -= size
        evicted.append(path)
    return evicted


def _cached_files(cache_dir: str) -> list[tuple[str, float, int]]:
    """(path, last use, bytes) of every complete cached shard (temp files of copies in flight aside)."""
    out = []
    for name in os.listdir(cache_dir) if os.path.isdir(cache_dir) else []:
        if name.endswith(".parquet") or is_decoded(name):
            path = os.path.join(cache_dir, name)
            try:
                stat = os.stat(path)
                size = folder_bytes(path) if is_decoded(name) else stat.st_size
            except FileNotFoundError:
                continue
            out.append((path, stat.st_mtime, size))
    return out


def _gathered_shard(store: Store, entry: ShardEntry, cache_dir: str) -> str:
    """The parts of ``entry``, in slice order, concatenated row group by row group into one file.

    Memory holds one row group at a time. The file appears under its final name only when complete,
    so its presence means it is whole.
    """
    import pyarrow.parquet as pq  # noqa: PLC0415

    path = os.path.join(cache_dir, f"{entry.sha256}.parquet")
    if os.path.exists(path):
        return path
    tmp = f"{path}.gather-{uuid.uuid4().hex}"
    local_parts = [f"{tmp}.{i}" for i in range(len(entry.parts))]
    try:
        writer = None
        for part, local in zip(entry.parts, local_parts):
            _copy_verified(store, part, local)
            source = pq.ParquetFile(local)
            if writer is None:
                writer = pq.ParquetWriter(tmp, source.schema_arrow, use_dictionary=[source.schema_arrow.names[-1]])
            for group in range(source.num_row_groups):
                writer.write_table(source.read_row_group(group))
            os.unlink(local)
        writer.close()
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, *local_parts):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return path


def _decode_verified(store: Store, entry: ShardEntry, manifest: Manifest, path: str) -> None:
    """Copy ``entry``'s files one at a time (each checked against its sha256) and decode them into ``path``."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    locals_ = [os.path.join(folder, f"{part.sha256}.parquet.decode-{uuid.uuid4().hex}") for part in entry.files]

    def files() -> Any:
        for part, local in zip(entry.files, locals_):
            _copy_verified(store, part, local)
            yield local
            os.unlink(local)  # one stored file on disk at a time, beside the arrays

    try:
        write_decoded(files(), path, rows=entry.rows, inputs=manifest_inputs(manifest),
                      decode=lambda table: load_table(table, manifest))
    finally:
        for local in locals_:
            if os.path.exists(local):
                os.unlink(local)


def _recipe(manifest: Manifest) -> list[Any]:
    """What decoding a row depends on besides its bytes."""
    return [manifest.inputs or manifest.features, manifest.label, manifest.classes, manifest.task]


def _copy_verified(store: Store, entry: ShardEntry, path: str) -> None:
    """Copy ``entry``'s file to ``path``, checked against its sha256 before it appears there."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    # A private temp name per copy, checked before it is renamed into place: readers of ``path``
    # only ever see a complete, verified file, whichever process renames last.
    tmp = f"{path}.part-{uuid.uuid4().hex}"
    try:
        store.get_file(entry.uri, tmp)
        found = _file_sha256(tmp)
        if found != entry.sha256:
            raise StoreError(
                f"shard {entry.uri} is corrupt: its sha256 is {found}, the manifest says {entry.sha256}; "
                "delete the shard folder in the store and rerun the sharding task")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def manifest_inputs(manifest: Manifest) -> list[InputSpec]:
    """The model inputs a manifest records (one input of its scalar features for older manifests)."""
    if manifest.inputs:
        return [InputSpec.from_dict(d) for d in manifest.inputs]
    return [InputSpec(SCALAR_INPUT, "columns", tuple(manifest.features), (len(manifest.features),))]


def load_shard(path: str, manifest: Manifest) -> tuple[Any, np.ndarray]:
    """A cached shard as the model's input (an array, or a dict per input) and its targets."""
    if is_decoded(path):
        return DecodedShard.open(path).arrays()
    return load_xy(path, manifest_inputs(manifest), manifest.label, manifest.classes, manifest.task)


def load_xy(path: str, inputs: list[InputSpec], label: str, classes: list,
            task: str = "classification") -> tuple[Any, np.ndarray]:
    """``x`` per :func:`~mop_airflow.data.inputs.to_arrays`; ``y`` int32 index into ``classes``, or float32
    values for regression."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    table = pq.read_table(path, columns=[*input_columns(inputs), label])
    return to_arrays(table, inputs, where=path), targets(table[label], label, classes, task, path)


def load_table(table: Any, manifest: Manifest) -> tuple[Any, np.ndarray]:
    """Rows of a shard already read (a streamed window) as the model's input and targets."""
    return (to_arrays(table, manifest_inputs(manifest), where=manifest.source),
            targets(table[manifest.label], manifest.label, manifest.classes, manifest.task, manifest.source))


def targets(labels: Any, label: str, classes: list, task: str, where: str) -> np.ndarray:
    """Class indices (classification) or float32 values (regression) of a label column."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    if task == "regression":
        return labels.to_numpy().astype(np.float32)
    try:
        value_set = pa.array(list(classes)).cast(labels.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataValidationError(where, [
            f"label column {label!r} has type {labels.type}, but classes {list(classes)} cannot be cast to it; "
            "make data.classes the same type as the label column"]) from exc
    index = pc.index_in(labels, value_set=value_set)
    unknown = index.null_count
    if unknown:
        examples = pc.unique(pc.filter(labels, pc.is_null(index))).to_pylist()[:5]
        raise DataValidationError(where, [
            f"label column {label!r}: {unknown} values are not in classes {list(classes)} (e.g. {examples}); "
            "add them to data.classes or rerun validation and sharding"])
    return index.to_numpy().astype(np.int32)


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
