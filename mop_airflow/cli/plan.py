"""`mop-airflow plan`: a Hyperband, successive-halving or ASHA schedule, printed before it runs, with
a simulated wall time when the seconds per hop are known. Needs no Airflow."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from mop_airflow.cli.runs import OK, USAGE


def add_commands(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser(
        "plan", help="print a Hyperband, successive-halving or ASHA schedule before running it",
        description="Print the brackets and rungs of a Hyperband schedule (--R, --eta), of one successive-halving "
                    "bracket (--n, --r, --rungs) or of ASHA (--asha): configurations and iterations per rung, "
                    "model hops per shard, and with --seconds-per-hop a simulated wall time on --shards shards "
                    "of --slots slots. Nothing runs; no Airflow is needed.")
    plan.add_argument("--asha", action="store_true", help="ASHA with --n, --r, --R and --eta: its rungs, budget and "
                                                          "a replay on the shards' slots")
    plan.add_argument("--R", type=int, default=9, help="Hyperband: maximum iterations per configuration")
    plan.add_argument("--eta", type=int, default=3,
                      help="the halving rate: each rung keeps 1/eta of the configurations and trains them eta "
                           "times longer")
    plan.add_argument("--rounding", choices=("paper", "madlib"), default="paper",
                      help="Hyperband's bracket sizes: paper (Li et al.'s Algorithm 1, rounds each bracket's "
                           "configurations up) or madlib (Apache MADlib's, rounds down to multiples of eta)")
    plan.add_argument("--skip-last", type=int, default=0,
                      help="Hyperband: drop the last N rungs of every bracket, as MADlib's skip_last (brackets "
                           "with fewer rungs vanish)")
    plan.add_argument("--n", type=int, default=None, help="successive halving: configurations in the bracket; "
                                                          "ASHA: configurations started in all (default 27)")
    plan.add_argument("--r", type=int, default=1, help="successive halving and ASHA: iterations of the first rung")
    plan.add_argument("--rungs", type=int, default=None,
                      help="successive halving: number of rungs (default: floor(log_eta(n)) + 1, the most that leave "
                           "a configuration in the last rung)")
    plan.add_argument("--budget", type=int, default=None, help="ASHA: iterations the whole search may train")
    plan.add_argument("--shards", type=int, default=4, help="data shards (schedule.shards): hops per iteration")
    plan.add_argument("--slots", type=int, default=1,
                      help="models a shard trains at once (schedule.slots_per_shard), for the simulation")
    plan.add_argument("--seconds-per-hop", type=float, default=None,
                      help="measured seconds per model hop, for the wall-time estimate (see benchmarks/)")
    plan.add_argument("--task-seconds", type=float, default=0.0,
                      help="Airflow's fixed cost per task (start-up, imports), added to every hop in the "
                           "simulated wall time; benchmarks/sim_vs_airflow.py measures it on a real Airflow")
    plan.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from mop_airflow.errors import SpecError  # noqa: PLC0415
    from mop_airflow.search.hyperband import format_plan, hyperband_plan, successive_halving  # noqa: PLC0415

    if args.asha:
        return plan_asha(args)
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

        # the DAG's plan renders a train task per shard slot: --slots of them on each shard
        task_plan = build_task_plan(args.shards, 0, plan, slots=args.slots)
        sim = estimate_seconds(task_plan, plan.total_configurations,
                               seconds_per_hop=args.seconds_per_hop, slots=args.slots, adaptive=plan,
                               task_seconds=args.task_seconds)
        blocks = sum(1 for spec in task_plan.tasks if spec.kind == "decide")
        print(f"simulated wall time: {sim.makespan:,.0f} s: the DAG's own task plan replayed with Airflow's pool "
              f"and priority rules, its {blocks} block(s) to the rung ends one after another and "
              f"{args.task_seconds:g} s of fixed cost per task included; shard slots busy {sim.busy_fraction:.0%}")
    return OK


def plan_asha(args: argparse.Namespace) -> int:
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
