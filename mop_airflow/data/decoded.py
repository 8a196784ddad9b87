"""A worker's shard as decoded arrays on its disk: hops read rows, not Parquet.

Decoding Parquet costs a hop as much as training on it when the model is small: for an MLP on
128 float columns a pass over a 0.45 GB shard took 2.65 s, 1.2 s of it reading and decoding row
groups (benchmarks/task_parallel.py, 2-core machine). Stored as ``.npy`` files (one per input,
and the targets), a window is a few plain reads, and a second run over the same data decodes
nothing.

The folder ``<sha256>-<recipe>.arrays`` holds ``x.<input>.npy``, ``y.npy`` and ``arrays.json``
(the rows of each row group of the stored files, in row order, so a streamed pass reads the very
windows a Parquet pass reads; a window is one read per row group, whose rows lie together). It is
written under a temporary name and renamed into place: its presence means it is whole. ``recipe``
hashes how rows were decoded (inputs, label, classes), so a shard decoded for another spec is never
reused.

Only where the decoded rows take at most :data:`DECODED_RATIO` times the stored bytes (numeric
features: about the Parquet file's size), so the cache's disk use stays what it was; images and
tensors stored in narrower types stay Parquet files and are decoded per hop.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

SUFFIX = ".arrays"
DECODED_RATIO = 1.5
_META = "arrays.json"


def decodes(inputs: list[Any], entry: Any) -> bool:
    """Whether ``entry``'s rows are cached decoded: numeric inputs about the size they are stored in."""
    if not entry.rows or any(spec.kind == "image" for spec in inputs):
        return False
    per_row = sum(spec.size * np.dtype(spec.dtype).itemsize for spec in inputs) + 4  # + the target
    return per_row * entry.rows <= DECODED_RATIO * max(entry.bytes, 1)


def decoded_path(cache_dir: str, entry: Any, recipe: Any) -> str:
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return os.path.join(cache_dir, f"{entry.sha256}-{digest}{SUFFIX}")


def is_decoded(path: str) -> bool:
    return str(path).endswith(SUFFIX)


@dataclass(frozen=True)
class DecodedShard:
    """A decoded shard folder. Its rows are read with plain reads, not memory maps: a mapped page
    counts in the process's memory, so a pass over a mapped shard would grow with the shard."""

    path: str
    names: list[str]
    single: bool  # one model input: x is an array, not a dict by input name
    group_rows: list[int]

    @classmethod
    def open(cls, path: str) -> "DecodedShard":
        with open(os.path.join(path, _META)) as handle:
            meta = json.load(handle)
        return cls(path, meta["inputs"], meta["single"], meta["group_rows"])

    @property
    def rows(self) -> int:
        return sum(self.group_rows)

    def arrays(self) -> tuple[Any, np.ndarray]:
        """All rows, (x, y) in memory (for a shard small enough to train on whole)."""
        return self._rows([(0, self.rows)])

    def read(self, groups: list[int]) -> tuple[Any, np.ndarray]:
        """The rows of these row groups, in that order: one read of each group's bytes per array."""
        starts = np.cumsum([0, *self.group_rows]).tolist()
        return self._rows([(starts[g], starts[g + 1]) for g in groups])

    def head(self, rows: int) -> tuple[Any, np.ndarray]:
        return self._rows([(0, min(rows, self.rows))])

    def _rows(self, ranges: list[tuple[int, int]]) -> tuple[Any, np.ndarray]:
        x = {name: _read_ranges(os.path.join(self.path, f"x.{name}.npy"), ranges) for name in self.names}
        return (x[self.names[0]] if self.single else x), _read_ranges(os.path.join(self.path, "y.npy"), ranges)


def _read_ranges(path: str, ranges: list[tuple[int, int]]) -> np.ndarray:
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        shape, _, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)(handle)
        offset = handle.tell()
        row_items = int(np.prod(shape[1:], dtype=np.int64))
        out = np.empty((sum(end - start for start, end in ranges), *shape[1:]), dtype=dtype)
        flat = out.reshape(-1)
        at = 0
        for start, end in ranges:
            count = (end - start) * row_items
            handle.seek(offset + start * row_items * dtype.itemsize)
            if handle.readinto(memoryview(flat[at:at + count]).cast("B")) != count * dtype.itemsize:
                raise ValueError(f"{path} is shorter than its header says: rerun the stage task")
            at += count
        return out


class _ArrayWriter:
    """An ``.npy`` file written front to back: the header for ``rows`` rows, then each block's bytes."""

    def __init__(self, path: str, rows: int, dtype: Any, shape: tuple[int, ...]) -> None:
        self.handle = open(path, "wb")
        self.dtype = np.dtype(dtype)
        np.lib.format.write_array_header_1_0(self.handle, {
            "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": (rows, *shape)})

    def write(self, values: np.ndarray) -> None:
        self.handle.write(memoryview(np.ascontiguousarray(values, dtype=self.dtype)).cast("B"))

    def close(self) -> None:
        self.handle.close()


def write_decoded(files: Iterable[str], path: str, *, rows: int, inputs: list[Any],
                  decode: Callable[[Any], tuple[Any, np.ndarray]]) -> str:
    """Decode the Parquet ``files`` (in row order) into the folder ``path``; returns ``path``.

    Memory holds one row group at a time. If another process renamed its folder into place
    first, that one is kept (both decoded the same bytes the same way).
    """
    import pyarrow.parquet as pq  # noqa: PLC0415

    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    os.makedirs(tmp)
    writers: list[_ArrayWriter] = []
    try:
        x = {spec.name: _ArrayWriter(os.path.join(tmp, f"x.{spec.name}.npy"), rows, spec.dtype, spec.shape)
             for spec in inputs}
        writers.extend(x.values())
        y = None
        at, group_rows = 0, []
        for file in files:
            parquet = pq.ParquetFile(file)
            for group in range(parquet.num_row_groups):
                xs, ys = decode(parquet.read_row_group(group))
                n = len(ys)
                if at + n > rows:
                    raise ValueError(f"{file} holds more rows than its manifest entry's {rows}")
                if y is None:
                    y = _ArrayWriter(os.path.join(tmp, "y.npy"), rows, ys.dtype, ys.shape[1:])
                    writers.append(y)
                for spec in inputs:
                    x[spec.name].write(xs if len(inputs) == 1 else xs[spec.name])
                y.write(ys)
                at += n
                group_rows.append(n)
        if at != rows:
            raise ValueError(f"the stored files hold {at} rows, their manifest entry {rows}")
        for writer in writers:
            writer.close()
        with open(os.path.join(tmp, _META), "w") as handle:
            json.dump({"inputs": [spec.name for spec in inputs], "single": len(inputs) == 1,
                       "group_rows": group_rows}, handle)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.isdir(path):
                raise
    finally:
        for writer in writers:
            writer.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def folder_bytes(path: str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())
