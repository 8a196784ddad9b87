"""Training on a shard larger than memory: stream its row groups, shuffled in windows.

A shard is one Parquet file on the worker's disk, written in row groups (one per record batch
that sharding wrote, a share of ``data.batch_mb``). One pass reads the row groups in a seeded
random order, a window of about ``window_rows`` rows (at least one row group) at a time; inside a
window the rows are shuffled, and the batches run on across windows. Row-level sharding already
made every row group a random sample of the data, so this shuffle is as good as a full one for
SGD. Memory holds one window (its stored rows and their arrays), whatever the shard's size. The
order is a pure function of (seed, iteration, shard, epoch) and of the file's row groups:
:func:`stream_order` gives it, so tests can feed plain Keras the very same batches.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np


def stream_windows(row_group_rows: list[int], window_rows: int, *, seed: int, iteration: int, shard: int,
                   epoch: int) -> list[tuple[list[int], np.ndarray]]:
    """Per window: the row groups it reads and the permutation of the window's rows."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, iteration, shard, epoch, 0x5742]))
    groups = rng.permutation(len(row_group_rows)).tolist()
    windows, current, rows = [], [], 0
    for group in groups:
        current.append(group)
        rows += row_group_rows[group]
        if rows >= window_rows:
            windows.append(current)
            current, rows = [], 0
    if current:
        windows.append(current)
    return [(window, rng.permutation(sum(row_group_rows[g] for g in window))) for window in windows]


def stream_order(row_group_rows: list[int], window_rows: int, **seeds: int) -> np.ndarray:
    """The whole pass as row numbers of the file (for tests and small shards; the stream never builds it)."""
    starts = np.cumsum([0, *row_group_rows])
    parts = []
    for groups, permutation in stream_windows(row_group_rows, window_rows, **seeds):
        rows = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in groups])
        parts.append(rows[permutation])
    return np.concatenate(parts)


def stream_batches(path: str, load: Any, *, batch_size: int, window_rows: int, seed: int, iteration: int,
                   shard: int, epoch: int) -> Iterator[tuple[Any, np.ndarray]]:
    """(x, y) batches of one pass; ``load(table) -> (x, y)`` turns Parquet rows into arrays.

    Each window is read (its row groups), decoded once by ``load`` and shuffled as arrays; the
    batches are slices of them. Decoding a window at once, not a batch at a time, costs one
    column-to-array conversion per window instead of one per batch (for 128 feature columns and
    batches of 256 rows that conversion was most of a streamed hop's time). A decoded shard
    (:mod:`~mop_airflow.data.decoded`) reads the window's row groups as arrays instead. Memory
    holds one window: its rows and their shuffled copy. Rows left over at the end of a window wait
    for the next one, so every batch but the last has ``batch_size`` rows, as in memory.
    """
    sizes, read = _window_reader(path, load)
    carry = None
    for groups, permutation in stream_windows(sizes, window_rows, seed=seed, iteration=iteration, shard=shard,
                                              epoch=epoch):
        x, y = read(groups)
        x, y = _take(x, permutation), y[permutation]
        if carry is not None:
            x, y = _concat(carry[0], x), np.concatenate([carry[1], y])
        usable = len(y) - len(y) % batch_size
        for start in range(0, usable, batch_size):
            yield _rows(x, start, start + batch_size), y[start:start + batch_size]
        # a copy, so the window's arrays are freed before the next window is read
        carry = (_take(x, np.arange(usable, len(y))), y[usable:].copy()) if usable < len(y) else None
    if carry is not None:
        yield carry


def _window_reader(path: str, load: Any) -> tuple[list[int], Any]:
    """The file's row-group sizes, and ``read(groups) -> (x, y)``: those groups' rows, in that order."""
    from mop_airflow.data.decoded import DecodedShard, is_decoded  # noqa: PLC0415

    if is_decoded(path):
        decoded = DecodedShard.open(path)
        return decoded.group_rows, decoded.read

    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    parquet = pq.ParquetFile(path)
    sizes = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
    return sizes, lambda groups: load(pa.concat_tables([parquet.read_row_group(g) for g in groups]))


def _take(x: Any, rows: np.ndarray) -> Any:
    return {name: values[rows] for name, values in x.items()} if isinstance(x, dict) else x[rows]


def _rows(x: Any, start: int, end: int) -> Any:
    return {name: values[start:end] for name, values in x.items()} if isinstance(x, dict) else x[start:end]


def _concat(a: Any, b: Any) -> Any:
    return {name: np.concatenate([a[name], b[name]]) for name in a} if isinstance(a, dict) else np.concatenate([a, b])


def count_rows(path: str) -> int:
    from mop_airflow.data.decoded import DecodedShard, is_decoded  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    return DecodedShard.open(path).rows if is_decoded(path) else pq.ParquetFile(path).metadata.num_rows


