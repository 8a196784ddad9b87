"""The decision at a rung boundary: rank the configurations of a rung, promote the best, prune the rest.

Pure functions over plain dicts, so the decide step that ends a block of a Hyperband or
successive-halving search only gathers results and calls :func:`promote`. A result is
``{"config_id": str, "metric": float | None, "status": "ok" | "failed" | "diverged"}`` (a failed
result may carry ``"error"``, the message shown in its pruning reason).

Only a configuration with status "ok" and a finite metric can be ranked and promoted. A failed or
diverged configuration, one that reported no metric, or one whose metric is NaN or infinite (a
loss that blew up) goes last and is never promoted, even when ``keep`` exceeds the number of
rankable configurations: a rung may promote fewer than ``keep``. Ties in the metric go to the
lower ``config_id``, so the same results always give the same promotions.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Sequence

from mop_airflow.errors import SpecError

STATUSES = ("ok", "failed", "diverged")
DIRECTIONS = ("min", "max")


def rank_rung(results: Sequence[Mapping[str, Any]], *, direction: str) -> list[Mapping[str, Any]]:
    """``results`` best first: rankable ones by metric (ties: lower config_id), then the rest by config_id."""
    _check_direction(direction)
    _check_results(results)
    sign = 1.0 if direction == "min" else -1.0
    rankable = sorted((r for r in results if _rankable(r)), key=lambda r: (sign * float(r["metric"]), r["config_id"]))
    rest = sorted((r for r in results if not _rankable(r)), key=lambda r: r["config_id"])
    return rankable + rest


def promote(results: Sequence[Mapping[str, Any]], *, keep: int,
            direction: str) -> tuple[list[str], list[dict[str, Any]]]:
    """The config_ids of the best ``keep`` rankable results, and why every other one was pruned.

    Each pruned entry is ``{"config_id", "reason", "metric"}`` with reason
    ``"ranked below the top <keep>"``, ``"failed: <error>"`` or ``"diverged"``; both lists are in
    rank order.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise SpecError("keep", keep, "must be an integer >= 0",
                        "promote floor(n_i / eta) configurations, or 0 after the last rung")
    promoted: list[str] = []
    pruned: list[dict[str, Any]] = []
    for result in rank_rung(results, direction=direction):
        reason = _unrankable_reason(result)
        if reason is None and len(promoted) < keep:
            promoted.append(result["config_id"])
            continue
        pruned.append({"config_id": result["config_id"], "reason": reason or f"ranked below the top {keep}",
                       "metric": result.get("metric")})
    return promoted, pruned


def _rankable(result: Mapping[str, Any]) -> bool:
    return _unrankable_reason(result) is None


def _unrankable_reason(result: Mapping[str, Any]) -> str | None:
    status, metric = result["status"], result.get("metric")
    if status == "failed":
        return f"failed: {result.get('error') or 'no error message recorded'}"
    if status == "diverged":
        return "diverged"
    if metric is None:
        return "failed: no metric reported"
    if not math.isfinite(metric):
        return "diverged"  # a NaN or infinite metric is a loss that blew up, whatever the status says
    return None


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise SpecError("search.direction", direction, "must be 'min' or 'max'",
                        "use 'min' for losses and errors, 'max' for accuracy-like metrics")


def _check_results(results: Sequence[Mapping[str, Any]]) -> None:
    if isinstance(results, (str, bytes)) or not isinstance(results, Sequence):
        raise SpecError("rung results", results, "must be a list of result dicts",
                        "pass [{'config_id': ..., 'metric': ..., 'status': 'ok'}, ...]")
    seen: set[str] = set()
    for k, result in enumerate(results):
        where = f"rung results[{k}]"
        if not isinstance(result, Mapping):
            raise SpecError(where, result, "must be a dict with config_id, metric and status",
                            "pass {'config_id': 'c000-abc123', 'metric': 0.41, 'status': 'ok'}")
        cid = result.get("config_id")
        if not isinstance(cid, str) or not cid:
            raise SpecError(f"{where}.config_id", cid, "must be a non-empty string", "use the id from expand()")
        if cid in seen:
            raise SpecError(f"{where}.config_id", cid, "appears more than once in the rung",
                            "report each configuration once per rung")
        seen.add(cid)
        if result.get("status") not in STATUSES:
            raise SpecError(f"{where}.status", result.get("status"), f"must be one of {list(STATUSES)}",
                            "report 'ok' for a trained configuration, 'failed' or 'diverged' otherwise")
        metric = result.get("metric")
        if metric is not None and (isinstance(metric, bool) or not isinstance(metric, numbers.Real)):
            raise SpecError(f"{where}.metric", metric, "must be a number or None",
                            "report the validation metric as a float")
