"""Export the winner: rebuild it, load its final checkpoint, save it as ``.keras``, prove it predicts;
then, on request, copy it out for serving with a model card (:func:`export_for_serving`)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Mapping

from mop_airflow.layout import RunLayout
from mop_airflow.records import Manifest, RunRecord
from mop_airflow.schedule import config_seed


def export_best(layout: RunLayout, run: RunRecord, manifest: Manifest, config_id: str, last_t: int, *,
                cache_dir: str) -> str:
    """Write ``report/best_model.keras`` (and ``best_model.json``) for ``config_id`` after hop ``last_t``."""
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    import pyarrow.parquet as pq  # noqa: PLC0415

    from mop_airflow.data.cache import cached_shard, load_table, manifest_inputs  # noqa: PLC0415
    from mop_airflow.data.inputs import input_shapes  # noqa: PLC0415
    from mop_airflow.training.builder import build_model  # noqa: PLC0415
    from mop_airflow.training.checkpoint import restore_state  # noqa: PLC0415
    from mop_airflow.training.hop import export_keras  # noqa: PLC0415

    store = layout.store
    config = run.config(config_id)
    # 64 validation rows prove the export; the first row group has them (the file may be huge).
    first_rows = pq.ParquetFile(cached_shard(store, manifest.validation, cache_dir)).read_row_group(0).slice(0, 64)
    xv, _ = load_table(first_rows, manifest)
    model = build_model(config, input_shapes=input_shapes(manifest_inputs(manifest)),
                        num_classes=len(manifest.classes), seed=config_seed(run.schedule.seed, config_id),
                        task=manifest.task)
    restore_state(model, store.read_bytes(layout.checkpoint_uri(config_id, last_t)))
    with tempfile.TemporaryDirectory() as tmp:
        path = export_keras(model, os.path.join(tmp, "best_model.keras"))
        reloaded = keras.models.load_model(path, safe_mode=True)  # what serving does: it must load without code
        sample = {k: v[:64] for k, v in xv.items()} if isinstance(xv, dict) else xv[:64]
        if not np.allclose(reloaded.predict(sample, verbose=0), model.predict(sample, verbose=0), atol=1e-5):
            raise RuntimeError("the exported best model predicts differently from the trained one")
        uri = layout.report_uri("best_model.keras")
        store.put_file(path, uri)
    store.write_bytes(layout.report_uri("best_model.json"),
                      json.dumps({"config": config, "features": manifest.features, "inputs": manifest.inputs,
                                  "label": manifest.label, "task": manifest.task, "classes": manifest.classes},
                                 indent=2).encode())
    return uri


def load_saved_model(store: Any, uri: str) -> Any:
    """The ``.keras`` model at ``uri`` in ``store``, loaded the way serving loads it (no custom code)."""
    import keras  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        store.get_file(uri, path)
        return keras.models.load_model(path, safe_mode=True)


SERVING_FORMATS = ("keras", "saved_model")


def export_for_serving(layout: RunLayout, out_dir: str, *, fmt: str = "keras",
                       storage_options: Mapping[str, Any] | None = None,
                       conn_id: str | None = None) -> dict[str, str]:
    """Copy a finished run's best model to ``out_dir`` for serving, with ``model_card.json`` beside it.

    ``fmt="saved_model"`` adds a TensorFlow SavedModel (``saved_model/``, written by Keras's
    ``model.export``) for TensorFlow Serving and other runtimes without Keras. The card is the
    run's own records (``summary.json``, ``metrics.json``, the run record and the manifest), not a
    recomputation. Returns the URI of every file written, by name.
    """
    from mop_airflow.errors import SpecError, StoreError  # noqa: PLC0415
    from mop_airflow.report import versions  # noqa: PLC0415
    from mop_airflow.store import Store  # noqa: PLC0415

    if fmt not in SERVING_FORMATS:
        raise SpecError("--format", fmt, f"is not one of {', '.join(SERVING_FORMATS)}",
                        "use keras (the .keras file) or saved_model (adds a TensorFlow SavedModel)")
    store = layout.store
    summary_uri, model_uri = layout.report_uri("summary.json"), layout.report_uri("best_model.keras")
    if not store.exists(summary_uri) or not store.exists(model_uri):
        raise StoreError(f"run {layout.run_id} of {layout.dag_id} has no report in {layout.run_uri} (no summary.json "
                         "or best_model.keras): its report task has not run. Fix: wait for the run to finish")
    summary = store.read_json(summary_uri)
    run = RunRecord.read(store, layout.run_record_uri)
    manifest = Manifest.read(store, layout.manifest_pointer_uri)
    out_dir = out_dir.rstrip("/") if "://" in out_dir else "file://" + os.path.abspath(os.path.expanduser(out_dir))
    out = Store(out_dir, storage_options, conn_id)
    written = {"best_model.keras": out.uri("best_model.keras")}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "best_model.keras")
        store.get_file(model_uri, path)
        out.put_file(path, written["best_model.keras"])
        if fmt == "saved_model":
            import keras  # noqa: PLC0415

            exported = os.path.join(tmp, "saved_model")
            model = keras.models.load_model(path, safe_mode=True)
            model.export(exported, format="tf_saved_model", verbose=False)
            written["saved_model"] = out.uri("saved_model")
            out.delete_tree(written["saved_model"])  # a stale export's variables must not mix with this one's
            for folder, _, files in os.walk(exported):
                for name in files:
                    local = os.path.join(folder, name)
                    out.put_file(local, out.uri("saved_model", os.path.relpath(local, exported).replace(os.sep, "/")))
    card = model_card(summary, run, manifest, store.read_json(layout.report_uri("metrics.json")), fmt=fmt)
    card["exported_with"] = versions()
    written["model_card.json"] = out.write_json(out.uri("model_card.json"), card)
    return written


def model_card(summary: Mapping[str, Any], run: RunRecord, manifest: Manifest,
               metrics_rows: list[Mapping[str, Any]], *, fmt: str) -> dict[str, Any]:
    """What a serving system needs to know about the model: configuration, metrics, data, versions."""
    import datetime as dt  # noqa: PLC0415

    best = summary["best"]
    config_id = best["config_id"]
    last = max((r for r in metrics_rows if r["config_id"] == config_id), key=lambda r: r["iteration"], default={})
    skip = ("config_id", "model", "iteration", "complete", "hops_done", "shard_order")
    return {
        "name": f"{run.dag_id}/{run.run_id}/{config_id}",
        "dag_id": run.dag_id, "run_id": run.run_id, "config_id": config_id,
        "exported_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "configuration": run.config(config_id),
        "ranked_on": {"metric": run.metric, "direction": run.direction, "value": best[run.metric],
                      "rank": best["rank"], "of": summary["configurations"]},
        "metrics": {"iteration": last.get("iteration"), **{k: v for k, v in last.items() if k not in skip}},
        "data": {"fingerprint": manifest.fingerprint, "source": manifest.source, "rows": manifest.total_rows,
                 "label": manifest.label, "task": manifest.task, "classes": manifest.classes,
                 "features": manifest.features, "inputs": manifest.inputs, "shuffle": manifest.shuffle,
                 "validation_rows": manifest.validation.rows},
        "output": ({"kind": "class probabilities", "order": manifest.classes} if manifest.task == "classification"
                   else {"kind": "regression value"}),
        "training": {"shards": len(manifest.shards), "iterations": run.schedule.iterations,
                     "seed": run.schedule.seed, "model_hops": summary["model_hops"],
                     "first_hop_started_at": summary.get("first_hop_started_at"),
                     "last_hop_saved_at": summary.get("last_hop_saved_at")},
        "versions": summary["versions"],
        "files": {"keras": "best_model.keras", **({"saved_model": "saved_model/"} if fmt == "saved_model" else {})},
    }
