"""Validate the input with Great Expectations, then shard it once into the store."""

from __future__ import annotations

from typing import Any

from mop_airflow.operators.base import MopBaseOperator


class MopValidateDataOperator(MopBaseOperator):
    """Fails the run, listing every failed expectation, before anything is written or trained."""

    ui_color = "#fdf2d0"

    def execute(self, context: Any) -> dict[str, Any]:
        from mop_airflow.data.validate import validate_source  # noqa: PLC0415 - GE import is slow

        spec = self.effective_spec(context)
        batch = max(c["batch_size"] for c in spec.configurations())
        summary = validate_source(spec.data, shards=spec.schedule.shards, max_batch_size=batch)
        self.log.info("input valid: %s rows, classes %s", summary["rows"], summary["class_counts"])
        return summary


class MopShardOperator(MopBaseOperator):
    """Splits the input into the schedule's shards plus a validation set (reused for the same input and seed)."""

    ui_color = "#fdf2d0"

    def execute(self, context: Any) -> dict[str, Any]:
        from mop_airflow.data.shard import shard_dataset  # noqa: PLC0415

        spec = self.effective_spec(context)
        layout = self.layout(context, spec)
        manifest = shard_dataset(spec.data, layout.store, context["dag"].dag_id,
                                 spec.schedule.shards, spec.schedule.seed)
        layout.store.write_json(layout.manifest_pointer_uri, manifest)
        self.log.info("%s %d shards (%s rows) + %d validation rows, fingerprint %s",
                      "reused" if manifest.get("reused") else "wrote", len(manifest["shards"]),
                      [s["rows"] for s in manifest["shards"]], manifest["validation"]["rows"],
                      manifest["fingerprint"])
        return {"manifest_uri": layout.manifest_pointer_uri, "fingerprint": manifest["fingerprint"],
                "reused": bool(manifest.get("reused"))}
