"""The deployment commands: `mop-airflow pools sync` (the shard pools a DAG folder needs) and
`mop-airflow celery config` (the environment file of a CeleryExecutor deployment)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from mop_airflow.cli.runs import FAILED, OK, UNAVAILABLE, USAGE, fail
from mop_airflow.config.environment import DEFAULT_HOME, env


def add_commands(sub: argparse._SubParsersAction) -> None:
    pools = sub.add_parser("pools", help="manage the per-shard Airflow pools",
                           description="The Airflow pools mop_shard_0..N-1 bound how many models train on each "
                                       "shard at once; the shard tasks wait in them.").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    sync = pools.add_parser("sync", help="create or resize pools mop_shard_0..N-1 (run where `airflow` runs)",
                            description="Create or resize the shard pools in Airflow's metadata database: N pools "
                                        "of --slots slots, or every pool the mop_airflow DAGs of --dags-folder need "
                                        "(their files are imported). Run it where the `airflow` command runs.")
    sync.add_argument("--shards", type=int, help="number of shards (or use --dags-folder)")
    sync.add_argument("--slots", type=int, default=1, help="models a shard trains at once: its GPUs (default 1)")
    sync.add_argument("--dags-folder", help="create the pools every mop_airflow DAG in this folder needs")
    sync.set_defaults(func=cmd_pools_sync)

    celery = sub.add_parser("celery", help="configure a CeleryExecutor deployment",
                            description="Configure a CeleryExecutor deployment (docs/how-to/celery.md).")
    celery = celery.add_subparsers(dest="action", required=True, metavar="ACTION")
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
                        help="MOP_HOME on every machine: example data, the default file store, the shard cache "
                             f"(default $MOP_HOME, else {DEFAULT_HOME})")
    config.add_argument("--dags-folder", help="the DAG files (default $AIRFLOW_HOME/dags)")
    config.add_argument("--out", help="the environment file to write (default $AIRFLOW_HOME/mop-celery.env)")
    config.set_defaults(func=cmd_celery_config)


def cmd_pools_sync(args: argparse.Namespace) -> int:
    from mop_airflow.errors import PoolsMissingError  # noqa: PLC0415

    if args.dags_folder is None:
        if args.shards is None:
            return fail("pools sync needs --shards N (and --slots S) or --dags-folder DIR", USAGE)
        from mop_airflow.hooks.pools import sync_pools  # noqa: PLC0415 - needs a configured Airflow

        try:
            names = sync_pools(args.shards, args.slots)
        except PoolsMissingError as exc:  # a metadata database never migrated
            return fail(str(exc), UNAVAILABLE)
        print(f"pools ready ({args.slots} slot(s) each): {', '.join(names)}")
        return OK
    if not Path(args.dags_folder).is_dir():
        return fail(f"--dags-folder {args.dags_folder}: no such folder", USAGE)
    from mop_airflow.hooks.pools import dag_folder_pools, sync_pool_slots  # noqa: PLC0415

    with quiet_airflow_import():  # parsing the folder logs a line per file at INFO; the answer is the pools
        pools, errors = dag_folder_pools(args.dags_folder)
    try:
        sync_pool_slots(pools, command=f"mop-airflow pools sync --dags-folder {args.dags_folder}")
    except PoolsMissingError as exc:
        return fail(str(exc), UNAVAILABLE)
    print("pools ready: " + (", ".join(f"{name} ({slots} slot(s))" for name, slots in sorted(pools.items()))
                             or f"none needed (no mop_airflow DAG in {args.dags_folder})"))
    for path, error in sorted(errors.items()):
        print(f"DAG file {path} failed to import:\n{error}", file=sys.stderr)
    return FAILED if errors else OK


@contextlib.contextmanager
def quiet_airflow_import():
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


def cmd_celery_config(args: argparse.Namespace) -> int:
    from mop_airflow.deployment.celery_config import CeleryDeployment, write_config  # noqa: PLC0415
    from mop_airflow.errors import SpecError  # noqa: PLC0415

    try:
        deployment = CeleryDeployment(args.broker, args.database, args.api_url,
                                      args.airflow_home or os.environ.get("AIRFLOW_HOME") or "~/airflow",
                                      args.mop_home or env("MOP_HOME") or DEFAULT_HOME,
                                      args.dags_folder)
    except SpecError as exc:
        return fail(str(exc), USAGE)
    for line in write_config(deployment, args.out):
        print(line)
    print("load it before every airflow and mop-airflow command: set -a; . "
          f"{args.out or Path(deployment.airflow_home) / 'mop-celery.env'}; set +a")
    return OK
