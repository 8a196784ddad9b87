"""Reading the source table (Parquet or CSV, local path or fsspec URI) and the size of its split.

Validation and sharding both read the source through here, so they agree on how a file is parsed
and on how many rows the validation hold-out takes.
"""

from __future__ import annotations

import hashlib
import io
import math
from typing import Any, Mapping

import pyarrow as pa


def is_csv(uri: str) -> bool:
    return uri.lower().split("?")[0].endswith(".csv")


def read_source_bytes(uri: str, storage_options: Mapping[str, Any] | None = None,
                      conn_id: str | None = None) -> bytes:
    """The raw bytes of ``uri``; read once so the same bytes are hashed and parsed.

    ``conn_id`` names an Airflow AWS connection whose credentials and endpoint are used for s3://.
    """
    import fsspec  # noqa: PLC0415 - keep DAG parsing light

    options = dict(storage_options or {})
    if conn_id and uri.startswith("s3://"):
        from mop_airflow.airflow.connections import s3_options_from_connection  # noqa: PLC0415

        options = {**s3_options_from_connection(conn_id), **options}
    with fsspec.open(uri, "rb", **options) as handle:
        return handle.read()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_table(raw: bytes, uri: str) -> pa.Table:
    """A pyarrow Table from the bytes of a Parquet or CSV file (format told by ``uri``'s extension)."""
    if is_csv(uri):
        import pyarrow.csv as pa_csv  # noqa: PLC0415

        return pa_csv.read_csv(io.BytesIO(raw))
    import pyarrow.parquet as pq  # noqa: PLC0415

    return pq.read_table(io.BytesIO(raw))


def column_names(raw: bytes, uri: str) -> list[str]:
    """Column names without parsing the whole file (Parquet footer, or the CSV's first block)."""
    if is_csv(uri):
        import pyarrow.csv as pa_csv  # noqa: PLC0415

        return list(pa_csv.open_csv(io.BytesIO(raw)).schema.names)
    import pyarrow.parquet as pq  # noqa: PLC0415

    return list(pq.read_schema(io.BytesIO(raw)).names)


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
