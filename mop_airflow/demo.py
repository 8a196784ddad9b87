"""`mop-airflow demo`: MNIST-1D model selection on a real local Airflow, start to finish.

Generates the data offline, starts Airflow (SQLite + LocalExecutor, project-local home), creates
the shard pools, triggers the example DAG, shows progress (model hops done / total, current
iteration, best validation metric so far), prints the leaderboard and where the results are, and
stops everything it started.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

from mop_airflow.layout import RunLayout
from mop_airflow.records import HopRecord, Plan
from mop_airflow.store import Store

DEMO_DAG_ID = "mop_mnist1d"


def _progress(layout: RunLayout, started: float, state: str, metric: str, direction: str) -> str:
    try:
        plan = Plan.read(layout.store, layout.plan_uri)
    except Exception:  # noqa: BLE001 - the plan does not exist until the plan task ran
        return f"[{time.time() - started:5.0f}s] {state}: validating and sharding the data"
    records = [HopRecord.read(layout.store, u) for u in layout.store.glob(layout.hops_glob)]
    current = max((r.iteration for r in records), default=0) + 1
    values = [r.val_metrics[metric] for r in records if r.val_metrics and metric in r.val_metrics]
    best = (min if direction == "min" else max)(values) if values else None
    best_text = f"best {metric} {best:.4f}" if best is not None and math.isfinite(best) else "no validation yet"
    return (f"[{time.time() - started:5.0f}s] {state}: model hops {len(records)}/{plan.model_hops_total}, "
            f"iteration {min(current, plan.iterations)}/{plan.iterations}, {best_text}")


def print_leaderboard(store: Store, layout: RunLayout, out=print) -> dict:
    board = store.read_json(layout.report_uri("leaderboard.json"))
    metric = board["metric"]
    out(f"\nLeaderboard ({metric}, {'lower' if board['direction'] == 'min' else 'higher'} is better)")
    out(f"{'rank':>4}  {'config':<12} {metric:>12} {'val_loss':>9}  model / optimizer / lr / batch")
    for row in board["leaderboard"]:
        value = row[metric]
        out(f"{row['rank']:>4}  {row['config_id']:<12} {value if value is None else f'{value:.4f}':>12} "
            f"{row['val_loss'] if row['val_loss'] is None else format(row['val_loss'], '.4f'):>9}  "
            f"{row['model'].split(':')[-1]} / {row['optimizer']} / {row['learning_rate']:g} / {row['batch_size']}")
    return board


def sync_pools_for(af, dag_id: str) -> dict:
    """Create the DAG's shard pools with the documented CLI command; returns the DAG's params."""
    params = af.api("GET", f"/dags/{dag_id}/details")["params"]
    schedule = params["schedule"]["value"]
    sync = subprocess.run([sys.executable, "-m", "mop_airflow.cli", "pools", "sync",
                           "--shards", str(schedule["shards"]), "--slots", str(schedule["slots_per_shard"])],
                          env=af.env, capture_output=True, text=True)
    if sync.returncode != 0:
        raise RuntimeError(f"pools sync failed: {sync.stderr}")
    print(sync.stdout.strip())
    return params


def run_and_watch(af, dag_id: str, store: Store, *, timeout: float, started: float) -> tuple[str, str, dict]:
    """Sync pools, trigger ``dag_id`` and print progress until the run ends: (run_id, state, params)."""
    params = sync_pools_for(af, dag_id)
    run_id = af.trigger(dag_id)
    print(f"triggered {dag_id} run {run_id}; Airflow UI at {af.base_url} (logs in {af.home / 'logs'})")
    search = params["search"]["value"]
    layout = RunLayout(store, dag_id, run_id)
    last = [""]

    def tick(state: str) -> None:
        line = _progress(layout, started, state, search["metric"], search["direction"])
        if line.split("] ", 1)[1] != last[0]:
            print(line, flush=True)
            last[0] = line.split("] ", 1)[1]

    state = af.wait_for_run(dag_id, run_id, timeout=timeout, on_tick=tick)
    if state != "success":
        failed = [ti["task_id"] for ti in af.task_instances(dag_id, run_id) if ti["state"] == "failed"]
        print(f"run {run_id} {state}; failed tasks: {failed}; logs under {af.home / 'logs'}")
    return run_id, state, params


def run_demo(home: Path, dags_folder: Path, *, timeout: float = 900) -> int:
    from mop_airflow.examples.mnist1d_data import write_mnist1d  # noqa: PLC0415
    from mop_airflow.airflow.local import LocalAirflow  # noqa: PLC0415

    home = home.absolute()
    started = time.time()
    data = write_mnist1d(str(home / "data"))
    print(f"MNIST-1D ready: {data['train']} (validation: {data['test']})")
    store = Store("file://" + str(home / "store"))
    with LocalAirflow(home / "airflow", dags_folder, extra_env={"MOP_AIRFLOW_HOME": str(home)}) as af:
        af.wait_for_dag(DEMO_DAG_ID)
        run_id, state, params = run_and_watch(af, DEMO_DAG_ID, store, timeout=timeout, started=started)
    if state != "success":
        return 1
    layout = RunLayout(store, DEMO_DAG_ID, run_id)
    print_leaderboard(store, layout)
    summary = store.read_json(layout.report_uri("summary.json"))
    metric = params["search"]["value"]["metric"]
    print(f"\nbest model:       {summary['best_model_uri']}")
    print(f"learning curves:  {layout.report_uri('learning_curves.png')}")
    print(f"metrics table:    {layout.report_uri('metrics.parquet')} (and metrics.json)")
    print(f"hop timeline:     {layout.report_uri('hop_timeline.json')}")
    print(f"demo finished in {time.time() - started:.0f}s; Airflow stopped")
    print(json.dumps({"best": summary["best"]["config_id"], metric: summary["best"][metric]}))
    return 0
