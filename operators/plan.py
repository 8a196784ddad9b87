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

from mop_airflow.schedule import build_plan, group_on, hash_seed
from mop_airflow.search.adaptive import brackets_of, split_by_bracket
from mop_airflow.search.hyperband import format_plan

from mop_airflow.operators.base import MopBaseOperator


class MopPlanOperator(MopBaseOperator):
    ui_color = "#e3f4e1"

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.effective_spec(context)
        layout = self.layout(context, spec)
        configs = spec.configurations()
        ids = [c["config_id"] for c in configs]
        document = {
            "dag_id": context["dag"].dag_id,
            "run_id": context["run_id"],
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "spec": spec.to_dict(),
            "configs": configs,
            "manifest_uri": layout.manifest_pointer_uri,
        }
        adaptive = spec.adaptive_plan()
        if adaptive is None:
            plan = build_plan(ids, shards=spec.schedule.shards, iterations=spec.schedule.iterations,
                              seed=spec.schedule.seed)
            document.update(plan=plan.to_dict(), model_hops_total=len(configs) * plan.total_hops)
            for g, members in enumerate(plan.groups):
                self.log.info("group %d starts on shard %d: %s", g, g, ", ".join(members) or "(empty)")
        else:
            brackets = split_by_bracket(ids, adaptive)
            longest = max(r.r_i for b in brackets_of(adaptive) for r in b.rungs)
            document.update(adaptive=adaptive.to_dict(), brackets={str(s): m for s, m in brackets.items()},
                            model_hops_total=adaptive.total_hops,
                            plan={"shards": spec.schedule.shards, "iterations": int(longest), "seed": spec.schedule.seed})
            self.log.info("\n%s", format_plan(adaptive))
        layout.store.write_json(layout.plan_uri, document)
        return {"plan_uri": layout.plan_uri, "configurations": len(configs),
                "model_hops_total": document["model_hops_total"]}


class MopStageShardOperator(MopBaseOperator):
    """Warm this shard's local cache and emit the starting state of the group that begins here.

    For a plain MOP search that is the plan's group ``shard``. In an adaptive search a stage task
    opens every rung of a bracket: at rung 0 it deals the bracket's configurations into groups; at a
    later rung it deals the configurations the previous rung promoted (they resume from their
    checkpoints) and passes the pruned ones along marked, so they show as skipped hops.
    """

    ui_color = "#e3f4e1"

    def __init__(self, *, shard: int, t0: int = 0, bracket: int | None = None, rung: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard = shard
        self.t0 = t0
        self.bracket = bracket
        self.rung = rung

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
        layout.store.write_json(layout.stage_record_uri(self.shard, self.bracket, self.rung), {
            "shard": self.shard, "host": getattr(ti, "hostname", None) or socket.getfqdn(), "queue": self.queue,
            "cache_dir": spec.store.local_cache, "data_bytes_read": layout.store.bytes_read - before,
        })
        by_id = {c["config_id"]: c for c in document["configs"]}
        p = spec.schedule.shards
        if self.bracket is None:
            group = document["plan"]["groups"][self.shard]  # group g starts on shard g
            return [{"config_id": cid, "config": by_id[cid], "checkpoint": None, "t": -1} for cid in group]
        if self.rung == 0:
            members, pruned = document["brackets"][str(self.bracket)], []
        else:
            decision = layout.store.read_json(layout.rung_decision_uri(self.bracket, self.rung - 1))
            members, pruned = decision["promoted"], decision["pruned"]
        groups = build_plan(members, shards=p, iterations=1, seed=hash_seed(spec.schedule.seed, self.bracket, self.rung)).groups
        here = group_on(self.shard, self.t0, p)  # the group that the rotation puts on this shard at hop t0
        checkpoint = (lambda cid: layout.checkpoint_uri(cid, self.t0 - 1)) if self.t0 else (lambda cid: None)
        out = [{"config_id": cid, "config": by_id[cid], "checkpoint": checkpoint(cid), "t": self.t0 - 1}
               for cid in groups[here]]
        out += [{"config_id": entry["config_id"], "config": by_id[entry["config_id"]], "checkpoint": None,
                 "t": self.t0 - 1, "pruned": entry["reason"]} for k, entry in enumerate(pruned) if k % p == here]
        return out
