"""The decision at a rung boundary of an adaptive search, gathered from the rung's hop records.

Ranks the rung's configurations on the validation metric at the end of the rung (direction-aware,
ties by configuration id; :func:`mop_airflow.search.promotion.promote`), records who was promoted
and why every other configuration was pruned, and deals the survivors into the next rung's offset
classes. A configuration whose hop failed or diverged left a record saying so and is pruned with
that reason.
"""

from __future__ import annotations

import math
from typing import Any

from mop_airflow.errors import StoreError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import HopRecord, Plan, RunRecord, RungDecision
from mop_airflow.planning.plan import bundle_classes, class_chains, rung_classes
from mop_airflow.search.promotion import promote


def rung_members(layout: RunLayout, plan: Plan, bracket: int, rung: int) -> list[list[str]]:
    """The offset classes of rung ``rung`` of ``bracket``: from the plan, or the previous decision."""
    if rung == 0:
        return plan.rung0_classes[str(bracket)]
    return RungDecision.read(layout.store, layout.rung_decision_uri(bracket, rung - 1)).next_classes


def rung_bundles(layout: RunLayout, plan: Plan, bracket: int, rung: int) -> list[list[list[str]]]:
    """The bundles of each offset class of rung ``rung`` of ``bracket``: from the plan, or the previous decision
    (records written before bundling: one bundle per configuration)."""
    if rung == 0:
        found = plan.rung0_bundles.get(str(bracket))
    else:
        found = RungDecision.read(layout.store, layout.rung_decision_uri(bracket, rung - 1)).next_bundles
    return found or [[[cid] for cid in members] for members in rung_members(layout, plan, bracket, rung)]


def decide_rung(layout: RunLayout, run: RunRecord, plan: Plan, *, bracket: int, rung: int, start: int, end: int,
                keep: int) -> RungDecision:
    """Rank rung ``rung`` of ``bracket`` (global hops ``start``..``end - 1``), write and return the decision."""
    members = [cid for members in rung_members(layout, plan, bracket, rung) for cid in members]
    shards = plan.shards
    results = [_result(layout, cid, run.metric, start, end, shards) for cid in sorted(members)]
    promoted, pruned = promote(results, keep=keep, direction=run.direction)
    next_classes = rung_classes(run, promoted, rows=plan.shard_rows, seed=plan.seed, bracket=bracket, rung=rung + 1)
    by_id = {r["config_id"]: r for r in results}
    decision = RungDecision(
        bracket=bracket, rung=rung, metric=run.metric, direction=run.direction, keep=keep,
        iterations_done=end // shards, results=results, promoted=promoted,
        pruned=[{**entry, "rung": rung, "bracket": bracket,
                 "iterations_done": by_id[entry["config_id"]]["iterations_done"]} for entry in pruned],
        next_classes=next_classes,
        # promote re-bundles the survivors: fewer configurations make fewer, smaller bundles
        next_bundles=bundle_classes(run, next_classes, hops=end - start, rows=plan.shard_rows,
                                    chains=class_chains(plan.chains, f"bracket_{bracket}.rung_{rung + 1}.", shards)),
    )
    decision.write(layout.store, layout.rung_decision_uri(bracket, rung))
    return decision


def _result(layout: RunLayout, cid: str, metric: str, start: int, end: int, shards: int) -> dict[str, Any]:
    """The configuration's metric at the end of the rung, or why it has none."""
    record = _hop_record(layout, cid, end - 1)
    if record is not None and record.status == "ok" and record.val_metrics:
        value = record.val_metrics.get(metric)
        finite = isinstance(value, (int, float)) and math.isfinite(value)
        return {"config_id": cid, "metric": value, "status": "ok" if finite else "diverged",
                "iterations_done": end // shards}
    for t in range(start, end):  # a hop that failed or diverged left a record saying so
        failed = _hop_record(layout, cid, t)
        if failed is not None and failed.status in ("failed", "diverged"):
            return {"config_id": cid, "metric": None, "status": failed.status, "error": failed.error or "",
                    "iterations_done": t // shards}
    return {"config_id": cid, "metric": None, "status": "failed", "error": "no result at the end of the rung",
            "iterations_done": start // shards}


def _hop_record(layout: RunLayout, cid: str, t: int) -> HopRecord | None:
    try:
        return HopRecord.read(layout.store, layout.hop_record_uri(cid, t))
    except StoreError:
        return None
