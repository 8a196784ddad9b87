"""`mop-airflow` command: run your DAGs on a local Airflow, follow a run, fetch its report, list a
DAG's runs, score data with its model or export it, pools, example data, schedules, the demo.

The commands that read runs (and ``--group`` for a MopTaskGroup's selection) are
:mod:`mop_airflow.cli.runs`; this module holds the rest and the parser.

Exit codes, the same for every command: 0 done (a followed run succeeded); 1 the run or the work
failed; 2 bad usage or input; 3 Airflow or the store could not be reached, or the DAG or run does
not exist; 130 stopped with Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from mop_airflow.cli import kubernetes as kubernetes_commands
from mop_airflow.cli import runs as run_commands
from mop_airflow.cli.runs import DEFAULT_PORT, FAILED, INTERRUPTED, OK, UNAVAILABLE, USAGE
from mop_airflow.cli.runs import fail as _fail


def _cmd_pools_sync(args: argparse.Namespace) -> int:
    from mop_airflow.errors import PoolsMissingError  # noqa: PLC0415

    if args.dags_folder is None:
        if args.shards is None:
            return _fail("pools sync needs --shards N (and --slots S) or --dags-folder DIR", USAGE)
        from mop_airflow.hooks.pools import sync_pools  # noqa: PLC0415 - needs a configured Airflow

        try:
            names = sync_pools(args.shards, args.slots)
        except PoolsMissingError as exc:  # a metadata database never migrated
            return _fail(str(exc), UNAVAILABLE)
        print(f"pools ready ({args.slots} slot(s) each): {', '.join(names)}")
        return OK
    if not Path(args.dags_folder).is_dir():
        return _fail(f"--dags-folder {args.dags_folder}: no such folder", USAGE)
    from mop_airflow.hooks.pools import dag_folder_pools, sync_pool_slots  # noqa: PLC0415

    with _quiet_airflow_import():  # parsing the folder logs a line per file at INFO; the answer is the pools
        pools, errors = dag_folder_pools(args.dags_folder)
    try:
        sync_pool_slots(pools, command=f"mop-airflow pools sync --dags-folder {args.dags_folder}")
    except PoolsMissingError as exc:
        return _fail(str(exc), UNAVAILABLE)
    print("pools ready: " + (", ".join(f"{name} ({slots} slot(s))" for name, slots in sorted(pools.items()))
                             or f"none needed (no mop_airflow DAG in {args.dags_folder})"))
    for path, error in sorted(errors.items()):
        print(f"DAG file {path} failed to import:\n{error}", file=sys.stderr)
    return FAILED if errors else OK


@contextlib.contextmanager
def _quiet_airflow_import():
    """Airflow reads its log level when first imported: WARNING for that import, the environment kept
    as it was (in-process callers such as tests must not inherit it)."""
    key = "AIRFLOW__LOGGING__LOGGING_LEVEL"
    previous = os.environ.get(key)
    if "airflow" not in sys.modules:
        os.environ[key] = "WARNING"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous



def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether Airflow's api-server could listen on ``host``:``port``. It binds with SO_REUSEADDR (uvicorn
    does), so the check does too: the connections of an Airflow just stopped wait in TIME_WAIT for a minute
    and must not keep `up` from starting again, while a socket that really listens still refuses."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _cmd_up(args: argparse.Namespace) -> int:
    from mop_airflow.airflow import local  # noqa: PLC0415
    from mop_airflow.cli import up  # noqa: PLC0415

    folder = Path(args.dags_folder).absolute()
    if not folder.is_dir():
        return _fail(f"--dags-folder {args.dags_folder}: no such folder", USAGE)
    home = Path(args.home).absolute()
    host = args.host.strip().strip("[]")
    try:
        up.is_loopback(host)
    except ValueError as exc:
        return _fail(str(exc), USAGE)
    bind = "127.0.0.1" if host in up.WILDCARDS else host
    if not _port_free(0, bind):
        return _fail(f"--host {args.host}: not an address of this machine. Fix: give one of its addresses, or 0.0.0.0 "
                     "for every interface", USAGE)
    if not _port_free(args.port, bind):
        return _fail(f"port {args.port} is in use on {args.host} (another Airflow?): pass --port with a free one",
                     UNAVAILABLE)
    served = up.access(host, args.port, home / "airflow")  # off the loopback address: the login on
    for line in up.example_data_lines(folder, home, make=not args.no_example_data):
        print(line)
    try:
        with local.LocalAirflow(home / "airflow", folder, port=args.port,
                                extra_env={"MOP_AIRFLOW_HOME": str(home), **served.env}) as af:
            sync = af.run_cli("mop-airflow", "pools", "sync", "--dags-folder", str(folder), check=False)
            print(sync.stdout.strip())
            if sync.stderr.strip():
                print(sync.stderr.strip()[-4000:], file=sys.stderr)
            (home / "airflow" / "api_url").write_text(af.base_url)
            print("")
            for line in up.login_lines(served):
                print(line)
            print(f"DAGs from {folder}; the store and logs under {home}")
            print("follow a run with: mop-airflow status DAG_ID; stop with Ctrl-C")
            while all(af.alive().values()):
                time.sleep(1)
            dead = [name for name, ok in af.alive().items() if not ok]
            return _fail(f"{', '.join(dead)} stopped; see {af.home / 'logs'}", FAILED)
    except KeyboardInterrupt:
        print("\nstopped Airflow")
        return OK
    finally:
        (home / "airflow" / "api_url").unlink(missing_ok=True)


def _cmd_example_data(args: argparse.Namespace) -> int:
    from mop_airflow.cli.up import make_example_data  # noqa: PLC0415

    for line in make_example_data(args.dir, num_samples=args.num_samples):
        print(line)
    return OK


def _cmd_plan(args: argparse.Namespace) -> int:
    from mop_airflow.errors import SpecError  # noqa: PLC0415
    from mop_airflow.search.hyperband import format_plan, hyperband_plan, successive_halving  # noqa: PLC0415

    if args.asha:
        return _plan_asha(args)
    try:
        if args.n is not None:
            plan = successive_halving(args.n, args.r, args.eta, args.rungs, shards=args.shards)
        else:
            plan = hyperband_plan(args.R, args.eta, shards=args.shards, rounding=args.rounding,
                                  skip_last=args.skip_last)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return USAGE
    print(format_plan(plan, seconds_per_hop=args.seconds_per_hop, slots_per_shard=args.slots))
    if args.seconds_per_hop is not None:
        from mop_airflow.planning.simulation import estimate_seconds  # noqa: PLC0415
        from mop_airflow.planning.task_plan import build_task_plan  # noqa: PLC0415

        task_plan = build_task_plan(args.shards, 0, plan)
        sim = estimate_seconds(task_plan, plan.total_configurations,
                               seconds_per_hop=args.seconds_per_hop, slots=args.slots, adaptive=plan,
                               task_seconds=args.task_seconds)
        blocks = sum(1 for spec in task_plan.tasks if spec.kind == "decide")
        print(f"simulated wall time: {sim.makespan:,.0f} s: the DAG's own task plan replayed with Airflow's pool "
              f"and priority rules, its {blocks} block(s) to the rung ends one after another and "
              f"{args.task_seconds:g} s of fixed cost per task included; shard slots busy {sim.busy_fraction:.0%}")
    return OK


def _plan_asha(args: argparse.Namespace) -> int:
    """ASHA's rungs, its budget and a replay on the shards' slots: its promotions depend on the metrics,
    so the budget is the synchronous halving one and the replay uses synthetic learning curves."""
    from mop_airflow.errors import SpecError  # noqa: PLC0415
    from mop_airflow.planning.blocks import block_capacity  # noqa: PLC0415
    from mop_airflow.planning.search_sim import simulate_search  # noqa: PLC0415
    from mop_airflow.search.asha import asha_plan, check_budget, next_jobs  # noqa: PLC0415

    options = {"n": args.n if args.n is not None else 27, "r": args.r, "R": args.R, "eta": args.eta}
    try:
        plan = asha_plan(options if args.budget is None else {**options, "budget": args.budget})
        check_budget(plan, args.shards, args.slots)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return USAGE
    p, slots = args.shards, args.slots
    print(f"ASHA n={plan.n}, r={plan.r}, R={plan.R}, eta={plan.eta} on {p} shard(s) x {slots} slot(s)")
    print("rung  iterations  configurations if each rung promotes floor(completed / eta)")
    count = plan.n
    for k, end in enumerate(plan.rungs):
        print(f"{k:>4}  {end:>10}  {count:>14}")
        count //= plan.eta
    if plan.budget is None:
        budget = plan.halving_iterations()
        print(f"budget: {budget} iterations ({budget * p} model hops) if every rung promotes exactly floor(completed / "
              "eta); ASHA may promote more when a later configuration overtakes one promoted earlier")
    else:
        budget = plan.budget
        print(f"budget: {budget} iterations: {plan.capacity(p * slots)} configurations at once (one per slot) for at "
              f"most {plan.deadline(p * slots)} blocks of one iteration; no leg begins that would end after the last")
    draw = [f"c{i:04d}" for i in range(plan.n)]

    def replay(plan: Any) -> Any:
        return simulate_search(lambda done, promoted, started, free, block: next_jobs(
                                   plan, done, promoted, started, draw, free, direction="min", block=block,
                                   slots=p * slots),
                               shards=p, slots=slots, capacity=block_capacity(p, slots, plan), block_hops=p)

    sim = replay(plan)
    top = sum(1 for c in sim.completions if c.rung == plan.top)
    if plan.budget is None:
        bound = max(budget * p / (p * slots), plan.R * p)  # the slots' share, or one configuration's R iterations
        limit = (f"at least {bound:g} hop steps: the budget over the slots, or the {plan.R * p} hops of one "
                 "configuration trained to R, which no slot shares")
    else:
        limit = f"at most {plan.deadline(p * slots) * p} hop steps: the budget's blocks"
    print(f"replayed with synthetic learning curves, decided between blocks of one iteration: {sim.iterations:g} "
          f"iterations in {sim.steps} hop steps, slot use {sim.slot_use:.0%} ({limit}); {top} configuration(s) "
          f"reached R={plan.R}")
    hinted = dataclasses.replace(plan, budget=budget)  # what the same budget as a deadline would do
    if plan.budget is None and hinted.deadline(p * slots) >= plan.R:
        budgeted = replay(hinted)
        print(f"with \"budget\": {budget} in search.adaptive (a deadline of {hinted.deadline(p * slots)} blocks, one "
              f"configuration per slot): slot use {budgeted.slot_use:.0%}, {budgeted.iterations:g} iterations, "
              f"{sum(1 for c in budgeted.completions if c.rung == plan.top)} configuration(s) reached R={plan.R}")
    if args.seconds_per_hop is not None:
        blocks = -(-sim.steps // p)
        wall = sim.steps * args.seconds_per_hop + blocks * args.task_seconds
        print(f"estimated wall time: {wall:,.0f} s ({sim.steps} hop steps of {args.seconds_per_hop:g} s, and "
              f"{args.task_seconds:g} s of fixed cost for each of {blocks} block runs)")
    return OK


def _cmd_celery_config(args: argparse.Namespace) -> int:
    from mop_airflow.airflow.celery_config import CeleryDeployment, write_config  # noqa: PLC0415
    from mop_airflow.errors import SpecError  # noqa: PLC0415

    try:
        deployment = CeleryDeployment(args.broker, args.database, args.api_url,
                                      args.airflow_home or os.environ.get("AIRFLOW_HOME") or "~/airflow",
                                      args.mop_home or os.environ.get("MOP_AIRFLOW_HOME") or "~/mop_airflow",
                                      args.dags_folder)
    except SpecError as exc:
        return _fail(str(exc), USAGE)
    for line in write_config(deployment, args.out):
        print(line)
    print("load it before every airflow and mop-airflow command: set -a; . "
          f"{args.out or Path(deployment.airflow_home) / 'mop-celery.env'}; set +a")
    return OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from mop_airflow.cli.demo import run_demo  # noqa: PLC0415

    return run_demo(Path(args.home), Path(args.dags_folder), timeout=args.timeout)


def build_parser() -> argparse.ArgumentParser:
    home = os.environ.get("MOP_AIRFLOW_HOME") or ".mop_home"
    parser = argparse.ArgumentParser(prog="mop-airflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the DAGs of a folder on a local Airflow (SQLite, LocalExecutor) until Ctrl-C",
                        description="Start Airflow's api-server, scheduler and dag-processor with a project-local "
                                    "home, make the example DAGs' data where the home lacks it, create the shard "
                                    "pools every mop_airflow DAG of the folder needs, print the UI's address (and, "
                                    "off the loopback address, its login), and stop everything on Ctrl-C.")
    up.add_argument("--dags-folder", required=True, help="the folder of your DAG files")
    up.add_argument("--home", default=home, help=f"Airflow's home, the store and the logs (default {home})")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the UI and REST API port (default {DEFAULT_PORT})")
    up.add_argument("--host", default="127.0.0.1",
                    help="the address the UI and REST API listen on (default 127.0.0.1: this machine only, no login). "
                         "Any other than a loopback address, e.g. 0.0.0.0 (every interface) on a remote machine, "
                         "turns the login on: user admin, a generated password printed when it is made")
    up.add_argument("--no-example-data", action="store_true",
                    help="do not make the example DAGs' data where --home lacks it (say how to make it instead)")
    up.set_defaults(func=_cmd_up)

    def api_options(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("dag_id")
        cmd.add_argument("run_id", nargs="?", help="default: the DAG's latest run")
        connection_options(cmd)

    def connection_options(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--api-url", help="Airflow's address (default: $MOP_AIRFLOW_API_URL, else the one "
                                           f"`mop-airflow up` runs, else http://localhost:{DEFAULT_PORT})")
        cmd.add_argument("--username", default=os.environ.get("MOP_AIRFLOW_API_USER"),
                         help="an Airflow user who may read the DAG (default $MOP_AIRFLOW_API_USER; the password "
                              "comes from $MOP_AIRFLOW_API_PASSWORD)")
        cmd.add_argument("--store", help="read the runs from this store root (a path or a URI) alone, without "
                                         "asking Airflow (the store the DAG's spec names, seen from this computer)")
        cmd.add_argument("--group", metavar="ID",
                         help="the model selection of the DAG's MopTaskGroup ID (its runs, registry and Asset are "
                              "<dag_id>.<ID>); needed when the DAG holds its selections in task groups")
        cmd.add_argument("--home", default=home, help=argparse.SUPPRESS)

    status = sub.add_parser("status", help="follow a run: hops done, shards busy or idle, best so far, time left "
                                           "(or the task waiting for a worker, and since when)",
                            description="Follow a run through Airflow. With --once it prints one line and exits; "
                                        "then --store (or Airflow unreachable and the run in the default store) "
                                        "reads it from the store alone, where a run is finished (report written) "
                                        "or unfinished.")
    api_options(status)
    status.add_argument("--once", action="store_true", help="print the progress once and exit")
    status.add_argument("--interval", type=float, default=3.0, help="seconds between updates (default 3)")
    status.set_defaults(func=run_commands.cmd_status)

    report = sub.add_parser("report", help="print a run's leaderboard and write its report and plots to a folder")
    api_options(report)
    report.add_argument("--out", help=f"where to write (default {home}/reports/DAG_ID/RUN_ID)")
    report.set_defaults(func=run_commands.cmd_report)

    runs = sub.add_parser("runs", help="a DAG's runs, newest first, with their state, winner and metric",
                          description="Asks Airflow for the runs and their state, and the store for each run's "
                                      "winner. With --store (or Airflow unreachable and runs in the default store) "
                                      "the store alone: a run is finished (report written) or unfinished.")
    runs.add_argument("dag_id")
    connection_options(runs)
    runs.add_argument("--limit", type=int, default=20, help="at most this many runs (default 20)")
    runs.set_defaults(func=run_commands.cmd_runs)

    predict = sub.add_parser(
        "predict", help="score a Parquet/CSV source with a run's best model (or a configuration's last checkpoint)",
        description="Score rows with a run's model: the same feature columns, shapes and decoding as training "
                    "(the run's manifest says which), read and written in batches. With --store the run is "
                    "found in the store alone (no Airflow; without RUN_ID the DAG's latest reported run).")
    api_options(predict)
    predict.add_argument("--source", required=True, help="a Parquet or CSV file, folder, glob or s3:// prefix")
    predict.add_argument("--out", required=True, help="the Parquet file to write (a path or a URI)")
    predict.add_argument("--mode", choices=("response", "prob", "top_k"), default="response",
                         help="response: the class (or the value, for regression); prob: a column per class; "
                              "top_k: k rows per input row, with rank, class and prob (default response)")
    predict.add_argument("--k", type=int, default=3, help="classes per row for --mode top_k (default 3)")
    predict.add_argument("--config", help="score with this configuration's last checkpoint, not the best model")
    predict.add_argument("--champion", action="store_true",
                         help="score with the DAG's current champion (the run its registry names), not RUN_ID")
    predict.add_argument("--id", help="a source column to copy into the output beside row_id")
    predict.add_argument("--batch-rows", type=int, default=None, help="rows per batch (default: about 64 MB)")
    predict.set_defaults(func=run_commands.cmd_predict)

    export = sub.add_parser(
        "export-best", help="copy a run's best model out for serving, with a model card (and a SavedModel)",
        description="Write best_model.keras and model_card.json (configuration, metrics, data fingerprint, "
                    "versions) to a folder; --format saved_model adds a TensorFlow SavedModel.")
    api_options(export)
    export.add_argument("--out", required=True, help="the folder to write to (a path or a URI)")
    export.add_argument("--format", choices=("keras", "saved_model"), default="keras")
    export.add_argument("--champion", action="store_true",
                        help="export the DAG's current champion (the run its registry names), not RUN_ID")
    export.set_defaults(func=run_commands.cmd_export_best)

    study = sub.add_parser(
        "export-study", help="write a reported run as an Optuna study (for optuna-dashboard and Optuna's plots)",
        description="Write the search's configurations as the trials of an Optuna study in a SQLite file: their "
                    "searched values, final metric, per-iteration validation metric and outcome.")
    api_options(study)
    study.add_argument("--out", required=True, help="the SQLite file to write (it must not exist yet)")
    study.set_defaults(func=run_commands.cmd_export_study)

    champion = sub.add_parser(
        "champion", help="a DAG's champion registry: list it, or roll back to an earlier model",
        description="Every model a DAG published, newest last; the last is the champion that "
                    "`predict --champion` and the DAGs scheduled on its Asset use. The registry is found in "
                    "--store, else in the store the DAG's latest run recorded (asked of Airflow)."
    ).add_subparsers(dest="action", required=True)
    listing = champion.add_parser("list", help="print the registry's history, marking the current champion")
    listing.add_argument("dag_id")
    connection_options(listing)
    listing.set_defaults(func=run_commands.cmd_champion_list)
    again = champion.add_parser(
        "publish", help="make an earlier entry (or a reported run's winner) the champion again",
        description="Append a registry entry naming the chosen model (a rollback keeps the history), then emit "
                    "the champion Asset event through Airflow's REST API so DAGs scheduled on it run.")
    again.add_argument("dag_id")
    again.add_argument("which", metavar="VERSION_OR_RUN_ID",
                       help="a version number from `champion list`, or the id of a run whose report finished")
    again.add_argument("--no-event", action="store_true", help="only update the registry; tell no DAG")
    connection_options(again)
    again.set_defaults(func=run_commands.cmd_champion_publish)

    pools = sub.add_parser("pools", help="manage the per-shard Airflow pools").add_subparsers(dest="action", required=True)
    sync = pools.add_parser("sync", help="create or resize pools mop_shard_0..N-1 (run where `airflow` runs)")
    sync.add_argument("--shards", type=int, help="number of shards (or use --dags-folder)")
    sync.add_argument("--slots", type=int, default=1, help="models a shard trains at once: its GPUs (default 1)")
    sync.add_argument("--dags-folder", help="create the pools every mop_airflow DAG in this folder needs")
    sync.set_defaults(func=_cmd_pools_sync)

    celery = sub.add_parser("celery", help="configure a CeleryExecutor deployment").add_subparsers(
        dest="action", required=True)
    config = celery.add_parser(
        "config", help="write the environment file every Airflow process of a Celery deployment loads",
        description="Write $AIRFLOW_HOME/mop-celery.env (executor, metadata database, broker, result backend, "
                    "the API server's address, a shared JWT secret, the tasks' login, the settings that bound a "
                    "lost worker), the preload hook $AIRFLOW_HOME/config/airflow_local_settings.py and the "
                    "password of the Airflow user the tasks sign in as. Run it once; copy the files to every "
                    "machine. Running it again keeps the secret and the password.")
    config.add_argument("--broker", required=True, help="the Redis URL, e.g. redis://127.0.0.1:6379/0")
    config.add_argument("--database", required=True,
                        help="the metadata database, e.g. postgresql+psycopg2://postgres@127.0.0.1:5432/airflow")
    config.add_argument("--api-url", default="http://127.0.0.1:8080",
                        help="the API server's address as every worker reaches it (default http://127.0.0.1:8080)")
    config.add_argument("--airflow-home",
                        help="AIRFLOW_HOME on every machine (default $AIRFLOW_HOME, else ~/airflow)")
    config.add_argument("--mop-home",
                        help="MOP_AIRFLOW_HOME: example data, the default file store, the shard cache "
                             "(default $MOP_AIRFLOW_HOME, else ~/mop_airflow)")
    config.add_argument("--dags-folder", help="the DAG files (default $AIRFLOW_HOME/dags)")
    config.add_argument("--out", help="the environment file to write (default $AIRFLOW_HOME/mop-celery.env)")
    config.set_defaults(func=_cmd_celery_config)

    data = sub.add_parser("example-data", help="generate MNIST-1D, digits (Parquet and PNG folders) and Friedman #1 "
                                                "(offline)")
    data.add_argument("--dir", default=os.path.join(home, "data"))
    data.add_argument("--num-samples", type=int, default=20000)
    data.set_defaults(func=_cmd_example_data)

    plan = sub.add_parser("plan", help="print a Hyperband, successive-halving or ASHA schedule before running it")
    plan.add_argument("--asha", action="store_true", help="ASHA with --n, --r, --R and --eta: its rungs, budget and "
                                                          "a replay on the shards' slots")
    plan.add_argument("--R", type=int, default=9, help="Hyperband: maximum iterations per configuration")
    plan.add_argument("--eta", type=int, default=3)
    plan.add_argument("--rounding", choices=("paper", "madlib"), default="paper")
    plan.add_argument("--skip-last", type=int, default=0)
    plan.add_argument("--n", type=int, default=None, help="successive halving: configurations in the bracket; "
                                                          "ASHA: configurations started in all (default 27)")
    plan.add_argument("--r", type=int, default=1, help="successive halving and ASHA: iterations of the first rung")
    plan.add_argument("--rungs", type=int, default=None)
    plan.add_argument("--budget", type=int, default=None, help="ASHA: iterations the whole search may train")
    plan.add_argument("--shards", type=int, default=4)
    plan.add_argument("--slots", type=int, default=1)
    plan.add_argument("--seconds-per-hop", type=float, default=None,
                      help="measured seconds per model hop, for the wall-time estimate (see benchmarks/)")
    plan.add_argument("--task-seconds", type=float, default=0.0,
                      help="Airflow's fixed cost per task (start-up, imports), added to every hop in the "
                           "simulated wall time; benchmarks/sim_vs_airflow.py measures it on a real Airflow")
    plan.set_defaults(func=_cmd_plan)

    demo = sub.add_parser("demo", help="run the MNIST-1D demo on a local Airflow and print the leaderboard")
    demo.add_argument("--home", default=home, help="project-local folder for Airflow, the store and the data")
    demo.add_argument("--dags-folder", default="dags")
    demo.add_argument("--timeout", type=float, default=900)
    demo.set_defaults(func=_cmd_demo)
    kubernetes_commands.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("shards", "slots", "k", "batch_rows", "limit"):
        value = getattr(args, name, None)
        if value is not None and value < 1 and args.command != "k8s":  # k8s names the value and the fix itself
            return _fail(f"--{name.replace('_', '-')} must be at least 1", USAGE)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
