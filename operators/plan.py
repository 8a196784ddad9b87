"""Freeze the run into the store, stage each shard on its worker, and list each block's classes.

``plan`` writes the run record and the hop plan (every configuration's offset class and visit
order; an adaptive search's first block decision) before anything trains. ``stage_shard_<s>`` runs
on shard ``s``'s queue: its worker copies the shard (and the validation set) into its local cache
once, and, in a plain search, lists the configurations of offset class ``s`` (as bundles), each from
where it starts, for the block's train tasks. An adaptive search's train tasks read what they train
from the decision before their block.
"""

from __future__ import annotations

import socket
from typing import Any

from mop_airflow.planning.resume import bundle_items, resume_after
from mop_airflow.records import Assignment, Manifest, Plan, StageRecord
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
            return {"plan_uri": layout.plan_uri, "configurations": len(plan.bundle_of()),
                    "model_hops_total": plan.model_hops_total}
        run = self.resolved_run(context)
        manifest = Manifest.read(layout.store, layout.manifest_pointer_uri)
        plan = make_plan(run, self.priority, rows=max(e.rows for e in manifest.shards))
        run.write(layout.store, layout.run_record_uri)
        plan.write(layout.store, layout.plan_uri)
        for o, bundles in enumerate(plan.class_bundles()):
            self.log.info("class %d starts on shard %d, %d bundle(s): %s", o, o, len(bundles),
                          " | ".join(", ".join(b) for b in bundles) or "(empty)")
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
    """Warm this shard's local cache; in a plain search, list the configurations that start here."""

    ui_color = "#e3f4e1"

    def __init__(self, *, shard: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard = shard

    def work(self, context: Any) -> list[dict[str, Any]] | None:
        """The bundles of offset class ``shard``, after caching the shard."""
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
        plan = Plan.read(layout.store, layout.plan_uri)
        continuing = self.continuation(context)
        if plan.adaptive:  # each block's train tasks read what trains from its decision; ASHA's slots decide
            return []
        per_class = plan.class_bundles()
        # The class whose configurations reach this shard at the block's first hop: its own in a run
        # of whole iterations, another in a block that starts inside an iteration (shard (o + t) mod p).
        cls = (self.shard - (continuing.start if continuing else 0)) % plan.shards
        bundles = per_class[cls]
        if continuing is None:
            resumed = {cid: Assignment(config_id=cid, t=-1, checkpoint=None) for b in bundles for cid in b}
        else:  # a block after the first: each configuration from its state after the block before
            resumed = {cid: self._resumed(layout, cid, continuing.start - 1) for b in bundles for cid in b}
            bundles = [[cid for cid in members if resumed[cid] is not None] for members in bundles]
        return bundle_items(bundles, sum(len(b) for b in per_class[:cls]), resumed.__getitem__)

    def _resumed(self, layout: Any, cid: str, t: int) -> Assignment | None:
        resumed = resume_after(layout, cid, t)
        if resumed is None:
            self.log.info("%s did not finish hop %d (it failed earlier): it trains no further", cid, t)
        return resumed
