"""Resolve the search space into configurations and the hop plan, then stage each shard.

The plan (configurations, groups, the visit order of every configuration) is written to the store
before anything trains, so a run can be inspected and replayed. Staging runs on each shard's queue:
the worker that owns a shard copies it (and the validation set) into its local cache once, and
hands the group that starts on that shard to the first training hop.
"""

from __future__ import annotations

import datetime as dt
import socket
from typing import Any

from mop_airflow.schedule import build_plan

from mop_airflow.operators.base import MopBaseOperator


class MopPlanOperator(MopBaseOperator):
    ui_color = "#e3f4e1"

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.effective_spec(context)
        layout = self.layout(context, spec)
        configs = spec.search.space.expand(spec.schedule.epochs_per_hop)
        plan = build_plan([c["config_id"] for c in configs], shards=spec.schedule.shards,
                          iterations=spec.schedule.iterations, seed=spec.schedule.seed)
        document = {
            "dag_id": context["dag"].dag_id,
            "run_id": context["run_id"],
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "spec": spec.to_dict(),
            "configs": configs,
            "plan": plan.to_dict(),
            "manifest_uri": layout.manifest_pointer_uri,
            "model_hops_total": len(configs) * plan.total_hops,
        }
        layout.store.write_json(layout.plan_uri, document)
        for g, members in enumerate(plan.groups):
            self.log.info("group %d starts on shard %d: %s", g, g, ", ".join(members) or "(empty)")
        return {"plan_uri": layout.plan_uri, "configurations": len(configs),
                "model_hops_total": document["model_hops_total"]}


class MopStageShardOperator(MopBaseOperator):
    """Warm this shard's local cache and emit the starting state of the group that begins here."""

    ui_color = "#e3f4e1"

    def __init__(self, *, shard: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard = shard

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from mop_airflow.data.cache import cached_shard  # noqa: PLC0415

        spec = self.effective_spec(context)
        layout = self.layout(context, spec)
        document = layout.store.read_json(layout.plan_uri)
        manifest = layout.store.read_json(document["manifest_uri"])
        before = layout.store.bytes_read
        for entry in (manifest["shards"][self.shard], manifest["validation"]):
            path = cached_shard(layout.store, entry, spec.store.local_cache)
            self.log.info("cached %s at %s", entry["uri"], path)
        ti = context["ti"]
        layout.store.write_json(layout.stage_record_uri(self.shard), {
            "shard": self.shard, "host": getattr(ti, "hostname", None) or socket.getfqdn(), "queue": self.queue,
            "cache_dir": spec.store.local_cache, "data_bytes_read": layout.store.bytes_read - before,
        })
        by_id = {c["config_id"]: c for c in document["configs"]}
        group = document["plan"]["groups"][self.shard]  # group g starts on shard g
        return [{"config_id": cid, "config": by_id[cid], "checkpoint": None, "t": -1} for cid in group]
