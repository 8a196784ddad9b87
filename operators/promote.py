"""The branching task between two rungs of a bracket: promote the best, prune the rest.

Ranks the rung's configurations on the validation metric at the end of the rung (direction-aware,
ties by configuration id), records the decision in the store — promoted, and each pruned
configuration with the rung and metric where it stopped, or the reason it failed — and branches to
the next rung's stage tasks, or skips the next rung when nothing is promoted.
"""

from __future__ import annotations

import math
from typing import Any

from airflow.sdk import BranchMixIn

from mop_airflow.errors import StoreError
from mop_airflow.search.promotion import promote

from mop_airflow.operators.base import MopBaseOperator


class MopPromoteOperator(MopBaseOperator, BranchMixIn):
    ui_color = "#f6e7c1"

    def __init__(self, *, bracket: int, rung: int, start: int, end: int, keep: int, next_stage_ids: list[str],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bracket = bracket
        self.rung = rung
        self.start = start
        self.end = end
        self.keep = keep
        self.next_stage_ids = next_stage_ids

    def execute(self, context: Any) -> Any:
        spec = self.effective_spec(context)
        layout = self.layout(context, spec)
        store = layout.store
        if self.rung == 0:
            members = store.read_json(layout.plan_uri)["brackets"][str(self.bracket)]
        else:
            members = store.read_json(layout.rung_decision_uri(self.bracket, self.rung - 1))["promoted"]
        metric = spec.search.metric
        results = [self._result(layout, cid, metric, spec.schedule.shards) for cid in members]
        promoted, pruned = promote(results, keep=self.keep, direction=spec.search.direction)
        by_id = {r["config_id"]: r for r in results}
        decision = {
            "bracket": self.bracket, "rung": self.rung, "metric": metric, "direction": spec.search.direction,
            "keep": self.keep, "iterations_done": self.end // spec.schedule.shards,
            "results": results, "promoted": promoted,
            "pruned": [{**entry, "rung": self.rung, "bracket": self.bracket,
                        "iterations_done": by_id[entry["config_id"]]["iterations_done"]} for entry in pruned],
        }
        store.write_json(layout.rung_decision_uri(self.bracket, self.rung), decision)
        for entry in decision["pruned"]:
            self.log.info("pruned %s at bracket %d rung %d (%s=%s): %s", entry["config_id"], self.bracket, self.rung,
                          metric, entry.get("metric"), entry["reason"])
        self.log.info("promoted to rung %d: %s", self.rung + 1, ", ".join(promoted) or "(none)")
        return self.do_branch(context, self.next_stage_ids if promoted else [])

    def _result(self, layout: Any, cid: str, metric: str, shards: int) -> dict[str, Any]:
        """The configuration's metric at the end of the rung, or why it has none."""
        try:
            record = layout.store.read_json(layout.hop_record_uri(cid, self.end - 1))
        except StoreError:
            record = None
        if record and record.get("val_metrics"):
            value = record["val_metrics"].get(metric)
            finite = isinstance(value, (int, float)) and math.isfinite(value)
            return {"config_id": cid, "metric": value, "status": "ok" if finite else "diverged",
                    "iterations_done": self.end // shards}
        for t in range(self.start, self.end):  # a hop that failed or diverged left a record saying so
            try:
                failed = layout.store.read_json(layout.hop_record_uri(cid, t))
            except StoreError:
                continue
            if failed.get("status") in ("failed", "diverged"):
                return {"config_id": cid, "metric": None, "status": failed["status"],
                        "error": failed.get("error", ""), "iterations_done": t // shards}
        return {"config_id": cid, "metric": None, "status": "failed", "error": "no result at the end of the rung",
                "iterations_done": self.start // shards}
