"""Scatter/gather sharding: list the source, validate and scatter each slice of files, collect the shards.

``list_data`` lists the source once and cuts it into slices of whole files; ``scatter`` is mapped
over the slices, each instance validating its files with Great Expectations and writing their
rows into the shards' parts; ``shard`` merges every slice's findings into one error (or writes the
manifest). No task reads the whole source, and the scatter instances run on any free workers.
"""

from __future__ import annotations

from typing import Any

from mop_airflow.hooks.connections import data_options
from mop_airflow.operators.base import MopBaseOperator
from mop_airflow.records import Manifest, ShardingPlan, SliceResult


class MopListDataOperator(MopBaseOperator):
    """Lists and fingerprints the source, cuts it into slices; returns the slice indexes to map over."""

    ui_color = "#fdf2d0"

    def work(self, context: Any) -> list[int]:
        from mop_airflow.data.shard import plan_sharding, write_plan  # noqa: PLC0415

        continuing = self.continuation(context)
        if continuing is not None:
            self.log.info("the shards of run %s's search are in place; nothing to list", continuing.first_run)
            return [0]  # one scatter instance, which does nothing either
        run = self.resolved_run(context)
        layout = self.layout(context)
        plan = plan_sharding(run.data, layout.store, run.dag_id, run.schedule.shards, run.schedule.seed,
                             options=data_options(run.data))
        write_plan(plan, layout.store, layout.sharding_plan_uri)
        self.log.info("%d file(s), %d rows, %.1f MB in %d slice(s); shards %s (fingerprint %s)",
                      len(plan.listing.files), plan.listing.total_rows, plan.listing.total_bytes / 1e6,
                      len(plan.slices), "exist and are reused" if plan.reused else "will be written", plan.fingerprint)
        return [piece.index for piece in plan.slices]


class MopScatterOperator(MopBaseOperator):
    """Validates one slice of files and writes its rows into the shards' parts (nothing if a rule breaks)."""

    ui_color = "#fdf2d0"
    template_fields = ("slice_index",)

    def __init__(self, *, slice_index: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slice_index = slice_index

    def work(self, context: Any) -> dict[str, Any]:
        from mop_airflow.data.shard import scatter_slice  # noqa: PLC0415

        if self.continuation(context) is not None:
            return {"slice": int(self.slice_index), "rows": 0, "wrote": False, "continues": True}
        run = self.resolved_run(context)
        layout = self.layout(context)
        plan = ShardingPlan.read(layout.store, layout.sharding_plan_uri)
        result = scatter_slice(plan, run.data, layout.store, int(self.slice_index), _checks(run, plan),
                               options=data_options(run.data))
        result.write(layout.store, layout.slice_result_uri(result.index))
        rows = [p.rows if p else 0 for p in result.parts]
        piece = plan.slices[result.index]
        self.log.info("slice %d (%s files %d-%d, %d rows): %s", piece.index, piece.role, piece.start,
                      piece.end - 1, piece.rows, f"rows per part {rows}" if result.wrote else
                      "validated; nothing written" + (" (shards reused)" if plan.reused else ""))
        return {"slice": result.index, "rows": piece.rows, "wrote": result.wrote}


class MopShardOperator(MopBaseOperator):
    """Fails the run listing every failed expectation of every slice, else writes the shards' manifest."""

    ui_color = "#fdf2d0"

    def work(self, context: Any) -> dict[str, Any]:
        from mop_airflow.data.shard import collect_shards  # noqa: PLC0415
        from mop_airflow.errors import DataValidationError  # noqa: PLC0415

        layout = self.layout(context)
        if self.continuation(context) is not None:
            manifest = Manifest.read(layout.store, layout.manifest_pointer_uri)
            return {"manifest_uri": layout.manifest_pointer_uri, "fingerprint": manifest.fingerprint, "reused": True}
        run = self.resolved_run(context)
        plan = ShardingPlan.read(layout.store, layout.sharding_plan_uri)
        results = [SliceResult.read(layout.store, layout.slice_result_uri(piece.index)) for piece in plan.slices]
        try:
            manifest = collect_shards(plan, run.data, layout.store, results, _checks(run, plan))
        except DataValidationError:
            layout.store.delete_tree(layout.data_records_uri)  # bad input leaves nothing in the store
            raise
        manifest.write(layout.store, layout.manifest_pointer_uri)
        self.log.info("%s %d shards (%s rows) + %d validation rows, classes %s, fingerprint %s",
                      "reused" if manifest.reused else "wrote", len(manifest.shards),
                      [s.rows for s in manifest.shards], manifest.validation.rows, manifest.classes,
                      manifest.fingerprint)
        return {"manifest_uri": layout.manifest_pointer_uri, "fingerprint": manifest.fingerprint,
                "reused": manifest.reused}


def _checks(run: Any, plan: ShardingPlan) -> Any:
    """The run's data checks, planned from the listings alike in every scatter task and in shard."""
    from mop_airflow.data.validate import DataChecks  # noqa: PLC0415 - Great Expectations' helpers load with it

    return DataChecks.plan(run.data, plan.listing, plan.held, shards=run.schedule.shards,
                           max_batch_size=run.max_batch_size)
