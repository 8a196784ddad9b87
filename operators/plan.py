"""Freeze the run into the store and stage each shard on its worker.

``plan`` writes the run record and the hop plan (every configuration's offset class, lineup and
visit order; an adaptive search's first block decision) before anything trains. ``stage_shard_<s>``
runs on shard ``s``'s queue: its worker copies the shard (and the validation set) into its local
cache once, before the block's train tasks start. The train tasks read what they train from the
plan, or from the decision before their block (:mod:`mop_airflow.planning.resume`).
"""

from __future__ import annotations

import socket
from typing import Any

from mop_airflow.records import Manifest, Plan, StageRecord
from mop_airflow.planning.plan import make_plan
from mop_airflow.planning.schedule import DEFAULT_PRIORITY

from mop_airflow.operators.base import MopBaseOperator


class MopPlanOperator(MopBaseOperator):
    ui_color = "#e3f4e1"

    def __init__(self, *, priority: str = DEFAULT_PRIORITY, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.priority = priority

    def work(self, context: Any) -> dict[str, Any]:
        from mop_airflow.search.hyperband import format_plan  # noqa: PLC0415

        layout = self.layout(context)
        if self.continuation(context) is not None:  # planned once, by the search's first run
            plan = Plan.read(layout.store, layout.plan_uri)
            return {"plan_uri": layout.plan_uri, "configurations": len(self.run_record(layout).configs),
                    "model_hops_total": plan.model_hops_total}
        run = self.resolved_run(context)
        manifest = Manifest.read(layout.store, layout.manifest_pointer_uri)
        plan = make_plan(run, self.priority, rows=max(e.rows for e in manifest.shards))
        run.write(layout.store, layout.run_record_uri)
        plan.write(layout.store, layout.plan_uri)
        for o, members in enumerate(plan.class_lineup() if not plan.adaptive else []):
            self.log.info("class %d starts on shard %d: %s", o, o, ", ".join(members) or "(empty)")
        if plan.decided_in_slots:
            self.log.info("ASHA decided inside the shard slots: each slot that finds nothing ready asks what "
                          "trains next; one block, %d configuration(s) at most in flight", plan.adaptive["n"])
        elif plan.adaptive:  # the first block: what the method starts with
            from mop_airflow.planning.blocks import first_block  # noqa: PLC0415
            from mop_airflow.search.adaptive import LADDERS, adaptive_plan  # noqa: PLC0415

            adaptive = adaptive_plan(run.adaptive, plan.shards)
            block = first_block(layout, run, plan)
            self.log.info("%s, decided between blocks: block 1 starts %d configuration(s) and trains each %d hop(s), "
                          "to its first decision", run.adaptive["method"], len(block.jobs), block.length(plan.shards))
            if not isinstance(adaptive, LADDERS):  # Hyperband's brackets
                self.log.info("\n%s", format_plan(adaptive))
        return {"plan_uri": layout.plan_uri, "configurations": len(run.configs),
                "model_hops_total": plan.model_hops_total}


class MopStageShardOperator(MopBaseOperator):
    """Warm this shard's local cache before the block's train tasks start."""

    ui_color = "#e3f4e1"

    def __init__(self, *, shard: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard = shard

    def work(self, context: Any) -> None:
        from mop_airflow.data.cache import cache_bytes, cached_shard  # noqa: PLC0415

        layout = self.layout(context)
        store_spec = self.store_spec(context)
        cache_dir = store_spec.local_cache
        manifest = Manifest.read(layout.store, layout.manifest_pointer_uri)
        before = layout.store.bytes_read
        for entry in (manifest.shards[self.shard], manifest.validation):
            path = cached_shard(layout.store, entry, cache_dir, max_bytes=store_spec.cache_max_bytes,
                                manifest=manifest)
            self.log.info("cached %s at %s", entry.uri, path)
        ti = context["ti"]
        StageRecord(shard=self.shard, host=getattr(ti, "hostname", None) or socket.getfqdn(), queue=self.queue,
                    cache_dir=cache_dir, data_bytes_read=layout.store.bytes_read - before,
                    cache_bytes=cache_bytes(cache_dir)).write(layout.store, layout.stage_record_uri(self.shard))
