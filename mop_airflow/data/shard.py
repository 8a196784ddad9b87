"""Splitting the training data once into ``p`` shards that stay in place while models hop.

Shards live at ``<root>/<dag_id>/shards/<fingerprint>/`` where the fingerprint covers the source's
listing (paths, sizes, versions, row counts), the inputs, the target, the shard count, the seed,
the validation split and the shuffle: the same input and seed find the same shards and reuse them;
anything else gets a new folder. The manifest is written last, so a manifest always points at
complete shards.

Sharding is scatter/gather, so no single task reads the whole source:

1. :func:`plan_sharding` lists the source once, cuts it into slices of whole files (about
   ``data.slice_mb`` each) and fixes the stored schema (:class:`~mop_airflow.records.ShardingPlan`).
2. :func:`scatter_slice`, one task per slice, streams its files one record batch at a time and
   writes each row into its shard's part ``parts/slice-<k>/part-<s>.parquet``, so memory is bounded
   by the batch. In a DAG the same pass validates the slice; a slice that breaks a rule writes nothing.
3. :func:`collect_shards` merges the slices' findings (one error listing every failure; the parts
   already written are deleted) and writes the manifest: each shard is its parts in slice order.
   Each shard's stage task then gathers its parts into its worker's cache (:mod:`.cache`).

With ``shuffle="rows"`` (the default) each row's place is its position in a seeded random
permutation of all rows, computed from its global row number (:mod:`.permutation`): the validation
hold-out takes the first positions and the shards near-equal runs of the rest, so each shard is a
uniform random sample, and the same rows land in the same shard however the files are sliced. With
``shuffle="files"`` whole files are dealt to the shards.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any, Mapping

import numpy as np

from mop_airflow.data.inputs import InputSpec, input_columns, pack_tensor, resolve_inputs
from mop_airflow.data.permutation import permuted_positions, split_of
from mop_airflow.data.source import iter_batches, list_source, rows_per_batch, source_options
from mop_airflow.data.table import count_labels, holdout_rows, sorted_labels
from mop_airflow.errors import DataValidationError, StoreError
from mop_airflow.records import DataSlice, Manifest, ShardEntry, ShardingPlan, SliceResult, SourceListing
from mop_airflow.config import DataSpec
from mop_airflow.store import Store, safe_segment

MANIFEST = "manifest.json"
MAX_SLICES = 512  # mapped tasks per run stay well below Airflow's max_map_length (1,024)


def shard_dataset(data: DataSpec, store: Store, dag_id: str, shards: int, seed: int, *,
                  options: Mapping[str, Any] | None = None) -> Manifest:
    """Shard ``data.source`` into ``shards`` Parquet files (or reuse them) in one process.

    Plans, scatters every slice and collects, without validating (a DAG validates in its scatter
    tasks): expects data that passed :func:`~mop_airflow.data.validate.validate_source`. The
    returned manifest has ``reused=True`` when an identical sharding was already complete.
    ``options`` open the source (:func:`~mop_airflow.data.source.source_options`).
    """
    plan = plan_sharding(data, store, dag_id, shards, seed, options=options)
    results = [scatter_slice(plan, data, store, k, options=options) for k in range(len(plan.slices))]
    return collect_shards(plan, data, store, results)


def plan_sharding(data: DataSpec, store: Store, dag_id: str, shards: int, seed: int, *,
                  options: Mapping[str, Any] | None = None) -> ShardingPlan:
    """List the source (and a separate validation source), fingerprint it and cut it into slices."""
    options = source_options(data, options)
    listing = list_source(data.source, options, labels=data.labels)
    held = (list_source(data.validation, options, role="data.validation",
                        labels=data.labels) if isinstance(data.validation, str) else None)
    try:
        inputs = resolve_inputs(listing.columns, data.features, data.label)
    except DataValidationError:
        inputs = []  # validation words the failure; nothing is written
    # numpy scalars (np.int64(3)) would hash and serialise differently from the same plain value
    classes = [c.item() if isinstance(c, np.generic) else c for c in data.classes]
    fingerprint = shard_fingerprint(listing=listing, validation=data.validation, held=held, inputs=inputs,
                                    label=data.label, task=data.task, classes=classes, shards=shards, seed=seed,
                                    shuffle=data.shuffle)
    folder = store.uri(safe_segment(dag_id), "shards", fingerprint)
    reused = _complete_manifest(store, f"{folder}/{MANIFEST}") is not None
    schema, inputs = _stored_schema(data, listing, inputs, options) if inputs else (None, inputs)
    return ShardingPlan(fingerprint=fingerprint, folder=folder, listing=listing, held=held,
                        slices=make_slices(listing, held, data.slice_mb), inputs=[i.to_dict() for i in inputs],
                        classes=classes, shards=shards, seed=seed, reused=reused, schema=schema)


def write_plan(plan: ShardingPlan, store: Store, uri: str) -> str:
    """Write ``plan`` as ``plan.write`` does (``ShardingPlan.read`` reads it), its files one at a time.

    The plan is the one record that grows with the number of files: for a folder of 631,000 images
    ``plan.write`` (a dict and a JSON string of everything at once) took the listing task from 0.5
    to 1.1 GB (measured); written file by file it holds one file's JSON at a time.
    """
    files = {"listing": plan.listing.files, "held": plan.held.files if plan.held is not None else []}
    hollow = {name: dataclasses.replace(source, files=f"\0{name}\0")  # a marker to cut the JSON at
              for name, source in (("listing", plan.listing), ("held", plan.held)) if source is not None}
    head = json.dumps(dataclasses.replace(plan, **hollow).to_dict(), sort_keys=True)
    with store.open_write(uri) as handle:
        # re.split with a group: the text between markers at even indexes, the markers' names between
        for i, piece in enumerate(re.split(r'"\\u0000(listing|held)\\u0000"', head)):
            if i % 2 == 0:
                handle.write(piece.encode())
                continue
            handle.write(b"[")
            for k, entry in enumerate(files[piece]):
                handle.write((", " if k else "").encode() + json.dumps(entry.to_dict(), sort_keys=True).encode())
            handle.write(b"]")
    return uri


def make_slices(listing: SourceListing, held: SourceListing | None, slice_mb: float) -> list[DataSlice]:
    """Runs of whole files of about ``slice_mb`` MB each (a larger file is a slice of its own).

    The source's slices come first, then the separate validation source's; slices grow when the
    source would otherwise need more than :data:`MAX_SLICES` of them.
    """
    total = listing.total_bytes + (held.total_bytes if held is not None else 0)
    budget = max(slice_mb * 1e6, total / MAX_SLICES)
    out: list[DataSlice] = []
    for role, source in (("source", listing), ("validation", held)):
        if source is None:
            continue
        start, size = 0, 0
        for i, f in enumerate(source.files):
            size += f.bytes
            if size >= budget or i == len(source.files) - 1:
                files = source.files[start:i + 1]
                out.append(DataSlice(len(out), role, start, i + 1, sum(f.rows for f in files), size))
                start, size = i + 1, 0
    return out


def scatter_slice(plan: ShardingPlan, data: DataSpec, store: Store, index: int, checks: Any = None, *,
                  options: Mapping[str, Any] | None = None) -> SliceResult:
    """Stream slice ``index`` once: validate it with ``checks`` (a fresh ``DataChecks``, optional) and
    write each row to its shard's part, unless the shards are reused or the slice breaks a rule."""
    options = source_options(data, options)
    part_of = _Placement(plan, data)
    piece = plan.slices[index]
    findings_uri = _findings_uri(plan, piece, checks, data) if checks is not None else None
    if plan.reused and findings_uri is not None and store.exists(findings_uri):
        # The same files (the plan's fingerprint covers paths, sizes and versions) under the same
        # checks found this before: reading them again would find it again. A second run's scatter
        # phase went from 12.8 s to 0.3 s at 1 GB (benchmarks/task_parallel.py).
        earlier = SliceResult.read(store, findings_uri)
        return dataclasses.replace(earlier, index=index, parts=[None] * len(earlier.parts), wrote=False)
    listing = plan.listing if piece.role == "source" else plan.held
    files = dataclasses.replace(listing, files=listing.files[piece.start:piece.end])
    checker = checks.checker(piece.role) if checks is not None else None
    write = not plan.reused and plan.schema is not None and (checks is None or checks.schema_ok)
    inputs = [InputSpec.from_dict(d) for d in plan.inputs]
    stored = [*input_columns(inputs), data.label]
    # Found classes need the source's label counts; validation counts them already when it runs.
    count = data.task == "classification" and not plan.classes and piece.role == "source" and checker is None
    read = list(dict.fromkeys([*(checker.columns if checker else []), *(stored if write or count else [])]))
    labels: dict = {}
    writer = _PartWriters(store, f"{plan.folder}/parts/slice-{index:05d}", plan, inputs)
    with writer:
        if read:
            for batch in iter_batches(files, read, batch_rows=rows_per_batch(listing, data.batch_mb),
                                      options=options):
                batch = dataclasses.replace(batch, file_index=batch.file_index + piece.start)
                if checker is not None:
                    checker.observe(batch)
                    if write and checker.role.failed:
                        write = False  # this slice's rows will not be sharded: stop paying for them
                        writer.abort()
                if count:
                    count_labels(batch.table[data.label], labels)
                if write:
                    writer.write(batch.table.select(stored), part_of(piece, batch))
    parts = writer.entries()
    if checker is not None and piece.role == "source":
        labels = checker.role.label_counts
    result = SliceResult(index=index, findings=checks.state() if checks is not None else {},
                         parts=parts, wrote=write, labels=[[v, c] for v, c in labels.items()])
    if findings_uri is not None and (write or plan.reused):  # rows that pass and are (or were) sharded
        result.write(store, findings_uri)
    return result


def _findings_uri(plan: ShardingPlan, piece: DataSlice, checks: Any, data: DataSpec) -> str:
    """Where a slice's findings are kept beside its shards: named by its files and by every check
    (rule, column, arguments, row minimum) and what the checks read, so other checks never reuse them."""
    key = json.dumps({"roles": [[role.role, role.min_rows, [dataclasses.asdict(c) for c in role.checks],
                                 [dataclasses.asdict(t) for t in role.tensor_inputs]] for role in checks.roles],
                      "failures": checks.failures, "label": data.label, "task": data.task,
                      "classes": list(data.classes), "validation_rows": checks.validation_rows},
                     sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{plan.folder}/findings/{digest}/{piece.role}-{piece.start:06d}-{piece.end:06d}.json"


def collect_shards(plan: ShardingPlan, data: DataSpec, store: Store, results: list[SliceResult],
                   checks: Any = None) -> Manifest:
    """Merge the slices' findings (raise every failure at once) and write the manifest of their parts."""
    results = sorted(results, key=lambda r: r.index)
    if checks is not None:
        for result in results:
            checks.absorb(result.findings)
        try:
            checks.conclude()
        except DataValidationError:
            if not plan.reused:  # a failed run leaves no rows (nor findings) behind
                store.delete_tree(f"{plan.folder}/parts")
                store.delete_tree(f"{plan.folder}/findings")
            raise
    manifest_uri = f"{plan.folder}/{MANIFEST}"
    if plan.reused:
        existing = _complete_manifest(store, manifest_uri)
        if existing is None:  # the scatter tasks wrote nothing, trusting these shards
            raise StoreError(f"the shards at {plan.folder} were complete when the run listed its data but are not "
                             "now (deleted meanwhile?); rerun the run's list_data task to write them again")
        return dataclasses.replace(existing, reused=True)
    classes = list(plan.classes)
    if data.task == "classification" and not classes:
        found: dict = {}
        for result in results:
            for value, count in result.labels:
                found[value] = found.get(value, 0) + count
        classes = sorted_labels(found)
    entries = [_gathered(store, plan, [r.parts[s] for r in results if r.parts[s]], s) for s in range(plan.shards + 1)]
    inputs = [InputSpec.from_dict(d) for d in plan.inputs]
    manifest = Manifest(
        fingerprint=plan.fingerprint, source=data.source, features=input_columns(inputs), label=data.label,
        classes=classes, seed=plan.seed, schema={f.name: str(f.type) for f in _schema(plan)},
        shards=entries[:-1], validation=dataclasses.replace(entries[-1], index=None),
        total_rows=sum(entry.rows for entry in entries[:-1]), created_at=datetime.now(timezone.utc).isoformat(),
        task=data.task, inputs=plan.inputs, shuffle=data.shuffle,
    )
    manifest.write(store, manifest_uri)
    return manifest


def _gathered(store: Store, plan: ShardingPlan, parts: list[ShardEntry], index: int) -> ShardEntry:
    """Shard ``index`` (``plan.shards``: the validation set) as one entry over its slices' parts."""
    if len(parts) == 1:
        return dataclasses.replace(parts[0], index=index)
    name = "validation" if index == plan.shards else f"shard-{index:05d}"
    if not parts:  # e.g. fewer files than shards with shuffle "files": an empty file keeps the layout
        import pyarrow.parquet as pq  # noqa: PLC0415

        uri = f"{plan.folder}/{name}.parquet"
        with store.open_write(uri) as handle:
            pq.ParquetWriter(handle, _schema(plan)).close()
        return ShardEntry(uri=uri, rows=0, sha256=handle.sha256, bytes=handle.bytes, index=index)
    digest = hashlib.sha256("".join(p.sha256 for p in parts).encode()).hexdigest()
    return ShardEntry(uri=f"{plan.folder}/{name}", rows=sum(p.rows for p in parts), sha256=digest,
                      bytes=sum(p.bytes for p in parts), index=index, parts=parts)


def expected_shard_rows(plan: ShardingPlan, data: DataSpec) -> int:
    """The largest training shard's rows as the listing predicts them, before anything is scattered:
    exact when rows are shuffled (they are split evenly, as :class:`_Placement` does), close when
    whole files are dealt. What a provisional hop plan is costed with."""
    return -(-(plan.listing.total_rows - _held_out_rows(plan, data)) // plan.shards)


def _held_out_rows(plan: ShardingPlan, data: DataSpec) -> int:
    """The source's rows held out for validation (none when validation is a separate source)."""
    return 0 if plan.held is not None else holdout_rows(plan.listing.total_rows, data.validation)


class _Placement:
    """Which part each row of a batch goes to: a shard ``0..p-1``, or ``p`` for validation."""

    def __init__(self, plan: ShardingPlan, data: DataSpec) -> None:
        listing = plan.listing
        self.shards, self.seed, self.shuffle = plan.shards, plan.seed, data.shuffle
        self.listing_format = listing.format
        self.total = listing.total_rows
        self.held_out = _held_out_rows(plan, data)
        self.offsets = np.cumsum([0] + [f.rows for f in listing.files])
        if data.shuffle == "files":
            self.file_part = deal_files([f.rows for f in listing.files], shards=plan.shards, seed=plan.seed,
                                        validation_rows=self.held_out)

    def __call__(self, piece: DataSlice, batch: Any) -> np.ndarray:
        n = batch.table.num_rows
        if piece.role == "validation":
            return np.full(n, self.shards, dtype=np.int64)
        if self.shuffle == "files" and self.listing_format == "images":  # each row is a file of its own
            return np.asarray(self.file_part, dtype=np.int64)[batch.file_index + np.arange(n)]
        if self.shuffle == "files":
            return np.full(n, self.file_part[batch.file_index], dtype=np.int64)
        rows = self.offsets[batch.file_index] + batch.first_row + np.arange(n, dtype=np.int64)
        positions = permuted_positions(rows, self.total, self.seed)
        return np.where(positions < self.held_out, self.shards,
                        split_of(np.maximum(positions - self.held_out, 0), self.total - self.held_out, self.shards))


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


def _stored_schema(data: DataSpec, listing: SourceListing, inputs: list[InputSpec],
                   options: Mapping[str, Any]) -> tuple[str | None, list[InputSpec]]:
    """The schema every part is written with (base64 Arrow IPC), fixed from the source's first row,
    and the inputs with the element dtype their tensors are stored in.

    Fixed once so that all slices' parts concatenate, and a separate validation source of another
    integer width is cast to the source's types. None when the first row cannot be stored (the
    validation pass then says why).
    """
    import pyarrow as pa  # noqa: PLC0415

    first = dataclasses.replace(listing, files=listing.files[:1])
    columns = [*input_columns(inputs), data.label]
    # One ordinary batch, not batch_rows=1: the scanner would cut the first row group into a
    # record batch per row (7 GB for 2 M rows, measured).
    batches = iter_batches(first, columns, batch_rows=1024, options=options)
    try:
        batch = next(batches)
        table, stored = _training_columns(batch.table.slice(0, 1), inputs, columns, {})
    except (StopIteration, KeyError, pa.ArrowException, ValueError, TypeError):
        return None, inputs
    finally:
        batches.close()
    fields = []
    for f in table.schema:
        spec = next((i for i in inputs if i.kind == "tensor" and i.columns[0] == f.name), None)
        if spec is not None:  # the declared shape, not the first row's length, sets the width
            f = f.with_type(pa.binary(max(1, spec.size * np.dtype(stored[f.name]).itemsize)))
        fields.append(f)
    schema = pa.schema(fields)
    inputs = [dataclasses.replace(i, stored=stored.get(i.columns[0])) for i in inputs]
    return base64.b64encode(schema.serialize().to_pybytes()).decode(), inputs


def _schema(plan: ShardingPlan) -> Any:
    import pyarrow as pa  # noqa: PLC0415

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(plan.schema)))


def _training_columns(table: Any, inputs: list[InputSpec], columns: list[str],
                      stored: dict[str, str]) -> tuple[Any, dict[str, str]]:
    """Scalar features as float32 (what the model reads), tensors packed (:func:`pack_tensor`) as
    ``stored`` says (or as their values come), images and the label as they are."""
    import pyarrow as pa  # noqa: PLC0415

    scalars = {c for spec in inputs if spec.kind == "columns" for c in spec.columns}
    tensors = {spec.columns[0] for spec in inputs if spec.kind == "tensor"}
    stored = dict(stored)
    arrays = []
    for c in columns:
        if c in scalars:
            # safe=False: large integers lose precision in float32 by design, instead of raising.
            arrays.append(table[c].cast(pa.float32(), safe=False))
        elif c in tensors:
            packed, dtype = pack_tensor(table[c], stored.get(c))
            stored.setdefault(c, dtype)
            arrays.append(packed)
        else:
            arrays.append(table[c])
    return pa.Table.from_arrays(arrays, names=columns), stored


class _PartWriters:
    """A slice's streaming Parquet writer per shard plus one for validation, each opened at its first
    row and hashed as it is written; nothing appears in the store unless the slice completes."""

    def __init__(self, store: Store, folder: str, plan: ShardingPlan, inputs: list[InputSpec]):
        self.store = store
        self.uris = [f"{folder}/part-{i:05d}.parquet" for i in range(plan.shards + 1)]
        self.inputs = inputs
        self.schema = _schema(plan) if plan.schema else None
        self.columns = list(self.schema.names) if self.schema is not None else []
        self.stored = {i.columns[0]: i.stored for i in inputs if i.stored}
        self.rows = [0] * len(self.uris)
        self.stack = ExitStack()
        self.handles: dict[int, Any] = {}
        self.writers: dict[int, Any] = {}
        self.aborted = False

    def __enter__(self) -> "_PartWriters":
        self.stack.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            for writer in self.writers.values():
                writer.close()
        finally:
            self.stack.__exit__(*exc)

    def abort(self) -> None:
        """Drop every part written so far (temp files removed, multipart uploads aborted)."""
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
        self.aborted = True
        error = _Aborted()
        self.stack.__exit__(_Aborted, error, None)
        self.stack = ExitStack()
        self.handles = {}

    def write(self, table: Any, part: np.ndarray) -> None:
        table = _training_columns(table, self.inputs, self.columns, self.stored)[0].cast(self.schema)
        order = np.argsort(part, kind="stable")  # rows keep their source order within a part
        bounds = np.searchsorted(part[order], np.arange(len(self.uris) + 1))
        for index in range(len(self.uris)):
            rows = order[bounds[index]:bounds[index + 1]]
            if rows.size:
                self._writer(index).write_table(table.take(rows))
                self.rows[index] += int(rows.size)

    def _writer(self, index: int) -> Any:
        if index not in self.writers:
            import pyarrow.parquet as pq  # noqa: PLC0415

            self.handles[index] = self.stack.enter_context(self.store.open_write(self.uris[index]))
            # Dictionary encoding only for the label: on float features and image bytes pyarrow tries
            # it, gives up, and has spent 14x the time of writing them plain (measured).
            self.writers[index] = pq.ParquetWriter(self.handles[index], self.schema,
                                                   use_dictionary=[self.columns[-1]])
        return self.writers[index]

    def entries(self) -> list[ShardEntry | None]:
        """Call after the ``with`` block: one entry per part that received rows."""
        if self.aborted:
            return [None] * len(self.uris)
        return [ShardEntry(uri=self.uris[i], rows=self.rows[i], sha256=self.handles[i].sha256,
                           bytes=self.handles[i].bytes, index=i) if i in self.handles else None
                for i in range(len(self.uris))]


class _Aborted(Exception):
    """Thrown into the part writers' contexts so that they discard what they hold."""


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
    for name, source in (("labels_file", listing), ("validation_labels_file", held)):
        # Only image sources with a labels file add the key: other sources keep their fingerprint.
        if source is not None and (source.images or {}).get("labels"):
            key[name] = source.images["labels"]
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _complete_manifest(store: Store, manifest_uri: str) -> Manifest | None:
    """The stored manifest when it and every file it lists exist, else None (reshard)."""
    if not store.exists(manifest_uri):
        return None
    manifest = Manifest.read(store, manifest_uri)
    entries = [*manifest.shards, manifest.validation]
    return manifest if all(store.exists(f.uri) for entry in entries for f in entry.files) else None
