"""Rules validation and sharding share: the size of the validation hold-out and the labels found.

Both read the source through these, so they agree on how many rows the hold-out takes and on the
classes a source without declared classes has.
"""

from __future__ import annotations

import math
from typing import Any


MAX_FOUND_CLASSES = 1000


def count_labels(labels: Any, counts: dict) -> None:
    """Add a batch's label counts to ``counts`` (nulls left out).

    Stops adding new values after ``MAX_FOUND_CLASSES + 1`` of them, so a float target read as
    classes cannot grow the dict with the data.
    """
    import pyarrow.compute as pc  # noqa: PLC0415

    for entry in pc.value_counts(labels):
        value = entry["values"].as_py()
        if value is not None and (value in counts or len(counts) <= MAX_FOUND_CLASSES):
            counts[value] = counts.get(value, 0) + entry["counts"].as_py()


def sorted_labels(counts: dict) -> list:
    """Found labels in a stable order: by type name, then value (ints and strings never compare)."""
    return sorted(counts, key=lambda v: (type(v).__name__, v))


def holdout_rows(rows: int, fraction: float) -> int:
    """Rows held out for validation: the fraction rounded half up, and at least one row."""
    return max(1, math.floor(rows * fraction + 0.5))


def min_rows_for(train_rows: int, fraction: float) -> int:
    """The fewest source rows that leave ``train_rows`` after holding out ``fraction``.

    ``n - holdout_rows(n)`` never decreases as ``n`` grows (it rises by 0 or 1 per row) and is at
    most ``n * (1 - fraction) + 0.5``, so stepping up from that lower bound finds the answer in
    about ``1 / (1 - fraction)`` steps.
    """
    rows = max(train_rows, math.floor((train_rows - 0.5) / (1.0 - fraction)) - 1)
    while rows - holdout_rows(rows, fraction) < train_rows:
        rows += 1
    return rows
