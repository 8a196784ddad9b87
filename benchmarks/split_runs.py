"""What splitting a search over DAG runs costs: the same search in one run and in one run per iteration.

``schedule.iterations_per_run`` keeps each DAG run's task instances small so Airflow's scheduling
loop stays short (benchmarks/dag_scale.py measures the loop). The price is a hand-over between
blocks: the run of a block ends (next_run, a skipped report and publish), the next run starts and
its control tasks return at once before its first hops. This script runs, on the embedded Airflow,
the scikit-learn digits example's grid (4 configurations, 4 shards, ``--iterations`` iterations)
as one DAG run and as one run per iteration, one after the other, and prints:

- the search's wall time, from its first run's start to its last run's end;
- per block hand-over: from the last hop of a block ending to the first hop of the next starting;
- the hop task instances per run, and whether the two leaderboards are the same (they must be).

    python benchmarks/split_runs.py [--iterations 4] [--repeats 1] [--keep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mop_airflow.examples.sklearn_data import digits_data_spec, digits_search, write_digits  # noqa: E402

WHOLE, SPLIT = "mop_bench_one_run", "mop_bench_split"


def when(value: str) -> float:
    return dt.datetime.fromisoformat(value).timestamp()


def spec(data: str, store: str, iterations: int, per_run: int | str) -> dict:
    return {"data": digits_data_spec(data), "search": digits_search(),
            "schedule": {"shards": 4, "iterations": iterations, "seed": 3, "iterations_per_run": per_run},
            "store": {"root": store}}


def search_runs(af, store, dag_id: str, iterations: int) -> dict:
    """Trigger ``dag_id``, wait for every run of its search, and read what it took."""
    from mop_airflow.records.layout import RunLayout  # noqa: PLC0415

    first = af.trigger(dag_id)
    runs = [first]
    while True:
        state = af.wait_for_run(dag_id, runs[-1], timeout=1800)
        if state != "success":
            raise RuntimeError(f"run {runs[-1]} of {dag_id} ended {state}")
        chain_uri = RunLayout(store, dag_id, first).chain_uri
        chain = store.read_json(chain_uri)["runs"] if store.exists(chain_uri) else [first]
        if chain[-1] == runs[-1]:
            break
        runs.append(chain[chain.index(runs[-1]) + 1])
    info = [af.api("GET", f"/dags/{dag_id}/dagRuns/{r}") for r in runs]
    hops = [[ti for ti in af.task_instances(dag_id, r) if ".hop_" in ti["task_id"] and ti["state"] == "success"]
            for r in runs]
    gaps = [min(when(ti["start_date"]) for ti in nxt) - max(when(ti["end_date"]) for ti in done)
            for done, nxt in zip(hops, hops[1:])]
    board = store.read_json(RunLayout(store, dag_id, first).report_uri("leaderboard.json"))["leaderboard"]
    return {"runs": len(runs), "wall": when(info[-1]["end_date"]) - when(info[0]["start_date"]),
            "hop_tis": [len(h) for h in hops], "gaps": gaps,
            "board": [(r["config_id"], round(r["val_accuracy"], 6)) for r in board]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs, alternating which goes first")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)

    from mop_airflow.airflow.local import LocalAirflow  # noqa: PLC0415
    from mop_airflow.cli.demo import sync_pools_for  # noqa: PLC0415
    from mop_airflow.store import Store  # noqa: PLC0415

    home = Path(tempfile.mkdtemp(prefix="mop-split-"))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    try:
        write_digits(str(home / "data"))
        dags = home / "dags"
        dags.mkdir()
        store_root = f"file://{home / 'store'}"
        for dag_id, per_run in ((WHOLE, "auto"), (SPLIT, 1)):
            (dags / f"{dag_id}.py").write_text(
                "import json\nfrom mop_airflow import build_mop_dag\n"
                f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec(str(home / 'data'), store_root, args.iterations, per_run)))}),"
                f" dag_id={dag_id!r})\n")
        store = Store(store_root)
        results: dict[str, list[dict]] = {WHOLE: [], SPLIT: []}
        env = {"MOP_AIRFLOW_HOME": str(home / "mop"), "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600"}
        with LocalAirflow(home / "airflow", dags, extra_env=env, log=lambda *a: None) as af:
            for dag_id in (WHOLE, SPLIT):
                af.wait_for_dag(dag_id)
            sync_pools_for(af)
            for repeat in range(args.repeats):
                for dag_id in ((WHOLE, SPLIT) if repeat % 2 == 0 else (SPLIT, WHOLE)):
                    got = search_runs(af, store, dag_id, args.iterations)
                    results[dag_id].append(got)
                    print(f"{dag_id}: {got['runs']} run(s), {got['wall']:.1f} s, hop task instances per run "
                          f"{got['hop_tis']}, hand-overs {[round(g, 1) for g in got['gaps']]} s", flush=True)
        whole, split = results[WHOLE], results[SPLIT]
        same = all(w["board"] == s["board"] for w, s in zip(whole, split))
        w_wall = statistics.median(r["wall"] for r in whole)
        s_wall = statistics.median(r["wall"] for r in split)
        gaps = [g for r in split for g in r["gaps"]]
        print(f"\n{args.iterations} iterations of 4 configurations on 4 shards: one run {w_wall:.1f} s, one run per "
              f"iteration {s_wall:.1f} s (+{s_wall - w_wall:.1f} s, {(s_wall - w_wall) / max(len(gaps), 1):.1f} s per "
              f"hand-over); hand-over from a block's last hop to the next block's first, median "
              f"{statistics.median(gaps):.1f} s; leaderboards {'identical' if same else 'DIFFER'}")
        print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        return 0 if same else 1
    finally:
        if args.keep:
            print(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
