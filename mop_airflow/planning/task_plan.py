"""The DAG as plain data: every task's id, kind, pool, queue, upstreams and priority weight.

Built from what fixes the DAG's shape (shards, slots, iterations, the adaptive plan), never from a
run's configurations, which change per run. :mod:`mop_airflow.airflow.dag` renders it into Airflow
operators and :func:`mop_airflow.planning.simulation.simulate` replays it, so both see the same
plan. Imports no Airflow.

Shape of a plain search (``p`` shards, ``T = iterations * p`` hops, ``m`` slots per shard)::

    preflight >> list_data >> scatter[k] >> shard >> plan >> stage_shard_<s>     (s = 0..p-1)
                scatter is mapped over the source's slices of files (validate + write parts)
    plan >> check_models     builds each distinct model once on the data's shapes
    stage_shard_<s>          copies shard s (and the validation rows) into its worker's cache
    train_shard_<s>          one task per shard slot (``train_shard_<s>_slot_<k>`` when m > 1) on
                             pool and queue mop_shard_<s>, after the stage tasks and check_models:
                             a warm process that reads the plan (offset class o's hop t is on shard
                             (o + t) mod p) and trains every hop of the block on its shard slot,
                             each as soon as its configuration's previous hop is committed
                             (:mod:`mop_airflow.slots.driver`)
    every train task >> report >> publish
    publish     emits the DAG's champion Asset event when the run's winner beats the champion

A **block** is a span of hops that one set of train tasks trains: a plain search's whole run (or
its ``iterations_per_run``), an adaptive search's hops to its next decision point, or a whole ASHA
search decided inside the shard slots. Its train tasks wait for
each other's hops, so they must all run at once: a block's tasks never share a pool with another
block's at the same time (a run's blocks run one after another), and preflight
refuses a deployment whose slots cannot hold them.

A plain search longer than one run holds (``schedule.iterations_per_run``, :mod:`mop_airflow.planning.run_chain`)
renders the hops of ``iterations_per_run`` iterations, and ``every train task >> next_run >> report``:
``next_run`` triggers the DAG's next run for the next block of iterations, and the report (then
publish) runs only in the run of the last block.

An ASHA search drawing its configurations at random is decided inside the shard slots
(:mod:`mop_airflow.planning.asha_slots`): one block of train tasks, one per shard slot, and no
``decide`` task; a slot with nothing ready asks ASHA what trains next. The whole search is one DAG
run, with or without a budget.

Any other adaptive search trains in **blocks to the next decision point** (:mod:`mop_airflow.planning.blocks`):
block ``k`` trains every configuration its decision kept from where it stands to the next point where
the search decides (the end of a rung of Hyperband's brackets side by side, PBT's next boundary, the
end of one of a model-based ASHA's jobs), then ``decide`` ranks what ended there and writes block
``k + 1``'s decision. Where the number of blocks is known up front (Hyperband R=81, eta=3: 5 blocks,
at iteration 1, 3, 9, 27 and 81; PBT: one per interval; a model-based random search: one per wave)
and their tasks fit 2,000 task instances (``shape.RUN_TASK_BUDGET``), one run holds them all, in sequence
(``block_<k>.train_shard_<s>``, each reading its block's decision as it starts, then ``block_<k>.decide``),
so ``dag.test()`` trains the search whole; otherwise (a model-based ASHA without a budget, or more
tasks than that) each block's decide step starts the DAG's next run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from mop_airflow.planning.schedule import DEFAULT_PRIORITY
from mop_airflow.planning.shape import DagShape, dag_shape, shape_of

# The report runs even when every train task was skipped: it then says why each configuration stopped.
REPORT_JOIN = "none_failed"
# The tasks a run continuing a search skips at once from its preflight: the search's data is sharded
# and its plan written by its first run. Each was a task process that returned at once, one after
# the other, between two blocks (about 0.8 s each on the embedded Airflow).
CONTINUING_SKIPS = ("list_data", "scatter", "shard", "plan")
# A block's train tasks: after its source tasks (and the block before), which a pruned rung or an
# earlier block without configurations may have skipped; a train task with nothing to train skips.
TRAIN_JOIN = "none_failed_min_one_success"
# Stage and check_models: after plan, or after preflight when it skipped plan. Not plain
# "none_failed": a MopTaskGroup skipped as a whole (a branch upstream) must skip them too.
AFTER_PLAN_OR_SKIP = "none_failed_min_one_success"


def shard_pool(shard: int) -> str:
    """The Airflow pool (concurrency: one slot per GPU) and queue (placement) of shard ``shard``."""
    return f"mop_shard_{shard}"


@dataclass(frozen=True)
class TaskSpec:
    """One task: ``task_id`` is the full id, group prefixes included (``block_1.decide``)."""

    task_id: str
    kind: str  # preflight, list_data, scatter, shard, plan, stage, check_models, train, decide,
    #            next_run, report, publish, result
    upstream: tuple[str, ...] = ()
    group: str | None = None
    pool: str | None = None
    queue: str | None = None
    priority_weight: int = 1
    trigger_rule: str = "all_success"
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskPlan:
    shards: int
    tasks: tuple[TaskSpec, ...]
    priority: str = DEFAULT_PRIORITY
    slots: int = 1  # per shard: a block's train tasks per shard

    @property
    def train_tasks(self) -> int:
        """The task instances that train: one per shard slot per block."""
        return sum(1 for spec in self.tasks if spec.kind == "train")


def build_task_plan(shards: int, iterations: int, adaptive: Any = None, **shape: Any) -> TaskPlan:
    """The task plan for ``shards`` shards and ``iterations`` iterations, or an adaptive plan's blocks
    (``shape``: the other fields of :func:`~mop_airflow.planning.shape.shape_of`)."""
    return plan_tasks(shape_of(shards, iterations, adaptive, **shape))


def spec_task_plan(spec: Any, priority: str = DEFAULT_PRIORITY, *, result: bool = False) -> TaskPlan:
    """The task plan a :class:`~mop_airflow.config.MopSpec` renders (``result``: a MopTaskGroup's)."""
    return plan_tasks(dag_shape(spec, priority, result=result))


def plan_tasks(shape: DagShape) -> TaskPlan:
    """The tasks of a DAG of shape ``shape`` (:mod:`mop_airflow.planning.shape`).

    ``shape.adaptive`` is a :class:`~mop_airflow.search.hyperband.HyperbandPlan`, ``Bracket``,
    ``AshaPlan`` or ``PbtPlan``; ``shape.publish`` adds the task after the report that publishes a
    winner as the DAG's champion, ``shape.result`` the task a MopTaskGroup returns its winner from. A
    plain search whose run trains fewer hops than the search's (``shape.hops_per_run``) ends its run in
    ``next_run``; the DAG's later runs train the rest (:mod:`mop_airflow.planning.run_chain`). An ASHA
    search decided inside the shard slots (``shape.in_slots``, :mod:`mop_airflow.planning.asha_slots`)
    is one block; any other adaptive search renders ``shape.blocks`` blocks, each then its decision.
    """
    shards, slots = shape.shards, shape.slots
    builder = _Builder(shards, slots)
    builder.add("preflight", "preflight")
    builder.add("list_data", "list_data", ("preflight",))
    builder.add("scatter", "scatter", ("list_data",))  # mapped over the slices list_data returns
    builder.add("shard", "shard", ("scatter",))
    builder.add("plan", "plan", ("shard",))
    # A run that continues a search skips the data and planning tasks from its preflight
    # (CONTINUING_SKIPS): its stage tasks and check_models then run after preflight alone.
    stages = [builder.add(f"stage_shard_{s}", "stage", ("plan", "preflight"), pool=shard_pool(s), queue=shard_pool(s),
                          args={"shard": s}, trigger_rule=AFTER_PLAN_OR_SKIP)
              for s in range(shards)]
    # Beside the staging: builds each distinct model once on the data's shapes before any hop.
    ready = [*stages, builder.add("check_models", "check_models", ("plan", "preflight"),
                                  trigger_rule=AFTER_PLAN_OR_SKIP)]
    report_args: dict[str, Any] = {}
    if shape.adaptive is None:
        end = shape.hops_per_run
        finals = builder.train(tuple(ready), end=end, weight=shape.train_weight)
        if end < shape.hops:
            finals = [builder.add("next_run", "next_run", tuple(finals), trigger_rule=REPORT_JOIN,
                                  args={"hops_per_run": end, "hops": shape.hops})]
            report_args = {"last_start": shape.hops - end}  # the report waits for the run whose block starts there
    elif shape.in_slots:  # one block, whose slots decide what trains next as they go: no decide step, no DAG run per block
        finals = builder.decided("", tuple(ready), asha=True)
    else:  # blocks to the next decision point; each decide step says what the next block trains
        count, whole = shape.blocks, shape.whole
        finals = builder.decided("", tuple(ready), block=0)
        if count == 1 and not whole:  # one block a run: the decide step starts the DAG's next run
            finals = [builder.add("decide", "decide", tuple(finals), trigger_rule=REPORT_JOIN)]
        for k in range(1, count):  # the whole search in this run: block k's train tasks wait for decision k
            gate = builder.add(f"block_{k}.decide", "decide", tuple(finals), trigger_rule=REPORT_JOIN,
                               args={"block": k - 1})
            finals = builder.decided(f"block_{k}.", (gate,), block=k)
        if count > 1 or whole:  # the last decide step starts the DAG's next run unless the run holds the whole search
            finals = [builder.add("decide", "decide", tuple(finals), trigger_rule=REPORT_JOIN,
                                  args={"block": count - 1, "last": True, "whole": whole})]
        # reports only in the run whose (last) decide step found nothing left
        report_args = {"decided": True, **({"blocks": count} if count > 1 or whole else {})}
    last = builder.add("report", "report", tuple(finals), trigger_rule=REPORT_JOIN, args=report_args)
    if shape.publish:
        last = builder.add("publish", "publish", ("report",))
    if shape.result:
        builder.add("result", "result", (last,), trigger_rule=REPORT_JOIN)
    return TaskPlan(shards=shards, tasks=tuple(builder.tasks), priority=shape.priority, slots=slots)


def train_task_id(prefix: str, shard: int, slot: int, slots: int) -> str:
    """``train_shard_<s>``, or ``train_shard_<s>_slot_<k>`` on shards of several slots, inside ``prefix``."""
    return f"{prefix}train_shard_{shard}" + (f"_slot_{slot}" if slots > 1 else "")


class _Builder:
    def __init__(self, shards: int, slots: int = 1) -> None:
        self.shards = shards
        self.slots = slots
        self.tasks: list[TaskSpec] = []
        self.position: dict[str, int] = {}  # task id -> its index in tasks

    def add(self, task_id: str, kind: str, upstream: tuple[str, ...] = (), **fields: Any) -> str:
        # Control tasks outrank the train tasks: a decide step gates whole blocks.
        self.position[task_id] = len(self.tasks)
        self.tasks.append(TaskSpec(task_id, kind, tuple(dict.fromkeys(upstream)),
                                   priority_weight=fields.pop("weight", 10**6), **fields))
        return task_id

    def decided(self, prefix: str, after: tuple[str, ...], *, block: int | None = None, asha: bool = False) -> list[str]:
        """A block of an adaptive search: one train task per shard slot, after ``after``, each reading
        what trains from the decision before the block (block ``block`` of the run) as it starts; or
        the one block of an ASHA search, whose slots decide as they go (``asha``)."""
        return [self.add(train_task_id(prefix, s, k, self.slots), "train", after, pool=shard_pool(s),
                         queue=shard_pool(s), trigger_rule=TRAIN_JOIN, weight=1,
                         args={"shard": s, "slot": k, "end": self.shards,
                               **({"asha": True} if asha else {"rung_end": True, "relative": True, "block": block})})
                for s in range(self.shards) for k in range(self.slots)]

    def train(self, after: tuple[str, ...], *, end: int, weight: int) -> list[str]:
        """A plain search's block, one train task per shard slot, after ``after``: each reads the plan
        as it starts and trains the block's hops ``0..end - 1`` on its shard slot. Returns their ids."""
        return [self.add(train_task_id("", s, k, self.slots), "train", after, pool=shard_pool(s), queue=shard_pool(s),
                         trigger_rule=TRAIN_JOIN, weight=weight, args={"shard": s, "slot": k, "end": end})
                for s in range(self.shards) for k in range(self.slots)]
