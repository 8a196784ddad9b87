"""Where a hop's time goes: runs the demo-sized DAG on a real local Airflow and prints per-hop figures.

Per model hop (a turn of one configuration in a shard slot's warm train task):
  restore           model (re)build or reuse, checkpoint read and restore (started -> training)
  training          the passes over the shard (the model's traced train step, batch by batch)
  evaluate          validation at the end of an iteration (last hop only)
  serialize         the state copied out of the model (the commit then runs beside the next hop)
  fixed             everything of the hop but training and evaluation
Per train task instance (one shard slot, one block):
  queued->start     scheduler + executor latency (task instance queued_when -> start_date)
  start->first hop  the task process's start-up, imports, device, shard read
  waiting           the task's time in no hop: waiting for other slots' hops, the last commit
Also prints the fraction of the run the shard slots spent training, and how long each example DAG
file takes to parse.

    python benchmarks/hop_overhead.py [--no-preload] [--home DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mop_airflow.cli.demo import DEMO_DAG_ID, run_and_watch  # noqa: E402
from mop_airflow.examples.mnist1d_data import write_mnist1d  # noqa: E402
from mop_airflow.records.layout import RunLayout  # noqa: E402
from mop_airflow.records import Plan, RunRecord  # noqa: E402
from mop_airflow.airflow.local import LocalAirflow  # noqa: E402
from mop_airflow.results.runs import load_hop_records  # noqa: E402
from mop_airflow.store import Store  # noqa: E402


def ts(value: str | None) -> float | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def parse_times() -> dict[str, float]:
    """Seconds to import each example DAG file in a fresh interpreter (Airflow import excluded)."""
    code = ("import time, sys, importlib.util as u; import airflow.sdk; t = time.perf_counter(); "
            "s = u.spec_from_file_location('d', sys.argv[1]); m = u.module_from_spec(s); s.loader.exec_module(m); "
            "print(time.perf_counter() - t)")
    out = {}
    for path in sorted((REPO / "dags").glob("*.py")):
        run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
        out[path.name] = float(run.stdout.strip().splitlines()[-1])
    return out


def describe(name: str, values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return f"{name:<17} median {statistics.median(values):6.2f}s   p90 {p90:6.2f}s   max {values[-1]:6.2f}s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-preload", action="store_true", help="measure without preloading Keras in the scheduler")
    parser.add_argument("--home", default=None)
    parser.add_argument("--dag-id", default=DEMO_DAG_ID, help="an example DAG of dags/ (default: the demo's)")
    args = parser.parse_args()
    home = Path(args.home or tempfile.mkdtemp(prefix="mop-bench-")).absolute()
    write_mnist1d(str(home / "data"))
    store = Store("file://" + str(home / "store"))
    extra = {"MOP_AIRFLOW_HOME": str(home), "MOP_AIRFLOW_PRELOAD": "0" if args.no_preload else "1"}
    started = time.time()
    with LocalAirflow(home / "airflow", REPO / "dags", extra_env=extra) as af:
        af.wait_for_dag(args.dag_id)
        run_id, state, _ = run_and_watch(af, args.dag_id, timeout=3600, started=started)
        all_tis = af.task_instances(args.dag_id, run_id)
        # a hop task instance is (its full task id, its map index: a bundle); every hop record has both
        tis = {(ti["task_id"], ti["map_index"]): ti for ti in all_tis}
        run = af.api("GET", f"/dags/{args.dag_id}/dagRuns/{run_id}")
    if state != "success":
        print(f"run {state}: no figures")
        return 1
    layout = RunLayout(store, args.dag_id, run_id)
    plan = Plan.read(store, layout.plan_uri)
    run_record = RunRecord.read(store, layout.run_record_uri)
    p = plan.shards
    records = load_hop_records(layout)
    hops = [{"restore": r.train_begin - r.started_at, "training": r.timings["train"],
             "evaluate": r.timings["evaluate"], "serialize": r.timings.get("serialize", 0.0),
             "fixed": (r.released_at or r.saved_at) - r.started_at - r.timings["train"] - r.timings["evaluate"]}
            for r in records]
    tasks = []
    for task_id in sorted({r.task_id for r in records}):
        mine = sorted((r for r in records if r.task_id == task_id), key=lambda r: r.started_at)
        ti = tis[(task_id, -1)]
        queued, start, end = ts(ti["queued_when"]), ts(ti["start_date"]), ts(ti["end_date"])
        in_hops = sum((r.released_at or r.saved_at) - r.started_at for r in mine)
        tasks.append({"queued->start": start - queued, "start->first hop": mine[0].started_at - start,
                      "waiting": (end - mine[0].started_at) - in_hops, "hops": len(mine)})
    wall = ts(run["end_date"]) - ts(run["start_date"])
    training = sum(h["training"] for h in hops)
    slots = p * run_record.schedule.slots_per_shard
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}")
    print(f"DAG {args.dag_id}; preload: {'off' if args.no_preload else 'on'}; {len(run_record.configs)} configurations, "
          f"{p} shards: {len(records)} model hops in {len(tasks)} train task instances")
    print(f"DAG run wall time: {wall:.1f}s (trigger to success, demo start-up excluded)")
    for name in ("restore", "training", "evaluate", "serialize", "fixed"):
        print(describe(name, [h[name] for h in hops]))
    for name in ("queued->start", "start->first hop", "waiting"):
        print(describe(name, [t[name] for t in tasks]))
    print(f"median fixed cost per model hop: {statistics.median(h['fixed'] for h in hops):.2f}s (target <= 5 s)")
    pool_tasks = [ti for ti in all_tis if (ti["pool"] or "").startswith("mop_shard_") and ti["start_date"] and ti["end_date"]]
    busy = sum(ts(ti["end_date"]) - ts(ti["start_date"]) for ti in pool_tasks)
    print(f"shard pools held: {busy / (wall * slots):.1%} of {slots} pool slots x wall time")
    print(f"fraction of the run spent training: {training / (wall * slots):.1%} of {slots} pool slots x wall time")
    for name, seconds in parse_times().items():
        print(f"parse {name}: {seconds:.3f}s (after `import airflow.sdk`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
