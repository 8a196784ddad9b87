"""Last task: write the leaderboard, metrics table, learning curves, hop timeline, best model, summary."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from typing import Any

from mop_airflow import report

from mop_airflow.operators.base import MopBaseOperator

REPORT_FILES = ("leaderboard.json", "metrics.parquet", "metrics.json", "learning_curves.png",
                "hop_timeline.json", "best_model.keras", "summary.json")


class MopReportOperator(MopBaseOperator):
    ui_color = "#ece3f8"

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.effective_spec(context)
        layout = self.layout(context, spec)
        store = layout.store
        plan_doc = store.read_json(layout.plan_uri)
        records = report.load_hop_records(layout)
        rows = report.metrics_table(plan_doc, records)
        metric, direction = spec.search.metric, spec.search.direction
        board = report.leaderboard(rows, plan_doc["configs"], metric=metric, direction=direction)
        best = board[0]
        extra = (report.adaptive_outcome(plan_doc, report.load_rung_decisions(layout), board, metric)
                 if "adaptive" in plan_doc else {})
        store.write_json(layout.report_uri("leaderboard.json"),
                         {"metric": metric, "direction": direction, "leaderboard": board, **extra})
        store.write_bytes(layout.report_uri("metrics.parquet"), report.rows_to_parquet(rows))
        store.write_json(layout.report_uri("metrics.json"), rows)
        store.write_bytes(layout.report_uri("learning_curves.png"), report.learning_curves_png(
            rows, metric, {c["config_id"]: report.config_label(c) for c in plan_doc["configs"]}))
        timeline = [{k: r[k] for k in ("config_id", "t", "iteration", "hop", "shard", "host", "queue",
                                       "started_at", "train_begin", "train_end", "saved_at")} for r in records]
        store.write_json(layout.report_uri("hop_timeline.json"), sorted(timeline, key=lambda r: r["started_at"]))
        last_t = max(r["t"] for r in records if r["config_id"] == best["config_id"])
        best_uri = self._export_best(spec, layout, plan_doc, best["config_id"], last_t)
        started = min((r["started_at"] for r in records), default=None)
        summary = {
            "dag_id": context["dag"].dag_id, "run_id": context["run_id"], "spec": spec.to_dict(),
            "configurations": len(plan_doc["configs"]), "model_hops": len(records),
            "first_hop_started_at": _iso(started),
            "last_hop_saved_at": _iso(max((r["saved_at"] for r in records), default=None)),
            "report_written_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "best": best, "best_model_uri": best_uri, "versions": report.versions(),
            "visit_order": report.visit_order(records),
            "files": {name: layout.report_uri(name) for name in REPORT_FILES},
        }
        store.write_json(layout.report_uri("summary.json"), summary)
        self.log.info("leaderboard (%s, %s is better):\n%s", metric, "lower" if direction == "min" else "higher",
                      "\n".join(f"{b['rank']:>3} {b['config_id']} {b[metric]}" for b in board))
        return {"best_config_id": best["config_id"], metric: best[metric], "report_uri": layout.report_uri(""),
                "best_model_uri": best_uri}

    @staticmethod
    def _export_best(spec: Any, layout: Any, plan_doc: dict, config_id: str, last_t: int) -> str:
        """Rebuild the winner, load its final checkpoint, save it as .keras and prove it loads and predicts."""
        import keras  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415

        from mop_airflow.data.cache import cached_shard, load_xy  # noqa: PLC0415
        from mop_airflow.schedule import config_seed  # noqa: PLC0415
        from mop_airflow.training.builder import build_model  # noqa: PLC0415
        from mop_airflow.training.checkpoint import restore_state  # noqa: PLC0415
        from mop_airflow.training.hop import export_keras  # noqa: PLC0415

        store = layout.store
        manifest = store.read_json(plan_doc["manifest_uri"])
        config = next(c for c in plan_doc["configs"] if c["config_id"] == config_id)
        xv, _ = load_xy(cached_shard(store, manifest["validation"], spec.store.local_cache),
                        manifest["features"], manifest["label"], manifest["classes"])
        model = build_model(config, input_dim=xv.shape[1], num_classes=len(manifest["classes"]),
                            seed=config_seed(spec.schedule.seed, config_id))
        restore_state(model, store.read_bytes(layout.checkpoint_uri(config_id, last_t)))
        with tempfile.TemporaryDirectory() as tmp:
            path = export_keras(model, os.path.join(tmp, "best_model.keras"))
            reloaded = keras.models.load_model(path)
            sample = xv[: min(len(xv), 64)]
            if not np.allclose(reloaded.predict(sample, verbose=0), model.predict(sample, verbose=0), atol=1e-5):
                raise RuntimeError("the exported best model predicts differently from the trained one")
            uri = layout.report_uri("best_model.keras")
            store.put_file(path, uri)
        store.write_bytes(layout.report_uri("best_model.json"),
                          json.dumps({"config": config, "features": manifest["features"], "label": manifest["label"],
                                      "classes": manifest["classes"]}, indent=2).encode())
        return uri


def _iso(timestamp: float | None) -> str | None:
    return None if timestamp is None else dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).isoformat()
