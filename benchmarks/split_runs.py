"""What splitting a search over DAG runs costs: the same search in one run and in one run per iteration.

``schedule.iterations_per_run`` keeps each DAG run's task instances small so Airflow's scheduling
loop stays short (benchmarks/dag_scale.py measures the loop). The price is a hand-over between
blocks: the run of a block ends (next_run, a skipped report and publish), the next run starts and
its control tasks return at once before its first hops. This script runs, on the embedded Airflow,
the scikit-learn digits example's grid (4 configurations, 4 shards, ``--iterations`` iterations)
as one DAG run and as one run per iteration, one after the other, and prints:

- the search's wall time, from its first run's start to its last run's end;
- the train task instances per run (a block is one train task per shard slot, ``train_shard_<s>``,
  each training every hop of the block on its slot) and the model hops each run trained (its hop
  records, in the search's first run's folder);
- per block hand-over, two ways: from the last train task of a block ending to the first train task
  of the next starting (Airflow's part), and from the block's last hop committed (``saved_at``) to
  the next block's first hop taken (``started_at``: the task's start and the process's setup too);
- whether the two leaderboards are the same (they must be).

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
    from mop_airflow.records import HopRecord  # noqa: PLC0415
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
    # A block is one train task per shard slot (train_shard_<s>, train_shard_<s>_slot_<k>), whatever its hops.
    trains = [[ti for ti in af.task_instances(dag_id, r)
               if ti["task_id"].rsplit(".", 1)[-1].startswith("train_shard_") and ti["state"] == "success"]
              for r in runs]
    spans = [(min(when(ti["start_date"]) for ti in tis), max(when(ti["end_date"]) for ti in tis)) for tis in trains]
    gaps = [nxt[0] - done[1] for done, nxt in zip(spans, spans[1:])]
    # Every run's hop records are in the search's first run's folder: a hop belongs to the run whose
    # train tasks were running when it was taken.
    layout = RunLayout(store, dag_id, first)
    records = [HopRecord.read(store, uri) for uri in store.glob(layout.hops_glob)]
    hops: list[list[HopRecord]] = [[] for _ in runs]
    for record in records:
        k = next(k for k, (a, b) in enumerate(spans) if a - 1 <= record.started_at <= b + 1)
        hops[k].append(record)
    hop_gaps = [min(h.started_at for h in nxt) - max(h.saved_at for h in done) for done, nxt in zip(hops, hops[1:])]
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    return {"runs": len(runs), "wall": when(info[-1]["end_date"]) - when(info[0]["start_date"]),
            "train_tis": [len(t) for t in trains], "hops": [len(h) for h in hops], "gaps": gaps,
            "hop_gaps": hop_gaps, "board": [(r["config_id"], round(r["val_accuracy"], 6)) for r in board]}


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
                    print(f"{dag_id}: {got['runs']} run(s), {got['wall']:.1f} s, train task instances per run "
                          f"{got['train_tis']}, model hops per run {got['hops']}, hand-overs train task to train "
                          f"task {[round(g, 1) for g in got['gaps']]} s, hop committed to hop taken "
                          f"{[round(g, 1) for g in got['hop_gaps']]} s", flush=True)
        whole, split = results[WHOLE], results[SPLIT]
        same = all(w["board"] == s["board"] for w, s in zip(whole, split))
        w_wall = statistics.median(r["wall"] for r in whole)
        s_wall = statistics.median(r["wall"] for r in split)
        gaps = [g for r in split for g in r["gaps"]]
        hop_gaps = [g for r in split for g in r["hop_gaps"]]
        print(f"\n{args.iterations} iterations of 4 configurations on 4 shards: one run {w_wall:.1f} s, one run per "
              f"iteration {s_wall:.1f} s (+{s_wall - w_wall:.1f} s, {(s_wall - w_wall) / max(len(gaps), 1):.1f} s per "
              f"hand-over); hand-over, median: from a block's last train task ending to the next block's first "
              f"starting {statistics.median(gaps):.1f} s, from its last hop committed to the next block's first hop "
              f"taken {statistics.median(hop_gaps):.1f} s; leaderboards {'identical' if same else 'DIFFER'}")
        print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        return 0 if same else 1
    finally:
        if args.keep:
            print(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
