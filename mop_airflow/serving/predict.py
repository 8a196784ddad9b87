"""Score new rows with a run's model, the way Apache MADlib's ``madlib_keras_predict`` does.

The rows go through the very path the hops read: the run's manifest names the model inputs (which
columns, what shape, image decoding), and :func:`~mop_airflow.data.inputs.to_arrays` turns each
batch into the model's input. The source is read a record batch at a time
(:func:`~mop_airflow.data.source.iter_batches`) and the output written a batch at a time, so memory
holds one batch whatever the source's size. The output appears only when complete.

Modes (MADlib's ``pred_type``), every row keyed by ``row_id`` (its position in the source, files in
listing order, counted from 0) and, with ``id_column``, that column copied from the source:

- ``response``: the class (classification) or the predicted value (regression), column ``response``;
- ``prob``: one column ``prob_<class>`` per class, the model's probability of that class;
- ``top_k``: ``k`` rows per input row, columns ``rank`` (1 = most likely), ``class`` and ``prob``.

Nothing here imports Airflow; Keras loads only when a model does.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from mop_airflow.serving.champion import current_champion, registry_uri
from mop_airflow.data.inputs import InputSpec, input_columns, to_arrays
from mop_airflow.errors import DataValidationError, SpecError, StoreError
from mop_airflow.records.layout import RunLayout, read_run
from mop_airflow.records import Manifest, RunRecord
from mop_airflow.results.runs import last_saved_hop
from mop_airflow.store import Store

MODES = ("response", "prob", "top_k")
ROW_ID = "row_id"


@dataclass
class RunModel:
    """A run's model to score with, and what the run recorded about its inputs and classes."""

    model: Any  # keras.Model
    manifest: Manifest
    run: RunRecord
    config_id: str
    checkpoint: str  # the URI the weights came from

    @property
    def inputs(self) -> list[InputSpec]:
        from mop_airflow.data.cache import manifest_inputs  # noqa: PLC0415

        # Shards may store tensors packed; a source holds them as lists, as the training source did.
        return [dataclasses.replace(spec, stored=None) for spec in manifest_inputs(self.manifest)]


def champion_layout(store: Store, dag_id: str) -> tuple[RunLayout, dict[str, Any]]:
    """The run folder of ``dag_id``'s current champion and its registry entry; :class:`StoreError`
    when the DAG has published none."""
    champion = current_champion(store, dag_id)
    if champion is None:
        raise StoreError(f"DAG {dag_id!r} has no champion in the store {store.root} (no entry in "
                         f"{registry_uri(store, dag_id)}): none of its runs published one yet. Fix: check the DAG "
                         "id and the store (a MopTaskGroup's champion is its group's: add --group ID, or name "
                         "<dag_id>.<group_id>), publish a reported run with `mop-airflow champion publish DAG_ID "
                         "RUN_ID`, or name a run instead")
    return RunLayout(store, champion["dag_id"], champion["run_id"]), champion


def load_run_model(layout: RunLayout, config_id: str | None = None) -> RunModel:
    """The run's best model (``report/best_model.keras``), or ``config_id``'s last checkpoint."""
    store = layout.store
    run = read_run(layout)
    manifest = Manifest.read(store, layout.manifest_pointer_uri)
    if config_id is None:
        from mop_airflow.training.best_model import load_saved_model  # noqa: PLC0415 - Keras loads here

        uri = layout.report_uri("best_model.keras")
        if not store.exists(uri):
            raise StoreError(f"run {run.run_id} has no best model yet ({uri} is missing): its report task has not "
                             "run. Fix: wait for the run to finish, or name a configuration with --config")
        model = load_saved_model(store, uri)
        best = store.read_json(layout.report_uri("summary.json"))["best"]["config_id"]
        return RunModel(model, manifest, run, best, uri)
    return RunModel(_checkpoint_model(layout, run, manifest, config_id), manifest, run, config_id,
                    last_checkpoint(layout, run, config_id))


def last_checkpoint(layout: RunLayout, run: RunRecord, config_id: str) -> str:
    ids = [c["config_id"] for c in run.configs]
    if config_id not in ids:
        close = difflib.get_close_matches(config_id, ids, n=1)
        raise SpecError("--config", config_id, f"is not a configuration of run {run.run_id}"
                        + (f" (did you mean {close[0]!r}?)" if close else ""),
                        f"use one of {', '.join(ids[:12])}{', ...' if len(ids) > 12 else ''}")
    saved = last_saved_hop(layout, config_id)
    if saved is None:
        raise StoreError(f"configuration {config_id} of run {run.run_id} has no checkpoint in the store. Fix: pick "
                         "one that trained a hop (see the leaderboard)")
    return saved.checkpoint


def _checkpoint_model(layout: RunLayout, run: RunRecord, manifest: Manifest, config_id: str) -> Any:
    from mop_airflow.data.cache import manifest_inputs  # noqa: PLC0415
    from mop_airflow.data.inputs import input_shapes  # noqa: PLC0415
    from mop_airflow.planning.schedule import config_seed  # noqa: PLC0415
    from mop_airflow.training.builder import build_model  # noqa: PLC0415
    from mop_airflow.training.checkpoint import restore_state  # noqa: PLC0415

    uri = last_checkpoint(layout, run, config_id)
    model = build_model(run.config(config_id), input_shapes=input_shapes(manifest_inputs(manifest)),
                        num_classes=len(manifest.classes), seed=config_seed(run.schedule.seed, config_id),
                        task=manifest.task)
    restore_state(model, layout.store.read_bytes(uri), expect={"config_id": config_id})
    return model


# -- checks before scoring ---------------------------------------------------------------------
def check_mode(mode: str, k: int, manifest: Manifest) -> None:
    if mode not in MODES:
        raise SpecError("--mode", mode, f"is not one of {', '.join(MODES)}", "use response, prob or top_k")
    if manifest.task != "classification" and mode != "response":
        raise SpecError("--mode", mode, "gives class probabilities, but the run is a regression",
                        "use --mode response (the predicted value)")
    if mode == "top_k" and not 1 <= k <= len(manifest.classes):
        raise SpecError("--k", k, f"must be between 1 and the run's {len(manifest.classes)} classes",
                        f"pass --k {min(3, len(manifest.classes))}")


def check_source_schema(schema: Any, inputs: list[InputSpec], where: str, id_column: str | None = None) -> None:
    """Every column the model reads is there with a type the input pipeline takes; one sentence per
    problem, all found at once, before any row is scored."""
    import pyarrow as pa  # noqa: PLC0415

    names = list(schema.names)
    failures = []
    for spec in inputs:
        for column in spec.columns:
            if column not in names:
                close = difflib.get_close_matches(column, names, n=1)
                failures.append(f"column {column!r} is missing{f' (did you mean {close[0]!r}?)' if close else ''}: "
                                f"the model's input {spec.name!r} was trained on it; the source has "
                                f"{', '.join(repr(n) for n in names[:12])}{', ...' if len(names) > 12 else ''}; "
                                "add the column (same name as in training)")
                continue
            kind = schema.field(column).type
            if spec.kind == "columns" and not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                                               or pa.types.is_decimal(kind)):
                failures.append(f"column {column!r}: type {kind} is not numeric, but the model was trained on it "
                                "as a number; convert the column to numbers")
            elif spec.kind == "tensor":
                if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
                    failures.append(f"column {column!r}: type {kind} is not a list of numbers, but input "
                                    f"{spec.name!r} takes a tensor of shape {list(spec.shape)}; store each row's "
                                    "tensor as a list, as in training")
                elif pa.types.is_fixed_size_list(kind) and kind.list_size != spec.size:
                    failures.append(f"column {column!r}: rows hold {kind.list_size} values, but input {spec.name!r} "
                                    f"takes shape {list(spec.shape)} ({spec.size} values); pass rows of the "
                                    "trained shape")
            elif spec.kind == "image" and not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                                               or pa.types.is_struct(kind)):
                failures.append(f"column {column!r}: type {kind} is not encoded image bytes, but input "
                                f"{spec.name!r} decodes PNG/JPEG images; store the images' bytes")
    if id_column is not None and id_column not in names:
        failures.append(f"id column {id_column!r} is missing; the source has "
                        f"{', '.join(repr(n) for n in names[:12])}; name one of them, or leave the id out "
                        f"(every row gets {ROW_ID!r})")
    if failures:
        raise DataValidationError(where, failures)


def _check_rows(table: Any, inputs: list[InputSpec], where: str, first_row: int) -> None:
    """Null, NaN or inf features give a silent NaN prediction and a tensor of the wrong length a
    confusing one: refuse them with validation's sentences, naming rows of the file."""
    from mop_airflow.data.inputs import tensor_values  # noqa: PLC0415

    failures = []
    for spec in inputs:
        if spec.kind == "tensor":  # images are checked as they are decoded, by to_arrays
            failures += [p.sentence() for p in tensor_values(table[spec.columns[0]], spec, first_row, values=False)[1]]
            continue
        if spec.kind != "columns":
            continue
        for column in spec.columns:
            values = table[column].to_numpy(zero_copy_only=False).astype(np.float64)
            bad = np.flatnonzero(~np.isfinite(values))
            if bad.size:
                shown = ", ".join(str(int(r) + first_row) for r in bad[:5])
                failures.append(f"column {column!r}: {bad.size} row(s) are null, NaN or inf (rows {shown}"
                                f"{', ...' if bad.size > 5 else ''}, counted from 0 in the file); "
                                "impute or remove them")
    if failures:
        raise DataValidationError(where, failures)


# -- scoring -----------------------------------------------------------------------------------
def predict(layout: RunLayout | None, source: str, out: str, *, mode: str = "response", k: int = 3,
            config_id: str | None = None, id_column: str | None = None, batch_rows: int | None = None,
            options: Mapping[str, Any] | None = None,
            run_model: RunModel | None = None) -> dict[str, Any]:
    """Score ``source`` (a Parquet/CSV file, folder, glob or prefix, or one of image files) into the
    Parquet file ``out``; the rows of an image source carry their file's ``path`` beside ``row_id``.

    ``options`` (fsspec options: keys, endpoint) open the source and ``out``. Returns what was written:
    ``uri``, ``rows`` (input rows scored), ``mode``, ``columns``, ``config_id``, ``model``.
    """
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    from mop_airflow.data.images import rows_named  # noqa: PLC0415
    from mop_airflow.data.source import iter_batches, list_source, rows_per_batch, source_schema  # noqa: PLC0415

    if run_model is None:
        run_model = load_run_model(layout, config_id)
    manifest, inputs = run_model.manifest, run_model.inputs
    check_mode(mode, k, manifest)
    listing = list_source(source, options, role="--source", scoring=True)
    schema = source_schema(listing, options)
    if listing.format == "images" and id_column is None:
        id_column = "path"  # a folder of images: each score names its file, relative to the source
    check_source_schema(schema, inputs, source, id_column)
    columns = list(dict.fromkeys([*input_columns(inputs), *([id_column] if id_column else [])]))
    rows = batch_rows or rows_per_batch(listing, 64)
    classes = pa.array(manifest.classes) if manifest.task == "classification" else None
    out = out if "://" in out else "file://" + os.path.abspath(os.path.expanduser(out))
    out_store = Store(out.rsplit("/", 1)[0], options)
    scored, names = 0, []
    with out_store.open_write(out) as handle:
        writer = None
        try:
            for batch in iter_batches(listing, columns, batch_rows=rows, options=options):
                _check_rows(batch.table, inputs, batch.file.uri, batch.first_row)
                if listing.format == "images":  # a bad image is named by its file
                    x = to_arrays(batch.table, inputs, where=source, name_rows=lambda rows, count, first=batch.file_index:
                                  rows_named(listing, [(first, r) for r in rows], count))
                else:
                    x = to_arrays(batch.table, inputs, where=f"{batch.file.uri} (the batch of its rows "
                                                             f"{batch.first_row}-{batch.first_row + batch.table.num_rows - 1})")
                y = np.asarray(run_model.model.predict(x, batch_size=min(1024, batch.table.num_rows), verbose=0))
                ids = pa.array(np.arange(scored, scored + batch.table.num_rows, dtype=np.int64))
                table = _result_table(y, mode, k, classes, ids, batch.table[id_column] if id_column else None,
                                      id_column)
                if writer is None:
                    writer = pq.ParquetWriter(handle, table.schema)
                    names = table.column_names
                writer.write_table(table)
                scored += batch.table.num_rows
            if writer is None:  # a source of no rows: an empty table with the columns a row would have
                empty = _result_table(np.zeros((0, max(1, len(manifest.classes))), np.float32), mode, k, classes,
                                      pa.array([], pa.int64()),
                                      pa.array([], schema.field(id_column).type) if id_column else None, id_column)
                writer = pq.ParquetWriter(handle, empty.schema)
                names = empty.column_names
        finally:
            if writer is not None:  # on an error too: a writer left open would write into the discarded file later
                writer.close()
    return {"uri": out, "rows": scored, "mode": mode, "columns": names, "config_id": run_model.config_id,
            "model": run_model.checkpoint}


def _result_table(y: np.ndarray, mode: str, k: int, classes: Any, ids: Any, id_values: Any,
                  id_column: str | None) -> Any:
    """One batch of output rows; ``y`` is the model's output for the batch."""
    import pyarrow as pa  # noqa: PLC0415

    keys = {ROW_ID: ids, **({id_column: id_values} if id_column and id_column != ROW_ID else {})}
    if classes is None:  # regression: the value (a list per row for several outputs)
        values = y.reshape(len(y), -1).astype(np.float32)
        response = pa.array(values[:, 0]) if values.shape[1] == 1 else pa.array(list(values))
        return pa.table({**keys, "response": response})
    probs = y.reshape(len(y), -1).astype(np.float32)
    if mode == "response":
        return pa.table({**keys, "response": classes.take(pa.array(np.argmax(probs, axis=1)))})
    if mode == "prob":
        return pa.table({**keys, **{f"prob_{c}": pa.array(probs[:, j]) for j, c in enumerate(classes.to_pylist())}})
    # top_k: stable ordering, so equal probabilities rank by class order as argmax does
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    n = len(probs)
    repeated = {name: (column.take(pa.array(np.repeat(np.arange(n), k))) if n else column)
                for name, column in keys.items()}
    return pa.table({**repeated, "rank": pa.array(np.tile(np.arange(1, k + 1, dtype=np.int32), n)),
                     "class": classes.take(pa.array(top.reshape(-1))),
                     "prob": pa.array(np.take_along_axis(probs, top, axis=1).reshape(-1))})
