"""Spec -> Airflow DAG: render the pure task plan (:mod:`mop_airflow.task_plan`) into operators.

The plan decides every task id, pool, queue, upstream and priority weight; this module only
instantiates operators from it. Each offset class becomes a mapped task group over the
configurations its source task lists, so every configuration's hops form their own chain of task
instances (instance ``i`` of a hop waits only for instance ``i`` of the previous hop). Rendering
is plain data work (no TensorFlow, no Great Expectations): the DAG file parses in well under a
second.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Mapping, Sequence

from airflow.sdk import DAG, Param, TaskGroup, task_group

from mop_airflow.operators.check_models import MopCheckModelsOperator
from mop_airflow.operators.data import MopListDataOperator, MopScatterOperator, MopShardOperator
from mop_airflow.operators.plan import MopDealOperator, MopPlanOperator, MopStageShardOperator
from mop_airflow.operators.preflight import MopPreflightOperator
from mop_airflow.operators.promote import MopPromoteOperator
from mop_airflow.operators.report import MopReportOperator
from mop_airflow.operators.train import MopTrainHopOperator
from mop_airflow import resolve
from mop_airflow.schedule import DEFAULT_PRIORITY
from mop_airflow.spec import MopSpec
from mop_airflow.task_plan import ClassGroup, TaskPlan, TaskSpec, build_task_plan

# Every task retries twice, 10 s and then 20 s later: a hop that dies with its worker resumes from
# its configuration's last checkpoint (the one its assignment names). Errors a retry cannot fix
# fail at once (mop_airflow.operators.base.NOT_RETRIED). Override with default_args.
RETRIES = {"retries": 2, "retry_delay": dt.timedelta(seconds=10), "retry_exponential_backoff": 2.0,
           "max_retry_delay": dt.timedelta(minutes=5)}

OPERATORS = {"list_data": MopListDataOperator, "shard": MopShardOperator, "stage": MopStageShardOperator,
             "deal": MopDealOperator, "promote": MopPromoteOperator, "report": MopReportOperator,
             "check_models": MopCheckModelsOperator}


def _params(spec: MopSpec) -> dict[str, Param]:
    """Run-time overrides offered in the trigger form; shards and iterations stay fixed."""
    as_dict = spec.to_dict()
    return {
        "search": Param(as_dict["search"], type="object",
                        description="Search space and ranking metric for this run (method, params, num_samples, seed)."),
        "schedule": Param(as_dict["schedule"], type="object",
                          description="epochs_per_hop, slots_per_shard, metrics_every and seed may change per run; "
                                      "shards and iterations are fixed by the DAG file."),
        "data": Param(as_dict["data"], type="object", description="Input data: source, label, features, classes, validation."),
    }


def _description(spec: MopSpec) -> str:
    p = spec.schedule.shards
    adaptive = spec.adaptive_plan()
    if adaptive is None:
        return f"MOP model selection: {p} shards x {spec.schedule.iterations} iterations"
    from mop_airflow.search.adaptive import brackets_of  # noqa: PLC0415

    brackets = brackets_of(adaptive)
    longest = max(b.rungs[-1].hops_i for b in brackets) // p
    return (f"MOP {spec.search.adaptive['method'].replace('_', ' ')}: {p} shards, {len(brackets)} bracket(s), "
            f"{adaptive.total_configurations} configurations, up to {longest} iterations each")


def build_mop_dag(
    spec: MopSpec | Mapping[str, Any],
    *,
    dag_id: str,
    schedule: Any = None,
    start_date: dt.datetime | None = None,
    catchup: bool = False,
    tags: list[str] | None = None,
    default_args: Mapping[str, Any] | None = None,
    pools: str = "create",
    description: str | None = None,
    priority: str = DEFAULT_PRIORITY,
    builder_modules: Sequence[str] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the MOP model-selection DAG for ``spec``.

    Tasks retry twice with backoff (:data:`RETRIES`); pass ``default_args={"retries": 0}`` to turn it
    off. ``pools`` says what the first task does about the shard pools a run needs, through Airflow's
    REST API: ``"create"`` the missing ones, ``"check"`` they exist (fail naming the command that
    creates them), or ``"off"`` (deployments whose pools are managed elsewhere). ``dag.test()`` and
    ``airflow dags test`` never use pools, so nothing is checked there.

    ``priority`` picks the rule by which a free shard slot chooses among waiting configurations
    (:data:`mop_airflow.schedule.PRIORITY_RULES`).

    A trigger conf may name model builders only from ``builder_modules`` (modules or packages);
    by default those are the modules the spec's own builders come from, so a conf cannot make the
    workers import arbitrary code.
    """
    spec = spec if isinstance(spec, MopSpec) else MopSpec.from_dict(spec)
    plan = build_task_plan(spec.schedule.shards, spec.schedule.iterations, spec.adaptive_plan(), priority=priority)
    p, slots = spec.schedule.shards, spec.schedule.slots_per_shard
    dag = DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=start_date or dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
        catchup=catchup,
        tags=list(tags or ["mop_airflow"]),
        default_args={**RETRIES, **(default_args or {})},
        params=_params(spec),
        description=description or _description(spec),
        max_active_runs=dag_kwargs.pop("max_active_runs", 1),
        # Airflow's default of 16 running tasks per run would idle shard slots past 16 of them;
        # the extra room is for the control tasks (deal, promote) running beside the hops.
        max_active_tasks=dag_kwargs.pop("max_active_tasks", max(16, p * slots + p + 2)),
        **dag_kwargs,
    )
    allowed = list(builder_modules) if builder_modules is not None else resolve.builder_modules(spec)
    with dag:
        _Renderer(plan, spec.to_dict(), pools=pools, builder_modules=allowed).render()
    return dag


class _Renderer:
    def __init__(self, plan: TaskPlan, spec: dict[str, Any], *, pools: str, builder_modules: list[str]) -> None:
        self.plan = plan
        self.spec = spec
        self.pools = pools
        self.builder_modules = builder_modules
        self.ops: dict[str, Any] = {}
        self.containers: dict[str, TaskGroup] = {}

    def render(self) -> None:
        groups = {g.group_id: g for g in self.plan.groups}
        for spec in self.plan.tasks:
            if spec.group is None:
                self.ops[spec.task_id] = self._operator(spec)
            elif spec.group not in self.ops:
                self._class_group(groups[spec.group])

    def _common(self, spec: TaskSpec) -> dict[str, Any]:
        return {"task_id": spec.task_id.rsplit(".", 1)[-1], "store": self.spec["store"],
                "priority_weight": spec.priority_weight, "weight_rule": "absolute", "trigger_rule": spec.trigger_rule,
                **({"pool": spec.pool} if spec.pool else {}), **({"queue": spec.queue} if spec.queue else {})}

    def _operator(self, spec: TaskSpec) -> Any:
        kwargs = {**self._common(spec), **{k: v for k, v in spec.args.items()}}
        container = self._container(spec.task_id)
        if container is not None:
            kwargs["task_group"] = container
        if spec.kind == "preflight":
            kwargs.pop("store")
            op = MopPreflightOperator(spec=self.spec, pools=self.pools,
                                      builder_modules=self.builder_modules, **kwargs)
        elif spec.kind == "plan":
            op = MopPlanOperator(priority=self.plan.priority, **kwargs)
        elif spec.kind == "scatter":  # one instance per slice of files that list_data returns
            op = MopScatterOperator.partial(map_index_template="slice {{ task.slice_index }}", **kwargs).expand(
                slice_index=self.ops[spec.upstream[0]].output)
        else:
            op = OPERATORS[spec.kind](**kwargs)
        for up in spec.upstream:
            self.ops[up] >> op
        return op

    def _container(self, task_id: str) -> TaskGroup | None:
        """The plain (unmapped) task groups a task id's prefix names, created on first use."""
        parts = task_id.split(".")[:-1]
        parent = None
        for depth in range(1, len(parts) + 1):
            path = ".".join(parts[:depth])
            if path not in self.containers:
                kwargs = {"parent_group": parent} if parent is not None else {}
                self.containers[path] = TaskGroup(group_id=parts[depth - 1], tooltip=_tooltip(parts[depth - 1]),
                                                  **kwargs)
            parent = self.containers[path]
        return parent

    def _class_group(self, group: ClassGroup) -> None:
        """A mapped task group: one instance per configuration of the class, each hop on its shard's pool."""
        specs = self.plan.group_tasks(group.group_id)
        made: list[Any] = []

        @task_group(group_id=group.group_id.rsplit(".", 1)[-1],
                    tooltip=f"configurations of offset class {group.offset}: global hop t trains on shard "
                            f"({group.offset} + t) mod {self.plan.shards}; one mapped instance per configuration")
        def chain(assignment: Any) -> Any:
            previous = assignment
            for spec in specs:
                op = MopTrainHopOperator(assignment=previous, map_index_template="{{ task.assignment['config_id'] }}",
                                         **self._common(spec), **spec.args)
                made.append(op)
                previous = op.output
            return made[-1]

        container = self._container(group.group_id)
        if container is not None:
            with container:
                rendered = chain.expand(assignment=self.ops[group.source].output)
        else:
            rendered = chain.expand(assignment=self.ops[group.source].output)
        for up in specs[0].upstream:
            if up != group.source:
                self.ops[up] >> made[0]
        self.ops[group.group_id] = rendered
        for spec, op in zip(specs, made):
            self.ops[spec.task_id] = op


def _tooltip(group_id: str) -> str:
    kind, _, number = group_id.partition("_")
    return {"bracket": f"Hyperband bracket s={number}", "rung": f"rung {number}: train, then promote the best"}.get(
        kind, group_id)
