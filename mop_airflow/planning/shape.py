"""What fixes a MOP DAG's shape, read once from its spec into a typed record.

:func:`dag_shape` answers, before any task exists: how many shards and slots, which adaptive plan,
whether its slots decide (ASHA), how many blocks one DAG run holds and whether they are the whole
search, how many hops one run of a plain search trains, and what a train task's priority weighs.
:func:`mop_airflow.planning.task_plan.plan_tasks` turns the record into tasks,
:func:`mop_airflow.planning.describe.describe_search` into the DAG's description; neither reads
the spec's schedule again. Imports no Airflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mop_airflow.errors import SpecError
from mop_airflow.planning.blocks import block_capacity
from mop_airflow.planning.run_chain import hops_per_run as _hops_per_run
from mop_airflow.planning.schedule import DEFAULT_PRIORITY, priority_weight
from mop_airflow.search.adaptive import in_slots as _in_slots, most_blocks

# The most task instances the blocks of one DAG run may hold: Airflow's scheduler examines every
# waiting task instance in every loop (apache/airflow #31185). Hyperband R=81, eta=3 on 16 shards of
# one slot renders 5 blocks of 16 train tasks and a decide task each (109 tasks in all); 64 shards of
# 5 slots, 5 blocks of 321 (1,677 tasks).
RUN_TASK_BUDGET = 2000


@dataclass(frozen=True)
class DagShape:
    """A DAG's shape. ``blocks``: the blocks one DAG run of an adaptive search renders (1 for a plain
    search), ``whole``: whether they are the whole search; ``hops``: a plain search's hops, of which
    one run trains ``hops_per_run``; ``train_weight``: a plain search's train tasks' priority weight."""

    shards: int
    iterations: int
    adaptive: Any = None  # HyperbandPlan, Bracket, AshaPlan, PbtPlan, or None for a plain search
    slots: int = 1
    priority: str = DEFAULT_PRIORITY
    publish: bool = True
    result: bool = False
    in_slots: bool = False
    blocks: int = 1
    whole: bool = False
    hops: int = 0
    hops_per_run: int = 0
    train_weight: int = 1
    configurations: int = 0  # a plain search's, from the spec's own space; a trigger conf may change it per run
    builder_modules: tuple[str, ...] = ()


def shape_of(shards: int, iterations: int, adaptive: Any = None, *, priority: str = DEFAULT_PRIORITY,
             publish: bool = True, slots: int = 1, result: bool = False, hops_per_run: int | None = None,
             blocks_setting: int | str = "auto", in_slots: bool = False, configurations: int = 0,
             builder_modules: tuple[str, ...] = ()) -> DagShape:
    """The shape of ``shards`` x ``slots`` shard slots training ``iterations`` iterations (a plain search)
    or ``adaptive``'s blocks. ``hops_per_run``: a plain search's hops one DAG run renders, when fewer than
    the search's (:mod:`mop_airflow.planning.run_chain`). ``blocks_setting``: an adaptive search's
    blocks a run holds: ``"auto"``, all of them when their number is known up front
    (:func:`~mop_airflow.search.adaptive.most_blocks`) and their tasks stay within ``RUN_TASK_BUDGET``,
    so ``dag.test()`` runs the search whole, else one; a whole number sets the count."""
    hops = iterations * shards
    weight = priority_weight(priority, 0, max(1, hops_per_run or hops))  # also refuses an unknown rule
    count, whole = 1, False
    if adaptive is not None and not in_slots:
        bound = most_blocks(adaptive, block_capacity(shards, slots, adaptive))
        per_block = shards * slots + 1  # a block's train tasks (one per shard slot) and its decision
        if blocks_setting != "auto":
            count = int(blocks_setting) if bound is None else min(int(blocks_setting), bound)
        elif bound is not None and bound * per_block <= RUN_TASK_BUDGET:
            count = bound
        whole = bound is not None and count >= bound
    return DagShape(shards=shards, iterations=iterations, adaptive=adaptive, slots=slots, priority=priority,
                    publish=publish, result=result, in_slots=in_slots, blocks=count, whole=whole, hops=hops,
                    hops_per_run=hops_per_run or hops, train_weight=weight, configurations=configurations,
                    builder_modules=builder_modules)


def dag_shape(spec: Any, priority: str = DEFAULT_PRIORITY, *, result: bool = False) -> DagShape:
    """The shape a :class:`~mop_airflow.config.MopSpec` renders: a whole MOP DAG, or a MopTaskGroup's
    search inside the user's DAG run (``result``: it ends in a task returning the winner)."""
    schedule, space = spec.schedule, spec.search.space
    adaptive = spec.adaptive_plan()
    split = schedule.iterations_per_run not in ("auto", schedule.iterations)
    if adaptive is None and result and split:  # a MopTaskGroup's run is the user's DAG run
        raise SpecError("schedule.iterations_per_run", schedule.iterations_per_run,
                        "cannot split a MopTaskGroup's search over several DAG runs: the run is your DAG's, and "
                        "its other tasks would run once per block", "leave schedule.iterations_per_run out")
    per_run = (_hops_per_run(schedule.iterations, schedule.shards, schedule.iterations_per_run)
               if adaptive is None and not result else None)
    shape = shape_of(schedule.shards, schedule.iterations, adaptive, priority=priority, publish=spec.publish.enabled,
                     slots=schedule.slots_per_shard, result=result, hops_per_run=per_run,
                     blocks_setting=schedule.iterations_per_run, in_slots=_in_slots(adaptive, space.sampler),
                     configurations=0 if adaptive is not None else
                     space.size() if space.method == "grid" else int(space.num_samples),
                     builder_modules=tuple(sorted({path.split(":", 1)[0] for path in space.builders()})))
    if result and adaptive is not None and not shape.in_slots and not shape.whole:
        raise SpecError("search.adaptive.method", spec.search.adaptive["method"],
                        "takes more blocks than one DAG run holds here (a model-based ASHA, space.sampler='tpe', "
                        "without a budget has no number of blocks known up front; another search's blocks may pass "
                        f"{RUN_TASK_BUDGET} task instances, or schedule.iterations_per_run may hold fewer), so each "
                        "block's decision would start the DAG's next run, while a MopTaskGroup's search runs inside "
                        "your DAG's one run",
                        "in a MopTaskGroup use hyperband, successive_halving, pbt, an ASHA drawing at random "
                        "(decided inside the shard slots, one block) or a model-based ASHA with a budget; or "
                        "build_mop_dag for a whole MOP DAG of its own")
    return shape
