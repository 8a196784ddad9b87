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

    Each window is read (its row groups) and decoded once by ``load``; each batch gathers its rows
    in the window's shuffled order. Decoding a window at once, not a batch at a time, costs one
    column-to-array conversion per window instead of one per batch (for 128 feature columns and
    batches of 256 rows that conversion was most of a streamed hop's time). A decoded shard
    (:mod:`~mop_airflow.data.decoded`) reads the window's row groups as arrays instead. Memory
    holds one window's rows and one batch. Rows left over at the end of a window wait
    for the next one, so every batch but the last has ``batch_size`` rows, as in memory.
    """
    sizes, read = _window_reader(path, load)
    carry = None  # rows left over from the windows before: fewer than a batch
    for groups, permutation in stream_windows(sizes, window_rows, seed=seed, iteration=iteration, shard=shard,
                                              epoch=epoch):
        x, y = read(groups)
        at = 0
        if carry is not None:  # first complete the batch the windows before began
            at = min(batch_size - len(carry[1]), len(y))
            head = permutation[:at]
            carry = _concat(carry[0], _take(x, head)), np.concatenate([carry[1], y[head]])
            if len(carry[1]) == batch_size:
                yield carry
                carry = None
        # Each batch gathers its own rows of the shuffled window: shuffling the window first, then
        # prepending the carried rows, wrote and read two more window-sized copies per window, a
        # fifth of a small MLP's training time (benchmarks/task_parallel.py)
        full = at + (len(y) - at) // batch_size * batch_size
        for start in range(at, full, batch_size):
            rows = permutation[start:start + batch_size]
            yield _take(x, rows), y[rows]
        if full < len(y):
            carry = _take(x, permutation[full:]), y[permutation[full:]]
        del x, y  # freed before the next window is read
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


def _concat(a: Any, b: Any) -> Any:
    return {name: np.concatenate([a[name], b[name]]) for name in a} if isinstance(a, dict) else np.concatenate([a, b])


def count_rows(path: str) -> int:
    from mop_airflow.data.decoded import DecodedShard, is_decoded  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    return DecodedShard.open(path).rows if is_decoded(path) else pq.ParquetFile(path).metadata.num_rows


