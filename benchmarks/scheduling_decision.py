"""One scheduling decision over many waiting hop tasks: plain chains against mapped task groups.

Airflow's scheduler loads every task instance of a running DAG run and checks the dependencies of
each one still waiting, in every loop (``DagRun.task_instance_scheduling_decisions``). This times
exactly that call, in process, on a throw-away SQLite Airflow home, for the two ways a MOP DAG could
render its hop chains: ``CHAINS`` chains of ``HOPS`` plain tasks each (what mop_airflow rendered
until a block became one train task per shard slot), and the same as mapped task groups of one
instance (what it rendered before that). A mop_airflow DAG now has no hop tasks at all; this still
measures what a decision costs Airflow as the waiting and finished tasks grow. The tasks do
nothing: only the scheduler's cost is measured. After the first decision the stage task is marked
done without pushing an XCom, so the mapped groups stay unexpanded: every hop still waits, which
is the state most of a run's hop tasks are in.

``--done F`` also marks the first F of every plain chain's hops done before the timed decisions, as
in the middle of a run: Airflow's trigger-rule check scans every finished task instance of the run
for each waiting one, so a decision's cost grows with waiting x finished, not with the tasks alone.
``--profile`` prints where one decision of the plain chains spends its time.

    python benchmarks/scheduling_decision.py [--chains 16] [--hops 160] [--repeats 3] [--done 0.5] [--profile]

Prints the seconds of each decision (the first includes loading the DAG run), per shape.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

DAGS = '''
import datetime as dt, os
from airflow.sdk import DAG, task_group
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.python import PythonOperator

CHAINS, HOPS = int(os.environ["MOP_BENCH_CHAINS"]), int(os.environ["MOP_BENCH_HOPS"])
START = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)

with DAG("plain_chains", schedule=None, start_date=START):
    source = EmptyOperator(task_id="stage")
    for c in range(CHAINS):
        previous = source
        for t in range(HOPS):
            hop = EmptyOperator(task_id=f"chain_{c}.hop_{t}", pool=f"shard_{(c + t) % CHAINS}")
            previous >> hop
            previous = hop

with DAG("mapped_groups", schedule=None, start_date=START):
    source = PythonOperator(task_id="stage", python_callable=lambda: [1])
    for c in range(CHAINS):
        @task_group(group_id=f"class_{c}")
        def chain(bundle):
            previous = None
            for t in range(HOPS):
                hop = PythonOperator(task_id=f"hop_{t}", python_callable=lambda **_: 1, op_kwargs={"b": bundle})
                if previous is not None:
                    previous >> hop
                previous = hop

        chain.expand(bundle=source.output)
'''

MEASURE = '''
import cProfile, pstats, sys, time, datetime as dt
from airflow.utils import db
db.resetdb()
from airflow.dag_processing.bundles.manager import DagBundlesManager
from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
from airflow.models.dagrun import get_or_create_dagrun
from airflow.models.serialized_dag import SerializedDagModel
from airflow.utils.session import create_session
from airflow.utils.state import State
from airflow.utils.types import DagRunTriggeredByType

with create_session() as session:
    manager = DagBundlesManager()
    manager.sync_bundles_to_db(session=session)
    session.commit()
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        sync_bag_to_db(BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name),
                       bundle.name, bundle.version)
DONE, PROFILE = float(sys.argv[2]), sys.argv[3] == "1"
HOPS = int(__import__("os").environ["MOP_BENCH_HOPS"])
for dag_id in ("plain_chains", "mapped_groups"):
    with create_session() as session:
        dag = SerializedDagModel.get_dag(dag_id, session=session)
        now = dt.datetime.now(dt.timezone.utc)
        run = get_or_create_dagrun(dag=dag, start_date=now, logical_date=None, data_interval=None, run_after=now,
                                   run_id=f"bench_{dag_id}", session=session, conf={},
                                   triggered_by=DagRunTriggeredByType.TEST, triggering_user_name="bench")
        session.commit()
        run.dag = dag
        for i in range(int(sys.argv[1])):
            started = time.perf_counter()
            info = run.task_instance_scheduling_decisions(session=session)
            print(f"{dag_id}: decision {i + 1}: {time.perf_counter() - started:.3f} s over {len(info.tis)} task "
                  f"instances ({len(info.schedulable_tis)} schedulable)", flush=True)
            if i == 0:  # the stage task "finishes": the first hops become schedulable, the rest wait
                for ti in info.schedulable_tis:
                    ti.state = State.SUCCESS
                if dag_id == "plain_chains" and DONE:  # and, mid-run, the first hops of every chain are done
                    hops = int(DONE * HOPS)
                    for ti in info.tis:
                        if ti.task_id != "stage" and int(ti.task_id.rsplit("_", 1)[1]) < hops:
                            ti.state = State.SUCCESS
                session.flush()
        if PROFILE and dag_id == "plain_chains":
            profile = cProfile.Profile()
            profile.enable()
            run.task_instance_scheduling_decisions(session=session)
            profile.disable()
            print("profile:", flush=True)
            pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(12)
        session.rollback()
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=16, help="hop chains (one per offset class)")
    parser.add_argument("--hops", type=int, default=160, help="hops per chain (iterations x shards)")
    parser.add_argument("--repeats", type=int, default=3, help="decisions timed per shape")
    parser.add_argument("--done", type=float, default=0.0, help="fraction of every plain chain's hops marked done")
    parser.add_argument("--profile", action="store_true", help="profile one decision of the plain chains")
    args = parser.parse_args()
    if not 0 <= args.done < 1:
        parser.error(f"--done {args.done}: give a fraction of the hops, at least 0 and below 1 (e.g. 0.5)")
    load = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{args.chains} chains x {args.hops} hops = {args.chains * args.hops} hop tasks per run")
    home = Path(tempfile.mkdtemp(prefix="mop-decision-"))
    try:
        (home / "dags").mkdir()
        (home / "dags" / "chains.py").write_text(textwrap.dedent(DAGS))
        env = {**os.environ, "AIRFLOW_HOME": str(home / "airflow"),
               "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
               "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "MOP_BENCH_CHAINS": str(args.chains), "MOP_BENCH_HOPS": str(args.hops)}
        done = subprocess.run([sys.executable, "-c", MEASURE, str(args.repeats), str(args.done),
                               "1" if args.profile else "0"], env=env, capture_output=True,
                              text=True, timeout=1800)
        lines = done.stdout.splitlines()
        print("\n".join(line for line in lines if ": decision " in line))
        if args.profile and "profile:" in lines:
            print("\n".join(lines[lines.index("profile:"):]))
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
        return done.returncode
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
