"""Copy a finished run's winner out for serving, with a model card (:func:`export_for_serving`).

The report task already saved the winner as ``report/best_model.keras``
(:func:`mop_airflow.training.best_model.export_best`); this copies it, and on request adds a
TensorFlow SavedModel."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Mapping

from mop_airflow.records.layout import RunLayout, read_run
from mop_airflow.records import Manifest, RunRecord
from mop_airflow.training.best_model import versions


SERVING_FORMATS = ("keras", "saved_model")


def export_for_serving(layout: RunLayout, out_dir: str, *, fmt: str = "keras",
                       options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Copy a finished run's best model to ``out_dir`` for serving, with ``model_card.json`` beside it.

    ``fmt="saved_model"`` adds a TensorFlow SavedModel (``saved_model/``, written by Keras's
    ``model.export``) for TensorFlow Serving and other runtimes without Keras. The card is the
    run's own records (``summary.json``, ``metrics.json``, the run record and the manifest), not a
    recomputation. Returns the URI of every file written, by name.
    """
    from mop_airflow.errors import SpecError, StoreError  # noqa: PLC0415
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
    run = read_run(layout)
    manifest = Manifest.read(store, layout.manifest_pointer_uri)
    out_dir = out_dir.rstrip("/") if "://" in out_dir else "file://" + os.path.abspath(os.path.expanduser(out_dir))
    out = Store(out_dir, options)
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
