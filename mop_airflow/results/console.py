"""A run's results on this computer: print the leaderboard, copy the report files and plots.

A finished run's report (written by its report task) is copied as it is. A run still going, or one
that failed before its report, gets a report of what its hop records hold so far, marked as such.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from mop_airflow.records.layout import RunLayout, read_run
from mop_airflow.records import Plan
from mop_airflow.results.report import (REPORT_FILES, config_labels, hop_timeline, hop_timeline_png, learning_curves_png,
                                        metrics_table, varying_hparams)
from mop_airflow.results.runs import load_all_hops, load_rung_decisions
from mop_airflow.results.page import provisional_leaderboard


def print_leaderboard(board: dict[str, Any], out: Callable[[str], None] = print) -> None:
    metric = board["metric"]
    hparams = varying_hparams(board["leaderboard"])
    out(f"\nLeaderboard ({metric}, {'lower' if board['direction'] == 'min' else 'higher'} is better)"
        + ("; provisional: the run has not written its report" if board.get("provisional") else ""))
    out(f"{'rank':>4}  {'config':<12} {metric:>12} {'val_loss':>9}  {'outcome':<10} model / optimizer / lr / batch"
        + "".join(f" / {k}" for k in hparams))
    def number(value: Any, spec: str) -> str:  # not evaluated yet, or failed: a dash
        return "-" if value is None else format(value, spec)

    def value(v: Any) -> str:
        return number(v, "g") if isinstance(v, (int, float)) and not isinstance(v, bool) else "-" if v is None else str(v)

    for row in board["leaderboard"]:
        own = row.get("hparams") or {}
        out(f"{row['rank']:>4}  {row['config_id']:<12} {number(row[metric], '.4f'):>12} "
            f"{number(row['val_loss'], '.4f'):>9}  {row.get('status', '-'):<10} "
            f"{row['model'].split(':')[-1]} / {row['optimizer']} / {number(row['learning_rate'], 'g')} / "
            f"{row['batch_size']}" + "".join(f" / {value(own.get(k))}" for k in hparams))


def challenge_decision(layout: RunLayout) -> dict[str, Any] | None:
    """The run's champion decision (the summary's ``challenge``, else ``report/challenge.json``), or
    None when the report took none (publishing came later, or the report is not written yet)."""
    store = layout.store
    summary_uri = layout.report_uri("summary.json")
    if store.exists(summary_uri):
        decision = store.read_json(summary_uri).get("challenge")
        if decision is not None:
            return decision
    challenge_uri = layout.report_uri("challenge.json")
    return store.read_json(challenge_uri) if store.exists(challenge_uri) else None


def print_challenge(decision: dict[str, Any] | None, out: Callable[[str], None] = print) -> None:
    """One line: whether the run's winner was published as the DAG's champion, and why."""
    if not decision:
        return
    out(f"\nChampion: {'published' if decision.get('publish') else 'not published'}: "
        f"{decision.get('reason', 'no reason recorded')}")


def fetch_report(layout: RunLayout, out_dir: Path) -> tuple[dict[str, Any], list[Path]]:
    """Write the run's report files into ``out_dir``; returns (leaderboard, files written)."""
    store = layout.store
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if store.exists(layout.report_uri("leaderboard.json")):
        for name in REPORT_FILES:
            uri = layout.report_uri(name)
            if name == "best_model.keras" or not store.exists(uri):
                continue  # the model is large and has its own command; older reports lack newer files
            (out_dir / name).write_bytes(store.read_bytes(uri))
            written.append(out_dir / name)
        return json.loads((out_dir / "leaderboard.json").read_text()), written
    run = read_run(layout)
    plan = Plan.read(store, layout.plan_uri)
    records, failures = load_all_hops(layout)
    rows = metrics_table(plan.shards, run.configs, records)
    decisions = load_rung_decisions(layout, plan, run) if plan.adaptive else []
    board = {**provisional_leaderboard(run, plan, rows, records, failures, decisions), "provisional": True}
    timeline = hop_timeline(records)
    files = {"leaderboard.json": json.dumps(board, indent=1).encode(),
             "metrics.json": json.dumps(rows, indent=1).encode(),
             "hop_timeline.json": json.dumps(timeline, indent=1).encode(),
             "learning_curves.png": learning_curves_png(rows, run.metric,
                                                        config_labels(run.configs)),
             "hop_timeline.png": hop_timeline_png(timeline, plan.shards)}
    for name, data in files.items():
        (out_dir / name).write_bytes(data)
        written.append(out_dir / name)
    return board, written
