"""Small synthetic tables for the data tests."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def make_columns(rows: int, *, features: int = 3, classes: tuple = (0, 1, 2), seed: int = 0) -> dict:
    """x0 is the row number (exact in float32), so tests can tell which rows went where."""
    rng = np.random.default_rng(seed)
    columns = {"x0": np.arange(rows, dtype=np.float64)}
    for i in range(1, features):
        columns[f"x{i}"] = rng.normal(size=rows)
    columns["label"] = np.asarray(classes)[np.arange(rows) % len(classes)]
    return columns


def write_parquet(path, columns: dict) -> str:
    pq.write_table(pa.table(columns), str(path))
    return str(path)


def tree(directory) -> list[str]:
    """Every file under ``directory``, relative; [] when it does not exist."""
    return sorted(os.path.relpath(os.path.join(top, name), directory)
                  for top, _, names in os.walk(directory) for name in names)
