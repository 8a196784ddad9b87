"""Splitting the training data once into ``p`` shards that stay in place while models hop.

Shards live at ``<root>/<dag_id>/shards/<fingerprint>/`` where the fingerprint covers the source's
listing (paths, sizes, versions, row counts), the inputs, the target, the shard count, the seed,
the validation split and the shuffle: the same input and seed find the same shards and reuse them;
anything else gets a new folder. The manifest is written last, so a manifest always points at
complete shards.

The source streams through one record batch at a time and every shard is written as it goes, so
memory is bounded by the batch, not the data. With ``shuffle="rows"`` (the default) each row's
place is its position in a seeded random permutation of all rows (:mod:`.permutation`): the
validation hold-out takes the first positions and the shards near-equal runs of the rest, so each
shard is a uniform random sample. With ``shuffle="files"`` whole files are dealt to the shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any

import numpy as np

from mop_airflow.data.inputs import InputSpec, input_columns, pack_tensor, resolve_inputs
from mop_airflow.data.permutation import permuted_positions, split_of
from mop_airflow.data.source import iter_batches, list_source, rows_per_batch
from mop_airflow.data.table import count_labels, holdout_rows, sorted_labels
from mop_airflow.records import Manifest, ShardEntry, SourceListing
from mop_airflow.spec import DataSpec
from mop_airflow.store import Store, safe_segment

MANIFEST = "manifest.json"


def shard_dataset(data: DataSpec, store: Store, dag_id: str, shards: int, seed: int) -> Manifest:
    """Shard ``data.source`` into ``shards`` Parquet files (or reuse them) and return the manifest.

    Expects data that passed :func:`~mop_airflow.data.validate.validate_source`. The returned
    manifest has ``reused=True`` when an identical sharding was already complete in the store.
    """
    listing = list_source(data.source, data.storage_options, data.conn_id)
    held = (list_source(data.validation, data.storage_options, data.conn_id, role="data.validation")
            if isinstance(data.validation, str) else None)
    inputs = resolve_inputs(listing.columns, data.features, data.label)
    # numpy scalars (np.int64(3)) would hash and serialise differently from the same plain value
    classes = [c.item() if isinstance(c, np.generic) else c for c in data.classes]
    fingerprint = shard_fingerprint(listing=listing, validation=data.validation, held=held, inputs=inputs,
                                    label=data.label, task=data.task, classes=classes, shards=shards, seed=seed,
                                    shuffle=data.shuffle)
    folder = (safe_segment(dag_id), "shards", fingerprint)

    existing = _complete_manifest(store, store.uri(*folder, MANIFEST))
    if existing is not None:
        return dataclasses.replace(existing, reused=True)

    columns = [*input_columns(inputs), data.label]
    writer = _ShardWriters(store, folder, shards, columns, inputs)
    found: dict = {}
    with writer:
        for batch, part in _assigned_batches(data, listing, held, columns, shards, seed):
            if data.task == "classification" and not classes and part is not None:
                count_labels(batch.table[data.label], found)
            writer.write(batch.table, part)
    if data.task == "classification" and not classes:
        classes = sorted_labels(found)
    shard_entries, validation_entry = writer.entries()
    manifest = Manifest(
        fingerprint=fingerprint, source=data.source, features=input_columns(inputs), label=data.label,
        classes=classes, seed=seed, schema=writer.schema_dict(), shards=shard_entries,
        validation=validation_entry, total_rows=sum(entry.rows for entry in shard_entries),
        created_at=datetime.now(timezone.utc).isoformat(), task=data.task,
        inputs=[dataclasses.replace(spec, stored=writer.stored.get(spec.columns[0])).to_dict() for spec in inputs],
        shuffle=data.shuffle,
    )
    manifest.write(store, store.uri(*folder, MANIFEST))
    return manifest


def _assigned_batches(data: DataSpec, listing: SourceListing, held: SourceListing | None, columns: list[str],
                      shards: int, seed: int):
    """(batch, part) pairs: ``part`` says per row which shard it goes to, ``shards`` meaning validation.

    A batch of the separate validation source comes with ``part=None`` (all of it is validation).
    """
    total = listing.total_rows
    held_out = 0 if held is not None else holdout_rows(total, data.validation)
    batch_rows = rows_per_batch(listing, data.batch_mb)
    if data.shuffle == "files":
        file_part = deal_files([f.rows for f in listing.files], shards=shards, seed=seed,
                               validation_rows=held_out)
    offsets = np.cumsum([0] + [f.rows for f in listing.files])
    for batch in iter_batches(listing, columns, batch_rows=batch_rows, storage_options=data.storage_options,
                              conn_id=data.conn_id):
        n = batch.table.num_rows
        if data.shuffle == "files":
            part = np.full(n, file_part[batch.file_index], dtype=np.int64)
        else:
            rows = offsets[batch.file_index] + batch.first_row + np.arange(n, dtype=np.int64)
            positions = permuted_positions(rows, total, seed)
            part = np.where(positions < held_out, shards,
                            split_of(np.maximum(positions - held_out, 0), total - held_out, shards))
        yield batch, part
    if held is not None:
        for batch in iter_batches(held, columns, batch_rows=rows_per_batch(held, data.batch_mb),
                                  storage_options=data.storage_options, conn_id=data.conn_id):
            yield batch, None


def deal_files(rows: list[int], *, shards: int, seed: int, validation_rows: int) -> list[int]:
    """Deal whole files to the shards (and the validation set, index ``shards``), balancing rows.

    Files go in a seeded random order, each to the part furthest below its share of the rows.
    """
    total = sum(rows)
    targets = [(total - validation_rows) / shards] * shards + [float(validation_rows)]
    filled = [0.0] * (shards + 1)
    parts = [0] * len(rows)
    for index in np.random.default_rng(np.random.SeedSequence([seed, 0xF11E])).permutation(len(rows)):
        gaps = [targets[k] - filled[k] for k in range(shards + 1)]
        chosen = int(np.argmax(gaps))
        parts[index] = chosen
        filled[chosen] += rows[index]
    return parts


class _ShardWriters:
    """One streaming Parquet writer per shard plus one for validation, each hashed as it is written."""

    def __init__(self, store: Store, folder: tuple[str, ...], shards: int, columns: list[str],
                 inputs: list[InputSpec]):
        self.store = store
        self.uris = [store.uri(*folder, f"shard-{i:05d}.parquet") for i in range(shards)]
        self.uris.append(store.uri(*folder, "validation.parquet"))
        self.columns = columns
        self.scalars = {c for spec in inputs if spec.kind == "columns" for c in spec.columns}
        self.tensors = {spec.columns[0] for spec in inputs if spec.kind == "tensor"}
        self.stored: dict[str, str] = {}  # tensor column -> element dtype of its packed rows
        self.rows = [0] * (shards + 1)
        self.stack = ExitStack()
        self.handles: list[Any] = []
        self.writers: list[Any] = []
        self.schema = None

    def __enter__(self) -> "_ShardWriters":
        self.handles = [self.stack.enter_context(self.store.open_write(uri)) for uri in self.uris]
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            for writer in self.writers:
                writer.close()
        finally:
            self.stack.__exit__(*exc)

    def _training_columns(self, table: Any) -> Any:
        """Scalar features as float32 (what the model reads), tensors packed (:func:`pack_tensor`),
        images and the label as they are."""
        import pyarrow as pa  # noqa: PLC0415

        arrays = []
        for c in self.columns:
            if c in self.scalars:
                # safe=False: large integers lose precision in float32 by design, instead of raising.
                arrays.append(table[c].cast(pa.float32(), safe=False))
            elif c in self.tensors:
                # The first batch decides the element type; a separate validation source follows it.
                packed, dtype = pack_tensor(table[c], self.stored.get(c))
                self.stored.setdefault(c, dtype)
                arrays.append(packed)
            else:
                arrays.append(table[c])
        out = pa.Table.from_arrays(arrays, names=self.columns)
        if self.schema is None:
            import pyarrow.parquet as pq  # noqa: PLC0415

            self.schema = out.schema
            # Dictionary encoding only for the label: on float features and image bytes pyarrow tries
            # it, gives up, and has spent 14x the time of writing them plain (measured).
            self.writers = [pq.ParquetWriter(handle, self.schema, use_dictionary=[self.columns[-1]])
                            for handle in self.handles]
        return out.cast(self.schema)  # a separate validation source may differ in integer width

    def write(self, table: Any, part: np.ndarray | None) -> None:
        table = self._training_columns(table)
        if part is None:
            self._append(len(self.uris) - 1, table)
            return
        order = np.argsort(part, kind="stable")  # rows keep their source order within a part
        bounds = np.searchsorted(part[order], np.arange(len(self.uris) + 1))
        for index in range(len(self.uris)):
            rows = order[bounds[index]:bounds[index + 1]]
            if rows.size:
                self._append(index, table.take(rows))

    def _append(self, index: int, table: Any) -> None:
        self.writers[index].write_table(table)
        self.rows[index] += table.num_rows

    def entries(self) -> tuple[list[ShardEntry], ShardEntry]:
        out = [ShardEntry(uri=uri, rows=rows, sha256=handle.sha256, bytes=handle.bytes,
                          index=i if i < len(self.uris) - 1 else None)
               for i, (uri, rows, handle) in enumerate(zip(self.uris, self.rows, self.handles))]
        return out[:-1], out[-1]

    def schema_dict(self) -> dict[str, str]:
        return {f.name: str(f.type) for f in self.schema}


def shard_fingerprint(*, listing: SourceListing, validation: float | str, held: SourceListing | None,
                      inputs: list[InputSpec], label: str, task: str, classes: list, shards: int, seed: int,
                      shuffle: str) -> str:
    """16 hex characters that change whenever the shards' content would change.

    The listing (every file's path, size, version and rows) stands for the data: nothing hashes
    the bytes of the whole source.
    """
    def files(source: SourceListing | None) -> list | None:
        return None if source is None else [[f.uri, f.rows, f.bytes, f.version] for f in source.files]

    key = {
        "source": files(listing),
        "validation": validation,
        "validation_files": files(held),
        "inputs": [spec.to_dict() for spec in inputs],
        "label": label,
        "task": task,
        # repr keeps 1 and "1" apart; json alone would not for some types
        "classes": [repr(c) for c in classes],
        "shards": shards,
        "seed": seed,
        "shuffle": shuffle,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _complete_manifest(store: Store, manifest_uri: str) -> Manifest | None:
    """The stored manifest when it and every file it lists exist, else None (reshard)."""
    if not store.exists(manifest_uri):
        return None
    manifest = Manifest.read(store, manifest_uri)
    entries = [*manifest.shards, manifest.validation]
    return manifest if all(store.exists(entry.uri) for entry in entries) else None
