"""Write a finished run's report from its hop records: metrics table, leaderboard, learning curves, best model.

Training metrics of an iteration are the step-weighted mean over that configuration's hops;
validation metrics come from the evaluation at the end of the iteration. The leaderboard ranks on
the chosen validation metric in its direction (loss: lower is better; accuracy: higher), ties
broken by configuration id so the ranking is deterministic.
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter, defaultdict
from typing import Any, Collection, Mapping, Sequence

from mop_airflow.errors import TrainingError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import BlockDecision, HopRecord, Manifest, Plan, RunRecord, RungDecision, StageRecord
from mop_airflow.search.promotion import rank_rung
from mop_airflow.training.best_model import versions
from mop_airflow.results.runs import load_all_hops, load_block_decisions, load_rung_decisions, visit_order

REPORT_FILES = ("leaderboard.json", "metrics.parquet", "metrics.json", "learning_curves.png",
                "hop_timeline.json", "hop_timeline.png", "best_model.keras", "summary.json")


def write_report(layout: RunLayout, run: RunRecord, *, cache_dir: str) -> dict[str, Any]:
    """Write every report file of a finished run to ``<run>/report/`` and return the summary."""
    import datetime as dt  # noqa: PLC0415

    store = layout.store
    plan = Plan.read(store, layout.plan_uri)
    records, failures = load_all_hops(layout)
    rows = metrics_table(plan.shards, run.configs, records)
    metric, direction = run.metric, run.direction
    board = leaderboard(rows, run.configs, metric=metric, direction=direction, failed=failures)
    blocks = plan.decided_between_blocks
    decisions = load_rung_decisions(layout, plan, run) if plan.brackets else []  # Hyperband's rungs, ranked
    mark_outcomes(board, failures, decisions)
    for row in board:  # which configurations started from an earlier run's weights, and whose
        source = run.warm_start.get(row["config_id"])
        row["warm_start"] = None if source is None else f"{source['run_id']}/{source['config_id']}"
    best = board[0]
    if best["status"] in ("failed", "diverged") or not isinstance(best[metric], (int, float)):
        raise TrainingError(f"no configuration of run {run.run_id} finished with a {metric}: "
                            + "; ".join(f"{row['config_id']} {row['outcome']}" for row in board[:10])
                            + ". Fix: the builders or hyperparameters named, then trigger a new run")
    extra = (adaptive_outcome(plan, decisions, board, metric) if plan.brackets else
             block_outcome(load_block_decisions(layout), plan, board, metric, direction) if blocks else {})
    store.write_json(layout.report_uri("leaderboard.json"),
                     {"metric": metric, "direction": direction, "leaderboard": board, **extra,
                      "importance": hyperparameter_importance(run, board, rows)})
    store.write_bytes(layout.report_uri("metrics.parquet"), rows_to_parquet(rows))
    store.write_json(layout.report_uri("metrics.json"), rows)
    store.write_bytes(layout.report_uri("learning_curves.png"), learning_curves_png(
        rows, metric, config_labels(run.configs)))
    timeline = hop_timeline(records)
    store.write_json(layout.report_uri("hop_timeline.json"), timeline)
    store.write_bytes(layout.report_uri("hop_timeline.png"), hop_timeline_png(timeline, plan.shards))
    last_t = max(r.t for r in records if r.config_id == best["config_id"])

    from mop_airflow.training.best_model import export_best  # noqa: PLC0415 - Keras loads here

    manifest = Manifest.read(store, layout.manifest_pointer_uri)
    best_uri = export_best(layout, run, manifest, best["config_id"], last_t, cache_dir=cache_dir)

    def iso(timestamp: float | None) -> str | None:
        return None if timestamp is None else dt.datetime.fromtimestamp(timestamp, dt.timezone.utc).isoformat()

    summary = {
        "dag_id": run.dag_id, "run_id": run.run_id, "spec": run.spec,
        "disk": disk_use(layout, run, manifest, records),
        "configurations": len(run.configs), "model_hops": len(records),
        "outcomes": dict(Counter(row["status"] for row in board)),
        "failed": [{"config_id": f.config_id, "status": f.status, "t": f.t, "error": f.error}
                   for f in sorted(failures.values(), key=lambda f: f.config_id)],
        "first_hop_started_at": iso(min((r.started_at for r in records), default=None)),
        "last_hop_saved_at": iso(max((r.saved_at for r in records), default=None)),
        "report_written_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "best": best, "best_model_uri": best_uri, "versions": versions(),
        "best_checkpoint_sha256": next((r.checkpoint_sha256 for r in records
                                        if r.config_id == best["config_id"] and r.t == last_t), None),
        "warm_start": run.warm_start,
        "visit_order": visit_order(records),
        "files": {name: layout.report_uri(name) for name in REPORT_FILES},
    }
    store.write_json(layout.report_uri("summary.json"), summary)
    return summary


def hyperparameter_importance(run: RunRecord, board: Sequence[Mapping[str, Any]],
                              rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Which searched hyperparameters mattered (:func:`mop_airflow.results.study.importance`); a
    search the measure cannot take says why instead of failing its report."""
    from mop_airflow.results.study import importance  # noqa: PLC0415 - Optuna loads here

    try:
        return importance(run, board, rows)
    except (ValueError, RuntimeError) as exc:  # e.g. every finished configuration has the same metric
        return {"metric": run.metric, "error": f"{type(exc).__name__}: {exc}"}


def mark_outcomes(board: Sequence[dict[str, Any]], failures: Mapping[str, HopRecord],
                  decisions: Sequence[RungDecision]) -> None:
    """Per leaderboard row how the configuration ended: ``status`` (finished, pruned, failed or
    diverged) and ``outcome``, the same in words with the hop and the reason."""
    pruned = {e["config_id"]: e for d in decisions for e in d.pruned}
    for row in board:
        failure, entry = failures.get(row["config_id"]), pruned.get(row["config_id"])
        if failure is not None:
            row["status"] = failure.status
            row["outcome"] = (f"{failure.status} at hop {failure.t} (iteration {failure.iteration}, shard "
                              f"{failure.shard}): {failure.error}")
        elif entry is not None:
            row["status"], row["outcome"] = "pruned", f"pruned at rung {entry['rung']}: {entry['reason']}"
        else:
            row["status"], row["outcome"] = "finished", "finished"


def disk_use(layout: RunLayout, run: RunRecord, manifest: Manifest,
             records: Sequence[HopRecord]) -> dict[str, Any]:
    """What the run keeps in the store and what each worker's shard cache holds, with their bounds."""
    store = layout.store
    checkpoints = set(store.glob(f"{layout.run_uri}/checkpoints/*/*"))
    caches = {}
    for uri in store.glob(layout.stages_glob):
        stage = StageRecord.read(store, uri)
        caches[stage.host] = max(caches.get(stage.host, 0), stage.cache_bytes)
    return {
        "run_bytes": store.disk_usage(layout.run_uri),
        "checkpoints": len(checkpoints),
        "checkpoint_bytes": sum(r.checkpoint_bytes for r in records if r.checkpoint in checkpoints),
        "keep_checkpoints": run.store.keep_checkpoints,
        "shard_bytes": sum(e.bytes for e in manifest.shards) + manifest.validation.bytes,
        "worker_cache_bytes": caches,
        "cache_max_gb": run.store.cache_max_gb,
    }


def adaptive_outcome(plan: Plan, decisions: Sequence[RungDecision], board: Sequence[dict[str, Any]],
                     metric: str) -> dict[str, Any]:
    """Per configuration its bracket; the best configuration of each bracket; every pruning."""
    bracket_of = {cid: int(s) for s, members in plan.brackets.items() for cid in members}
    pruned = {e["config_id"]: e for d in decisions for e in d.pruned}
    for row in board:
        row["bracket"] = bracket_of.get(row["config_id"])
    best: dict[str, Any] = {}
    for row in board:  # already ranked, so the first row of a bracket is its best
        best.setdefault(str(row["bracket"]), {"config_id": row["config_id"], metric: row[metric]})
    return {"best_per_bracket": best, "pruned": sorted(pruned.values(), key=lambda e: (e["bracket"], e["rung"],
                                                                                        e["config_id"]))}


def block_outcome(decisions: Sequence[BlockDecision], plan: Plan, board: Sequence[dict[str, Any]], metric: str,
                  direction: str) -> dict[str, Any]:
    """A search decided between blocks (ASHA, or a large Hyperband): per configuration the rung where
    it stopped and why, and every decision in the order it was taken (the block, the job, the metric
    it was promoted on)."""
    if plan.adaptive.get("method") == "pbt":
        return pbt_outcome(decisions, plan, board)
    adaptive, eta = plan.adaptive, plan.adaptive["eta"]
    ladders = ({None: adaptive["rungs"]} if adaptive.get("method") == "asha" else
               {b["s"]: [int(r["r_i"]) for r in b["rungs"]] for b in adaptive.get("brackets", [adaptive])})
    seen = decisions[-1].completions if decisions else []
    per_rung: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    reached: dict[str, tuple] = {}
    for done in seen:
        key = (done.get("bracket"), done["rung"])
        per_rung[key].append(done)
        if done["status"] == "ok" and done["rung"] >= reached.get(done["config_id"], (None, -1))[1]:
            reached[done["config_id"]] = key
    promoted_from = defaultdict(set)
    for d in decisions:
        for job in d.jobs:
            if job["kind"] == "promote":
                promoted_from[(job.get("bracket"), job["rung"] - 1)].add(job["config_id"])
    for row in board:
        key = reached.get(row["config_id"])
        row["rung"], row["bracket"] = (key[1], key[0]) if key else (None, None)
        if row["status"] in ("failed", "diverged") or key is None:
            continue
        rungs = ladders[key[0]]
        where = f"rung {key[1]}" + (f" of bracket {key[0]}" if key[0] is not None else "")
        if key[1] == len(rungs) - 1:
            row["outcome"] = f"finished: reached the last rung{'' if key[0] is None else f' of bracket {key[0]}'}, " \
                             f"{rungs[key[1]]} iterations"
            continue
        ranked = [r["config_id"] for r in rank_rung(per_rung[key], direction=direction)]
        place = ranked.index(row["config_id"]) + 1
        row["status"] = "pruned"
        row["outcome"] = (f"stopped at {where} ({rungs[key[1]]} iteration(s)): ranked "
                          f"{place} of {len(ranked)} that completed it; "
                          f"{'ASHA promotes from' if key[0] is None else 'the rung keeps'} the best 1/{eta} "
                          f"({len(promoted_from[key])} promoted)")
        if adaptive.get("budget") is not None and decisions and place <= len(ranked) // eta:
            deadline = adaptive["budget"] // decisions[0].capacity
            row["outcome"] += (f"; it was among them, but its {rungs[key[1] + 1] - rungs[key[1]]} more iteration(s) "
                               f"to rung {key[1] + 1} would not have ended within the {deadline} blocks the budget "
                               f"of {adaptive['budget']} iterations lasts")
    return {"rungs": [{"bracket": s, "rung": k, "iterations": end, "completed": per_rung.get((s, k), []),
                       "promoted": sorted(promoted_from.get((s, k), ()))}
                      for s, ends in ladders.items() for k, end in enumerate(ends)],
            "decisions": [{**job, "block": d.block} for d in decisions for job in d.jobs]}


def pbt_outcome(decisions: Sequence[BlockDecision], plan: Plan, board: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Population-based training: per configuration its member, the iterations it trained, and how it
    ended (replaced by a copy of a better member, or trained to the end), and the lineage: every copy
    with who copied whom, when, on which metric values and with which new values."""
    copies = [{**c, "block": d.block} for d in decisions for c in d.copies]
    members = decisions[-1].members if decisions else []
    replaced = {c["replaced"]: c for c in copies}
    born = {c["config_id"]: c for c in copies}
    first_members = decisions[0].members if decisions else []
    iterations = plan.adaptive["iterations"]
    for row in board:
        cid = row["config_id"]
        origin = born.get(cid)
        start = origin["iteration"] if origin else 0
        member = origin["member"] if origin else (first_members.index(cid) if cid in first_members else None)
        row["member"], row["from_iteration"] = member, start
        row["parent"] = origin["parent"] if origin else None
        if row["status"] in ("failed", "diverged"):
            continue
        if cid in replaced:
            c = replaced[cid]
            row["status"] = "pruned"
            row["outcome"] = (f"replaced after iteration {c['iteration']}: ranked {c['rank']} of {c['of']}, so member "
                              f"{c['member']} went on as {c['config_id']}, a copy of {c['parent']}")
        elif cid in members:
            row["outcome"] = (f"finished: member {member}, iterations {start + 1} to {iterations}"
                              + (f", copied from {origin['parent']}" if origin else ""))
    return {"members": members, "lineage": copies}


def metrics_table(shards: int, configs: Sequence[Mapping[str, Any]],
                  records: Sequence[HopRecord]) -> list[dict[str, Any]]:
    """One row per configuration per iteration."""
    run_start = min((r.started_at for r in records), default=0.0)
    by_key: dict[tuple[str, int], list[HopRecord]] = defaultdict(list)
    for r in records:
        by_key[(r.config_id, r.iteration)].append(r)
    by_id = {c["config_id"]: c for c in configs}
    rows = []
    for (cid, iteration), hops in sorted(by_key.items()):
        hops = sorted(hops, key=lambda r: r.t)
        steps = sum(h.train_metrics["steps"] for h in hops)
        metric_names = [k for k in hops[0].train_metrics if k not in ("steps", "samples", "train_seconds")]
        row: dict[str, Any] = {"config_id": cid, "model": by_id[cid]["model"], "iteration": iteration,
                               "hops_done": len(hops), "complete": len(hops) == shards}
        for name in metric_names:
            row[f"train_{name}"] = sum(h.train_metrics[name] * h.train_metrics["steps"] for h in hops) / max(steps, 1)
        val = hops[-1].val_metrics if len(hops) == shards else None
        for name, value in (val or {}).items():
            row[name] = value
        row["steps"] = steps
        row["train_seconds"] = sum(h.timings["train"] for h in hops)
        row["elapsed_seconds"] = max(h.saved_at for h in hops) - run_start
        row["shard_order"] = ",".join(str(h.shard) for h in hops)
        rows.append(row)
    return rows


def leaderboard(rows: Sequence[Mapping[str, Any]], configs: Sequence[Mapping[str, Any]], *,
                metric: str, direction: str, failed: Collection[str] = ()) -> list[dict[str, Any]]:
    """Rank configurations on their last evaluated ``metric``; unevaluated or non-finite ones go
    after them, and ``failed`` configurations last (a metric from before the failure does not count)."""
    last: dict[str, Mapping[str, Any]] = {}
    for row in sorted(rows, key=lambda r: r["iteration"]):
        if isinstance(row.get(metric), (int, float)):
            last[row["config_id"]] = row
    sign = 1.0 if direction == "min" else -1.0

    def key(cfg: Mapping[str, Any]) -> tuple[int, float, str]:
        row = last.get(cfg["config_id"])
        value = row[metric] if row else math.nan
        ok = isinstance(value, (int, float)) and math.isfinite(value)
        group = 2 if cfg["config_id"] in failed else 0 if ok else 1
        return (group, sign * value if ok else 0.0, cfg["config_id"])

    board = []
    for rank, cfg in enumerate(sorted(configs, key=key), start=1):
        row = last.get(cfg["config_id"], {})
        board.append({
            "rank": rank, "config_id": cfg["config_id"], metric: row.get(metric),
            "val_loss": row.get("val_loss"), "iteration": row.get("iteration"),
            "model": cfg["model"], "optimizer": cfg["optimizer"],
            "learning_rate": cfg["optimizer_params"].get("learning_rate"),
            "batch_size": cfg["batch_size"], "epochs_per_hop": cfg["epochs_per_hop"], "hparams": cfg["hparams"],
        })
    return board


def learning_curves_png(rows: Sequence[Mapping[str, Any]], metric: str,
                        labels: Mapping[str, str] | None = None) -> bytes:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    series: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        series[row["config_id"]].append(row)
    for cid, points in sorted(series.items()):
        points = sorted(points, key=lambda r: r["iteration"])
        xs = [p["iteration"] + 1 for p in points]
        label = (labels or {}).get(cid, cid)
        line, = axes[0].plot(xs, [p.get("train_loss") for p in points], marker="o", label=label)
        vals = [(p["iteration"] + 1, p[metric]) for p in points if p.get(metric) is not None]
        if vals:
            axes[1].plot(*zip(*vals), marker="o", color=line.get_color(), label=label)
    axes[0].set(title="training loss", xlabel="iteration", ylabel="loss")
    axes[1].set(title=metric.replace("_", " "), xlabel="iteration", ylabel=metric)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def hop_timeline(records: Sequence[HopRecord]) -> list[dict[str, Any]]:
    """Which configuration trained on which shard when, in start order: the MOP Gantt chart's data."""
    timeline = [{"config_id": r.config_id, "t": r.t, "iteration": r.iteration, "hop": r.hop, "shard": r.shard,
                 "host": r.host, "queue": r.queue, "task_id": r.task_id, "started_at": r.started_at,
                 "train_begin": r.train_begin, "train_end": r.train_end, "saved_at": r.saved_at}
                for r in records if r.started_at is not None]
    return sorted(timeline, key=lambda r: r["started_at"])


def hop_timeline_png(timeline: Sequence[Mapping[str, Any]], shards: int) -> bytes:
    """The hop timeline as a Gantt chart: one row per shard, one bar per hop (task start to checkpoint
    saved; the darker part is training), gaps are idle shard time."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(13, 0.6 * shards + 1.6))
    origin = min((h["started_at"] for h in timeline), default=0.0)
    colours = plt.get_cmap("tab20")
    index = {cid: k for k, cid in enumerate(sorted({h["config_id"] for h in timeline}))}
    # One collection per shard and colour, not two artists per hop: a search of 25,296 hops drew for 81 s
    spans: dict[tuple[int, int], tuple[list, list]] = {}
    for h in timeline:
        whole, training = spans.setdefault((h["shard"], index[h["config_id"]] % 20), ([], []))
        end = h.get("saved_at") or h.get("train_end") or h["started_at"]
        whole.append((h["started_at"] - origin, end - h["started_at"]))
        if h.get("train_begin") and h.get("train_end"):
            training.append((h["train_begin"] - origin, h["train_end"] - h["train_begin"]))
    for (shard, colour), (whole, training) in sorted(spans.items()):
        ax.broken_barh(whole, (shard - 0.4, 0.8), facecolors=colours(colour), alpha=0.45, edgecolor="white",
                       linewidth=0.5)
        ax.broken_barh(training, (shard - 0.4, 0.8), facecolors=colours(colour))
    ax.set(xlabel="seconds since the first hop started", ylabel="shard", title="model hops per shard",
           yticks=range(shards), ylim=(shards - 0.5, -0.5))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def config_label(config: Mapping[str, Any]) -> str:
    """Short legend text: id, builder, optimizer, learning rate, batch size."""
    return (f"{config['config_id'][:4]} {config['model'].rsplit(':', 1)[-1]} {config['optimizer']} "
            f"lr={config['optimizer_params'].get('learning_rate', 0):g} bs={config['batch_size']}")


def varying_hparams(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The builder hyperparameters whose values differ between the configurations (or leaderboard rows):
    without them two configurations of one model, optimizer, learning rate and batch size (units 32 and
    128) read alike."""
    keys = sorted({k for row in rows for k in (row.get("hparams") or {})})
    return [k for k in keys
            if len({json.dumps((row.get("hparams") or {}).get(k), sort_keys=True, default=str) for row in rows}) > 1]


def config_labels(configs: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """{config_id: legend text}: :func:`config_label` and the hyperparameters that tell the configurations apart."""
    keys = varying_hparams(configs)
    return {c["config_id"]: config_label(c) + "".join(f" {k}={(c.get('hparams') or {}).get(k, '-')}" for k in keys)
            for c in configs}


def rows_to_parquet(rows: Sequence[Mapping[str, Any]]) -> bytes:
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    columns = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("config_id", "iteration"), k))
    table = pa.table({c: [r.get(c) for r in rows] for c in columns})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()
