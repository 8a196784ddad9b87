"""One run's results as plain data for the results page: plan, progress, leaderboard, learning
curves and the hop timeline, read from the run's folder in the store.

While the run trains there is no report yet, so everything is built from what the run has
recorded so far: ``run.json`` (or the run record preflight resolved), ``plan.json``, the hop
records under ``hops/`` and the rung decisions under ``rungs/``. The leaderboard is then
provisional (the report's own functions rank what has been evaluated so far); once the report
task has written ``report/summary.json`` the report's leaderboard is shown as it is.

Nothing here imports Airflow: the plugin finds the run record and the store, this module reads.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterator, Mapping, Sequence

from mop_airflow.errors import StoreError
from mop_airflow.records.layout import RunLayout, with_proposed
from mop_airflow.records import BlockDecision, HopRecord, Plan, RunRecord, RungDecision, ShardingPlan
from mop_airflow.results.report import (adaptive_outcome, config_label, leaderboard, mark_outcomes, metrics_table,
                                        pbt_outcome)
from mop_airflow.results.runs import load_all_hops, load_block_decisions, load_rung_decisions, visit_order

# What may be downloaded, by name, from the run's report folder and nowhere else.
DOWNLOADS = {
    "best_model.keras": "application/octet-stream",
    "metrics.parquet": "application/vnd.apache.parquet",
    "metrics.json": "application/json",
    "leaderboard.json": "application/json",
    "summary.json": "application/json",
    "hop_timeline.json": "application/json",
    "learning_curves.png": "image/png",
    "hop_timeline.png": "image/png",
}
MAX_ID_LENGTH = 250  # Airflow's own bound on a DAG id


class NotARunFolder(ValueError):
    """A DAG id or run id that would not name a folder of its own under the store's root."""


def check_ids(dag_id: str, run_id: str) -> None:
    """Refuse ids no real run has: empty, too long, or only dots (``..`` names no folder of its own;
    ``safe_segment`` maps it to underscores, which another run may use)."""
    for name, value in (("dag_id", dag_id), ("run_id", run_id)):
        if not isinstance(value, str) or not value.strip(".") or len(value) > MAX_ID_LENGTH:
            raise NotARunFolder(f"{name}={value!r} does not name a run folder")


def check_folder(layout: RunLayout, run: RunRecord) -> None:
    """Refuse a folder that another run wrote: two run ids may map to one folder name (``safe_segment``)."""
    check_ids(layout.dag_id, layout.run_id)
    if layout.store.exists(layout.run_record_uri):
        owner = layout.store.read_json(layout.run_record_uri)
        if (owner.get("dag_id"), owner.get("run_id")) != (run.dag_id, run.run_id):
            raise NotARunFolder(f"the folder {layout.run_uri} holds run {owner.get('run_id')!r}, not {run.run_id!r}")


def download_uri(layout: RunLayout, name: str) -> str:
    """The store URI of report file ``name``; only names of :data:`DOWNLOADS` are served."""
    if name not in DOWNLOADS:
        raise KeyError(name)
    check_ids(layout.dag_id, layout.run_id)
    return layout.report_uri(name)


def read_chunks(layout: RunLayout, name: str, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """Stream report file ``name`` from the store (a best model may be large); StoreError if absent."""
    uri = download_uri(layout, name)
    if not layout.store.exists(uri):
        raise StoreError(f"not found in the store: {uri}")
    with layout.store.fs.open(uri, "rb") as handle:  # fsspec strips the protocol itself
        while chunk := handle.read(chunk_bytes):
            yield chunk


def run_results(layout: RunLayout, run: RunRecord) -> dict[str, Any]:
    """Everything the results page shows for one run, as JSON-able data."""
    check_folder(layout, run)
    run = with_proposed(layout, run)  # with the configurations a search made between blocks (PBT's copies)
    store = layout.store
    recorded = store.exists(layout.plan_uri)
    if recorded:
        plan = Plan.read(store, layout.plan_uri)
    else:  # the data is still being sharded: a provisional plan, costed with the rows the listing predicts
        from mop_airflow.planning.plan import make_plan  # noqa: PLC0415

        plan = make_plan(run, rows=_listed_shard_rows(layout, run))
    records, failures = load_all_hops(layout) if recorded else ([], {})
    decisions = load_rung_decisions(layout, plan, run) if recorded and plan.adaptive else []
    summary = _read_optional(layout, "summary.json")
    report = _read_optional(layout, "leaderboard.json") if summary is not None else None
    blocks = load_block_decisions(layout) if recorded and plan.decided_between_blocks else []
    rows = metrics_table(plan.shards, run.configs, records)
    board = report if report is not None else provisional_leaderboard(run, plan, rows, records, failures, decisions)
    if report is None and blocks and blocks[0].members:  # PBT on its way: who was replaced, who trains on
        provisional_lineage(board, blocks, plan)
    stage = "reported" if report is not None else "training" if records or failures else \
        "planned" if recorded else "resolved"
    return json_safe({
        "dag_id": layout.dag_id, "run_id": layout.run_id, "stage": stage,
        "metric": run.metric, "direction": run.direction, "created_at": run.created_at,
        "configs": configurations(run, plan),
        "plan": {**plan_view(run, plan, recorded, decisions),
                 "blocks": block_view(blocks)},
        "lineage": lineage_view(blocks, run),
        "progress": progress(plan, records, failures, board["leaderboard"], run.metric),
        "leaderboard": {**board, "final": report is not None},
        "curves": curves(rows, board["leaderboard"], failures, decisions, run.metric),
        "timeline": timeline(records, plan.shards, run.schedule.slots_per_shard),
        "downloads": downloads(layout) if summary is not None else [],
        "summary": _summary_view(summary),
    })


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None: browsers' JSON has neither."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _listed_shard_rows(layout: RunLayout, run: RunRecord) -> int | None:
    """The largest shard's rows once ``list_data`` has written its sharding plan (None before): the plan
    task's deal weighs them, so a provisional plan dealt with them is the one the plan task writes."""
    if not layout.store.exists(layout.sharding_plan_uri):
        return None
    from mop_airflow.data.shard import expected_shard_rows  # noqa: PLC0415  (numpy: not at import)

    return expected_shard_rows(ShardingPlan.read(layout.store, layout.sharding_plan_uri), run.data)


def provisional_leaderboard(run: RunRecord, plan: Plan, rows: Sequence[Mapping[str, Any]],
                            records: Sequence[HopRecord], failures: Mapping[str, HopRecord],
                            decisions: Sequence[RungDecision]) -> dict[str, Any]:
    """The report's ranking of what has been evaluated so far; a configuration still to train is
    ``training`` (or ``waiting`` before its first hop), not ``finished``."""
    metric = run.metric
    board = leaderboard(rows, run.configs, metric=metric, direction=run.direction, failed=failures)
    mark_outcomes(board, failures, decisions)
    extra = adaptive_outcome(plan, decisions, board, metric) if plan.adaptive and plan.brackets else {}
    if extra:  # a bracket none of whose configurations was evaluated yet has no best
        extra["best_per_bracket"] = {s: e for s, e in extra["best_per_bracket"].items() if _finite(e.get(metric))}
    done: dict[str, int] = defaultdict(int)
    for r in records:
        done[r.config_id] += 1
    planned = planned_hops(plan, [c["config_id"] for c in run.configs])
    for row in board:
        cid = row["config_id"]
        if row["status"] == "finished" and done[cid] < planned.get(cid, 0):
            row["status"] = "training" if done[cid] else "waiting"
            row["outcome"] = f"{row['status']}: {done[cid]} of {planned[cid]} hops done"
    return {"metric": metric, "direction": run.direction, "leaderboard": board, **extra}


def planned_hops(plan: Plan, config_ids: Sequence[str]) -> dict[str, int]:
    """The hops each configuration trains if it is never pruned."""
    if not plan.adaptive:
        return {cid: len(shards) for cid, shards in plan.visit_order.items()}
    if plan.adaptive.get("method") == "pbt":  # a copy starts where its parent stood: no fixed count per configuration
        return {}
    if plan.decided_between_blocks and plan.adaptive.get("method") == "asha":  # a configuration trains at most R iterations
        return {cid: plan.adaptive["R"] * plan.shards for cid in config_ids}
    last = {str(b["s"]): b["rungs"][-1]["hops_i"] for b in _brackets(plan.adaptive)}
    return {cid: last[s] for s, members in plan.brackets.items() for cid in members}


def configurations(run: RunRecord, plan: Plan) -> list[dict[str, Any]]:
    bracket = {cid: int(s) for s, members in plan.brackets.items() for cid in members}
    offset = {cid: o for o, members in enumerate(plan.classes) for cid in members}
    return [{"config_id": c["config_id"], "label": config_label(c), "model": c["model"],
             "optimizer": c["optimizer"], "learning_rate": c["optimizer_params"].get("learning_rate"),
             "batch_size": c["batch_size"], "epochs_per_hop": c["epochs_per_hop"], "hparams": c["hparams"],
             "bracket": bracket.get(c["config_id"]), "offset_class": offset.get(c["config_id"])}
            for c in run.configs]


def plan_view(run: RunRecord, plan: Plan, recorded: bool, decisions: Sequence[RungDecision]) -> dict[str, Any]:
    """The plan as the page shows it: offset classes, or brackets with their rungs and each rung's decision."""
    schedule = run.schedule
    decided = {(d.bracket, d.rung): d for d in decisions}
    brackets = []
    for b in _brackets(plan.adaptive) if plan.adaptive else []:
        rungs = []
        for g in b["rungs"]:
            decision = decided.get((b["s"], g["i"]))
            rungs.append({**g, "decided": decision is not None,
                          "promoted": decision.promoted if decision else [],
                          "pruned": [e["config_id"] for e in decision.pruned] if decision else []})
        brackets.append({"s": b["s"], "n": b["n"], "configs": plan.brackets.get(str(b["s"]), []), "rungs": rungs})
    return {"recorded": recorded, "shards": plan.shards, "iterations": plan.iterations, "seed": plan.seed,
            "epochs_per_hop": schedule.epochs_per_hop, "slots_per_shard": schedule.slots_per_shard,
            "model_hops_total": plan.model_hops_total, "configurations": len(run.configs),
            "method": run.spec["search"]["space"].get("method"),
            "adaptive": {k: v for k, v in (plan.adaptive or {}).items() if k != "brackets"} or None,
            "classes": plan.classes, "visit_order": plan.visit_order, "brackets": brackets}


def block_view(decisions: Sequence[BlockDecision]) -> list[dict[str, Any]]:
    """A search decided between blocks: what each block's step decided, in the order it did."""
    return [{"block": d.block, "training": len(d.training), "finished": d.finished, "capacity": d.capacity,
             "jobs": d.jobs} for d in decisions]


def provisional_lineage(board: Mapping[str, Any], blocks: Sequence[BlockDecision], plan: Plan) -> None:
    """A population-based training search still training: each replaced configuration says so, and the
    members of the latest block are training (the report's words once it has ended)."""
    extra = pbt_outcome(blocks, plan, board["leaderboard"])
    latest = blocks[-1]
    if not latest.finished:
        for row in board["leaderboard"]:
            if row["config_id"] in latest.training and row["status"] not in ("failed", "diverged"):
                row["status"] = "training"
                row["outcome"] = (f"training: member {row['member']}, iteration {latest.block + 1} of "
                                  f"{plan.adaptive['iterations']}")
    board.update(extra)


def lineage_view(decisions: Sequence[BlockDecision], run: RunRecord) -> dict[str, Any] | None:
    """Population-based training's family tree: per member, the configurations it trained as, each a
    segment of iterations with the values of the mutated fields, and every copy (who copied whom after
    which iteration, on which metric values); None for any other search."""
    if not decisions or not decisions[0].members:
        return None
    from mop_airflow.search.space import config_field  # noqa: PLC0415

    mutated = sorted((run.adaptive or {}).get("mutations") or {})
    configs = {c["config_id"]: c for c in run.configs}
    segments: list[dict[str, Any]] = []
    for m in range(len(decisions[0].members)):
        for d in decisions:
            if not d.training:
                continue  # the finished search's last decision trains nothing
            cid = d.members[m]
            if segments and segments[-1]["member"] == m and segments[-1]["config_id"] == cid:
                segments[-1]["to"] = d.block + 1
            elif cid in d.training:
                segments.append({"member": m, "config_id": cid, "from": d.block, "to": d.block + 1,
                                 "values": {k: config_field(configs[cid], k) for k in mutated if cid in configs}})
    copies = [{"block": d.block, **{k: c[k] for k in ("member", "iteration", "replaced", "config_id", "parent",
                                                      "parent_metric", "replaced_metric", "changes")}}
              for d in decisions for c in d.copies]
    return {"members": len(decisions[0].members), "iterations": (run.adaptive or {}).get("iterations"),
            "fields": mutated, "segments": segments, "copies": copies}


def progress(plan: Plan, records: Sequence[HopRecord], failures: Mapping[str, HopRecord],
             board: Sequence[Mapping[str, Any]], metric: str) -> dict[str, Any]:
    best = next((row for row in board if _finite(row.get(metric))), None)
    return {"hops_done": len(records), "hops_total": plan.model_hops_total, "failed": len(failures),
            "iteration": max((r.iteration for r in records), default=-1) + 1, "iterations": plan.iterations,
            "best": None if best is None else {"config_id": best["config_id"], metric: best[metric]}}


def curves(rows: Sequence[Mapping[str, Any]], board: Sequence[Mapping[str, Any]],
           failures: Mapping[str, HopRecord], decisions: Sequence[RungDecision], metric: str) -> dict[str, Any]:
    """Per configuration training and validation metrics per iteration, and where it stopped
    (pruned at a rung, failed or diverged) with the iteration of its last point."""
    base = metric[4:] if metric.startswith("val_") else metric
    charts = [{"name": "loss", "train": "train_loss", "validation": "val_loss"}]
    if base != "loss":
        charts.append({"name": base, "train": f"train_{base}", "validation": metric})
    keys = {k for chart in charts for k in (chart["train"], chart["validation"])}
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r["config_id"], r["iteration"])):
        point = {"iteration": row["iteration"], "complete": row["complete"]}
        point.update({k: row[k] for k in keys if _finite(row.get(k))})
        series[row["config_id"]].append(point)
    pruned = {e["config_id"]: e for d in decisions for e in d.pruned}
    out = {}
    for row in board:
        cid, stop = row["config_id"], None
        if row.get("status") == "pruned" and cid in pruned:
            stop = {"status": "pruned", "rung": pruned[cid]["rung"], "outcome": row["outcome"],
                    "iteration": pruned[cid]["iterations_done"] - 1}
        elif row.get("status") in ("failed", "diverged"):
            failure = failures.get(cid)
            stop = {"status": row["status"], "outcome": row["outcome"],
                    "iteration": failure.iteration if failure else None}
        out[cid] = {"points": series.get(cid, []), "status": row.get("status"), "stop": stop}
    return {"charts": charts, "configs": out}


def timeline(records: Sequence[HopRecord], shards: int, slots: int) -> dict[str, Any]:
    """Every hop as a bar on its shard (and slot lane), in seconds since the first hop started, and
    how busy each shard's pool was between the first hop's start and the last hop's save.

    A bar ends when the hop released its slot (:attr:`HopRecord.released_at`): its commit may go on
    on a writer thread while the slot trains the next hop, so a slot's bars never overlap."""
    hops = sorted((r for r in records if r.started_at is not None and r.saved_at is not None),
                  key=lambda r: (r.started_at, r.shard, r.config_id))
    if not hops:
        return {"shards": shards, "slots": slots, "span": 0.0, "hops": [], "busy": None, "busy_by_shard": []}
    t0 = min(r.started_at for r in hops)
    span = max(r.saved_at for r in hops) - t0
    lanes_free: dict[int, list[float]] = defaultdict(list)  # per shard: when each lane is free again
    bars, busy, training = [], [0.0] * shards, [0.0] * shards
    for r in hops:
        end = r.released_at or r.saved_at
        free = lanes_free[r.shard]
        lane = next((i for i, until in enumerate(free) if until <= r.started_at), len(free))
        if lane == len(free):
            free.append(0.0)
        free[lane] = end
        bars.append({"config_id": r.config_id, "shard": r.shard, "lane": lane, "t": r.t, "iteration": r.iteration,
                     "start": r.started_at - t0, "end": end - t0,
                     "train_begin": _minus(r.train_begin, t0), "train_end": _minus(r.train_end, t0),
                     "host": r.host, "task_id": r.task_id})
        if 0 <= r.shard < shards:
            busy[r.shard] += end - r.started_at
            if r.train_begin is not None and r.train_end is not None:
                training[r.shard] += r.train_end - r.train_begin
    capacity = span * max(slots, 1)
    return {"shards": shards, "slots": slots, "lanes": max(len(v) for v in lanes_free.values()), "span": span,
            "hops": bars, "busy": _fraction(sum(busy), capacity * shards),
            "training": _fraction(sum(training), capacity * shards),
            "busy_by_shard": [_fraction(b, capacity) for b in busy],
            "visit_order": visit_order(hops)}


def downloads(layout: RunLayout) -> list[dict[str, Any]]:
    present = {uri.rsplit("/", 1)[-1] for uri in layout.store.glob(layout.report_uri("*"))}
    return [{"name": name, "media_type": media} for name, media in DOWNLOADS.items() if name in present]


def _summary_view(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if summary is None:
        return None
    keep = ("best", "model_hops", "configurations", "outcomes", "failed", "first_hop_started_at",
            "last_hop_saved_at", "report_written_at", "disk", "versions", "challenge")
    return {k: summary.get(k) for k in keep}


def _read_optional(layout: RunLayout, name: str) -> Any:
    uri = layout.report_uri(name)
    try:
        return layout.store.read_json(uri)
    except StoreError:
        return None  # not written yet


def _brackets(adaptive: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Hyperband's brackets, or the one bracket of successive halving (ASHA and PBT have none)."""
    if adaptive.get("method") in ("asha", "pbt"):
        return []
    return list(adaptive["brackets"]) if "brackets" in adaptive else [adaptive]



def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _minus(value: float | None, t0: float) -> float | None:
    return None if value is None else value - t0


def _fraction(part: float, whole: float) -> float | None:
    return None if whole <= 0 else part / whole
