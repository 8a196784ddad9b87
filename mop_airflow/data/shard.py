"""Splitting the training data once into ``p`` shards that stay in place while models hop.

Shards live at ``<root>/<dag_id>/shards/<fingerprint>/`` where the fingerprint covers the input
bytes, the column roles, the shard count, the seed and the validation split: the same input and
seed find the same shards and reuse them; anything else gets a new folder. The manifest is written
last, so a manifest always points at complete shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from datetime import datetime, timezone
import numpy as np
import pyarrow as pa

from mop_airflow.data.table import column_names, holdout_rows, parse_table, read_source_bytes, sha256_hex
from mop_airflow.data.validate import resolve_features
from mop_airflow.errors import DataValidationError
from mop_airflow.records import Manifest, ShardEntry
from mop_airflow.spec import DataSpec
from mop_airflow.store import Store, safe_segment

MANIFEST = "manifest.json"


def shard_dataset(data: DataSpec, store: Store, dag_id: str, shards: int, seed: int) -> Manifest:
    """Shard ``data.source`` into ``shards`` Parquet files (or reuse them) and return the manifest.

    Expects data that passed :func:`~mop_airflow.data.validate.validate_source`. The returned
    manifest has ``reused=True`` when an identical sharding was already complete in the store.
    """
    raw = read_source_bytes(data.source, data.storage_options, data.conn_id)
    separate = isinstance(data.validation, str)
    raw_validation = read_source_bytes(data.validation, data.storage_options, data.conn_id) if separate else None
    features = resolve_features([c for c in column_names(raw, data.source) if c != data.label], data.features)
    # numpy scalars (np.int64(3)) would hash and serialise differently from the same plain value
    classes = [c.item() if isinstance(c, np.generic) else c for c in data.classes]
    fingerprint = shard_fingerprint(
        source_sha256=sha256_hex(raw),
        validation=data.validation,
        validation_sha256=sha256_hex(raw_validation) if separate else None,
        features=features, label=data.label, classes=classes, shards=shards, seed=seed,
    )
    folder = (safe_segment(dag_id), "shards", fingerprint)

    existing = _complete_manifest(store, store.uri(*folder, MANIFEST))
    if existing is not None:
        return dataclasses.replace(existing, reused=True)

    table = _training_columns(parse_table(raw, data.source), data.source, features, data.label)
    order = np.random.default_rng(seed).permutation(table.num_rows)
    if separate:
        train_rows = order
        validation = _training_columns(parse_table(raw_validation, data.validation), data.validation,
                                       features, data.label)
        # Same schema as the shards, so one reader serves both.
        validation = validation.cast(table.schema)
    else:
        held_out = holdout_rows(table.num_rows, data.validation)
        validation = table.take(order[:held_out])
        train_rows = order[held_out:]

    # array_split makes contiguous parts whose sizes differ by at most one row.
    shard_entries = [
        _write_parquet(store, store.uri(*folder, f"shard-{index:05d}.parquet"), table.take(rows), index=index)
        for index, rows in enumerate(np.array_split(train_rows, shards))
    ]
    validation_entry = _write_parquet(store, store.uri(*folder, "validation.parquet"), validation)
    manifest = Manifest(
        fingerprint=fingerprint, source=data.source, features=features, label=data.label, classes=classes,
        seed=seed, schema={f.name: str(f.type) for f in table.schema}, shards=shard_entries,
        validation=validation_entry, total_rows=sum(entry.rows for entry in shard_entries),
        created_at=datetime.now(timezone.utc).isoformat(),
    )
    manifest.write(store, store.uri(*folder, MANIFEST))
    return manifest


def shard_fingerprint(*, source_sha256: str, validation: float | str, validation_sha256: str | None,
                      features: list[str], label: str, classes: list, shards: int, seed: int) -> str:
    """16 hex characters that change whenever the shards' content would change."""
    key = {
        "source_sha256": source_sha256,
        "validation": validation,
        "validation_sha256": validation_sha256,
        "features": list(features),
        "label": label,
        # repr keeps 1 and "1" apart; json alone would not for some types
        "classes": [repr(c) for c in classes],
        "shards": shards,
        "seed": seed,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _complete_manifest(store: Store, manifest_uri: str) -> Manifest | None:
    """The stored manifest when it and every file it lists exist, else None (reshard)."""
    if not store.exists(manifest_uri):
        return None
    manifest = Manifest.read(store, manifest_uri)
    entries = [*manifest.shards, manifest.validation]
    return manifest if all(store.exists(entry.uri) for entry in entries) else None


def _training_columns(table: pa.Table, uri: str, features: list[str], label: str) -> pa.Table:
    """Features as float32 (what the model reads) followed by the label in its original type."""
    missing = [c for c in [*features, label] if c not in table.column_names]
    if missing:
        raise DataValidationError(uri, [
            f"column {c!r} is missing; run validate_source first and fix data.features or data.label"
            for c in missing])
    # safe=False: large integers lose precision in float32 by design, instead of raising.
    columns = [table[c].cast(pa.float32(), safe=False) for c in features] + [table[label]]
    return pa.Table.from_arrays(columns, names=[*features, label])


def _write_parquet(store: Store, uri: str, table: pa.Table, index: int | None = None) -> ShardEntry:
    import pyarrow.parquet as pq  # noqa: PLC0415

    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    payload = buffer.getvalue()
    store.write_bytes(uri, payload)
    return ShardEntry(uri=uri, rows=table.num_rows, sha256=sha256_hex(payload), bytes=len(payload), index=index)
