"""Validate the input with Great Expectations, then shard it once into the store."""

from __future__ import annotations

from typing import Any

from mop_airflow.operators.base import MopBaseOperator


class MopValidateDataOperator(MopBaseOperator):
    """Fails the run, listing every failed expectation, before anything is written or trained."""

    ui_color = "#fdf2d0"

    def execute(self, context: Any) -> dict[str, Any]:
        from mop_airflow.data.validate import validate_source  # noqa: PLC0415 - GE import is slow

        run = self.resolved_run(context)
        summary = validate_source(run.data, shards=run.schedule.shards, max_batch_size=run.max_batch_size)
        self.log.info("input valid: %s rows, classes %s", summary["rows"], summary["class_counts"])
        return summary


class MopShardOperator(MopBaseOperator):
    """Splits the input into the schedule's shards plus a validation set (reused for the same input and seed)."""

    ui_color = "#fdf2d0"

    def execute(self, context: Any) -> dict[str, Any]:
        from mop_airflow.data.shard import shard_dataset  # noqa: PLC0415

        run = self.resolved_run(context)
        layout = self.layout(context)
        manifest = shard_dataset(run.data, layout.store, run.dag_id, run.schedule.shards, run.schedule.seed)
        manifest.write(layout.store, layout.manifest_pointer_uri)
        self.log.info("%s %d shards (%s rows) + %d validation rows, fingerprint %s",
                      "reused" if manifest.reused else "wrote", len(manifest.shards),
                      [s.rows for s in manifest.shards], manifest.validation.rows, manifest.fingerprint)
        return {"manifest_uri": layout.manifest_pointer_uri, "fingerprint": manifest.fingerprint,
                "reused": manifest.reused}
