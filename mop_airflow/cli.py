"""`mop-airflow` command: pools, example data, schedules, the demo."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _cmd_pools_sync(args: argparse.Namespace) -> int:
    from mop_airflow.airflow.pools import sync_pools  # noqa: PLC0415 - needs a configured Airflow

    names = sync_pools(args.shards, args.slots)
    print(f"pools ready ({args.slots} slot(s) each): {', '.join(names)}")
    return 0


def _cmd_example_data(args: argparse.Namespace) -> int:
    from mop_airflow.examples.mnist1d_data import write_mnist1d  # noqa: PLC0415

    from mop_airflow.examples.sklearn_data import write_digits, write_friedman  # noqa: PLC0415

    out = write_mnist1d(args.dir, num_samples=args.num_samples)
    print(f"train: {out['train']}\nvalidation: {out['test']}")
    print(f"digits (8x8 images as a tensor column): {write_digits(args.dir)}")
    print(f"friedman (regression, CSV files): {write_friedman(args.dir)}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from mop_airflow.errors import SpecError  # noqa: PLC0415
    from mop_airflow.search.hyperband import format_plan, hyperband_plan, successive_halving  # noqa: PLC0415

    try:
        if args.n is not None:
            plan = successive_halving(args.n, args.r, args.eta, args.rungs, shards=args.shards,
                                      allow_partial_iterations=args.allow_partial_iterations)
        else:
            plan = hyperband_plan(args.R, args.eta, shards=args.shards, rounding=args.rounding,
                                  skip_last=args.skip_last, allow_partial_iterations=args.allow_partial_iterations)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(format_plan(plan, seconds_per_hop=args.seconds_per_hop, slots_per_shard=args.slots))
    if args.seconds_per_hop is not None:
        from mop_airflow.simulation import estimate_seconds  # noqa: PLC0415
        from mop_airflow.task_plan import build_task_plan  # noqa: PLC0415

        sim = estimate_seconds(build_task_plan(args.shards, 0, plan), plan.total_configurations,
                               seconds_per_hop=args.seconds_per_hop, slots=args.slots, adaptive=plan,
                               task_seconds=args.task_seconds)
        print(f"simulated wall time: {sim.makespan:,.0f} s: the DAG's own task plan replayed with Airflow's pool "
              f"and priority rules, rung barriers and {args.task_seconds:g} s of fixed cost per task included; "
              f"shard slots busy {sim.busy_fraction:.0%}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from mop_airflow.demo import run_demo  # noqa: PLC0415

    return run_demo(Path(args.home), Path(args.dags_folder), timeout=args.timeout)


def build_parser() -> argparse.ArgumentParser:
    home = os.environ.get("MOP_AIRFLOW_HOME") or ".mop_home"
    parser = argparse.ArgumentParser(prog="mop-airflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    pools = sub.add_parser("pools", help="manage the per-shard Airflow pools").add_subparsers(dest="action", required=True)
    sync = pools.add_parser("sync", help="create or resize pools mop_shard_0..N-1 (run where `airflow` runs)")
    sync.add_argument("--shards", type=int, required=True)
    sync.add_argument("--slots", type=int, default=1, help="models a shard trains at once: its GPUs (default 1)")
    sync.set_defaults(func=_cmd_pools_sync)

    data = sub.add_parser("example-data", help="generate MNIST-1D, digits and Friedman #1 (offline) as Parquet/CSV")
    data.add_argument("--dir", default=os.path.join(home, "data"))
    data.add_argument("--num-samples", type=int, default=20000)
    data.set_defaults(func=_cmd_example_data)

    plan = sub.add_parser("plan", help="print a Hyperband or successive-halving schedule before running it")
    plan.add_argument("--R", type=int, default=9, help="Hyperband: maximum iterations per configuration")
    plan.add_argument("--eta", type=int, default=3)
    plan.add_argument("--rounding", choices=("paper", "madlib"), default="paper")
    plan.add_argument("--skip-last", type=int, default=0)
    plan.add_argument("--n", type=int, default=None, help="successive halving: configurations in the bracket")
    plan.add_argument("--r", type=int, default=1, help="successive halving: iterations of the first rung")
    plan.add_argument("--rungs", type=int, default=None)
    plan.add_argument("--shards", type=int, default=4)
    plan.add_argument("--slots", type=int, default=1)
    plan.add_argument("--allow-partial-iterations", action="store_true")
    plan.add_argument("--seconds-per-hop", type=float, default=None,
                      help="measured seconds per model hop, for the wall-time estimate (see benchmarks/)")
    plan.add_argument("--task-seconds", type=float, default=0.0,
                      help="Airflow's fixed cost per task (start-up, imports), added to every hop in the "
                           "simulated wall time; benchmarks/hop_overhead.py measures it")
    plan.set_defaults(func=_cmd_plan)

    demo = sub.add_parser("demo", help="run the MNIST-1D demo on a local Airflow and print the leaderboard")
    demo.add_argument("--home", default=home, help="project-local folder for Airflow, the store and the data")
    demo.add_argument("--dags-folder", default="dags")
    demo.add_argument("--timeout", type=float, default=900)
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("shards", "slots"):
        if getattr(args, name, 1) < 1:
            print(f"--{name} must be at least 1", file=sys.stderr)
            return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
