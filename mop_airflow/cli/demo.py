"""`mop-airflow demo`: MNIST-1D model selection on a real local Airflow, start to finish.

Generates the data offline, starts Airflow (SQLite + LocalExecutor, in the project home), creates
the shard pools, triggers the example DAG, shows progress (model hops done / total, current
iteration, best validation metric so far), prints the leaderboard and where the results are, and
stops everything it started.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mop_airflow.records import RunRecord

DEMO_DAG_ID = "mop_mnist1d"


def sync_pools_for(af) -> None:
    """Create the shard pools of every DAG in the folder with the documented CLI command."""
    sync = af.run_cli("mop-airflow", "pools", "sync", "--dags-folder", str(af.dags_folder), check=False)
    if sync.returncode != 0:
        raise RuntimeError(f"pools sync failed: {sync.stderr}")
    print(sync.stdout.strip())


def run_and_watch(af, dag_id: str, *, timeout: float, started: float) -> tuple[str, str, RunRecord]:
    """Sync pools, trigger ``dag_id`` and print progress until the run ends: (run_id, state, run record)."""
    from mop_airflow.monitor.watch import watch  # noqa: PLC0415

    sync_pools_for(af)
    run_id = af.trigger(dag_id)
    print(f"triggered {dag_id} run {run_id}; Airflow UI at {af.base_url} (logs in {af.home / 'logs'})")
    ref = watch(af.rest, dag_id, run_id, live=False, timeout=timeout,
                on_line=lambda line: print(f"[{time.time() - started:5.0f}s] {line}", flush=True))
    if ref.state != "success":
        failed = [ti["task_id"] for ti in af.task_instances(dag_id, run_id) if ti["state"] == "failed"]
        print(f"run {run_id} {ref.state}; failed tasks: {failed}; logs under {af.home / 'logs'}")
    return run_id, ref.state, ref.record


def add_commands(sub: argparse._SubParsersAction, home: str) -> None:
    demo = sub.add_parser("demo", help="run the MNIST-1D demo on a local Airflow and print the leaderboard",
                          description="Make the MNIST-1D data, start a local Airflow (SQLite, LocalExecutor) on "
                                      "--dags-folder, trigger the mop_mnist1d DAG, show its progress, print the "
                                      "leaderboard and where the report is, and stop Airflow.")
    demo.add_argument("--home", default=home, help="the project home: Airflow, the store and the data "
                                                   "(default $MOP_HOME, else ~/mop_airflow: %(default)s)")
    demo.add_argument("--dags-folder", default="dags",
                      help="the folder holding the demo's DAG file, mop_mnist1d (default: the checkout's %(default)s)")
    demo.add_argument("--timeout", type=float, default=900,
                      help="seconds to wait for the run to end before giving up (default %(default)s)")
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(Path(args.home), Path(args.dags_folder), timeout=args.timeout)


def run_demo(home: Path, dags_folder: Path, *, timeout: float = 900) -> int:
    from mop_airflow.records.layout import RunLayout  # noqa: PLC0415
    from mop_airflow.results.console import print_challenge, print_leaderboard  # noqa: PLC0415
    from mop_airflow.store import Store  # noqa: PLC0415
    from mop_airflow.examples.mnist1d_data import write_mnist1d  # noqa: PLC0415
    from mop_airflow.deployment.local import LocalAirflow  # noqa: PLC0415

    home = home.absolute()
    started = time.time()
    data = write_mnist1d(str(home / "data"))
    print(f"MNIST-1D ready: {data['train']} (validation: {data['test']})")
    store = Store("file://" + str(home / "store"))
    # The example files do not change during the demo: re-parsing all six every 30 s (Airflow's
    # default) took ~20 s of CPU per cycle on 2 cores, taken from the hops.
    quiet_parsing = {"AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600"}
    with LocalAirflow(home / "airflow", dags_folder, extra_env={"MOP_HOME": str(home), **quiet_parsing}) as af:
        af.wait_for_dag(DEMO_DAG_ID)
        run_id, state, record = run_and_watch(af, DEMO_DAG_ID, timeout=timeout, started=started)
    if state != "success":
        return 1
    layout = RunLayout(store, DEMO_DAG_ID, run_id)
    print_leaderboard(store.read_json(layout.report_uri("leaderboard.json")))
    summary = store.read_json(layout.report_uri("summary.json"))
    print_challenge(summary.get("challenge"))
    metric = record.metric
    print(f"\nbest model:       {summary['best_model_uri']}")
    print(f"learning curves:  {layout.report_uri('learning_curves.png')}")
    print(f"metrics table:    {layout.report_uri('metrics.parquet')} (and metrics.json)")
    print(f"hop timeline:     {layout.report_uri('hop_timeline.png')} (and hop_timeline.json)")
    print(f"demo finished in {time.time() - started:.0f}s; Airflow stopped")
    print(json.dumps({"best": summary["best"]["config_id"], metric: summary["best"][metric]}))
    return 0
