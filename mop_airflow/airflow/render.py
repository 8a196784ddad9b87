"""The pure task plan (:mod:`mop_airflow.planning.task_plan`) instantiated as Airflow operators, into the
current DAG or task group.

The plan decides every task id, pool, queue, upstream and priority weight; this module only
instantiates operators from it, for a whole MOP DAG (:func:`mop_airflow.airflow.dag.build_mop_dag`)
or a :class:`~mop_airflow.airflow.group.MopTaskGroup`. A block becomes one train task per shard
slot, which reads the configurations every class's source task lists (their XComs) and trains the
block's hops on its shard slot. Rendering is plain data work (no TensorFlow, no Great
Expectations): a DAG file parses in well under a second.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any, Iterator, Mapping, Sequence

from airflow.sdk import Asset, TaskGroup
from airflow.sdk.definitions.param import ParamsDict

from mop_airflow.deployment.shard_pods import ShardPods, executor_config
from mop_airflow.serving.champion import champion_asset_uri
from mop_airflow.operators.check_models import MopCheckModelsOperator
from mop_airflow.operators.data import MopListDataOperator, MopScatterOperator, MopShardOperator
from mop_airflow.operators.decide import MopDecideOperator
from mop_airflow.operators.next_run import MopNextRunOperator
from mop_airflow.operators.plan import MopPlanOperator, MopStageShardOperator
from mop_airflow.operators.preflight import MopPreflightOperator
from mop_airflow.operators.publish import MopPublishOperator
from mop_airflow.operators.report import MopReportOperator, MopResultOperator
from mop_airflow.operators.train import MopTrainShardOperator
from mop_airflow.records.selection import selection_id
from mop_airflow.config import MopSpec
from mop_airflow.planning.task_plan import TaskPlan, TaskSpec

# Every task retries twice, 10 s and then 20 s later: a train task that dies with its worker trains
# again the hops it had not committed, each from its configuration's last checkpoint. Errors a retry cannot fix
# fail at once (mop_airflow.operators.base.NOT_RETRIED). Override with default_args.
RETRIES = {"retries": 2, "retry_delay": dt.timedelta(seconds=10), "retry_exponential_backoff": 2.0,
           "max_retry_delay": dt.timedelta(minutes=5)}

OPERATORS = {"list_data": MopListDataOperator, "shard": MopShardOperator, "stage": MopStageShardOperator,
             "report": MopReportOperator,
             "check_models": MopCheckModelsOperator, "result": MopResultOperator, "next_run": MopNextRunOperator,
             "decide": MopDecideOperator}


def champion_asset(selection: str) -> Asset:
    """The Asset ``mop://<selection id>/champion``: schedule a DAG on it to act on every new champion."""
    return Asset(uri=champion_asset_uri(selection), name=champion_asset_uri(selection), group="mop_airflow")


def render_selection(spec: MopSpec, plan: TaskPlan, *, dag: Any, builder_modules: Sequence[str],
                     group: str | None = None, pools: str = "create",
                     kubernetes: ShardPods | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Instantiate ``plan`` in the current DAG or task group of ``dag``; returns the operators by plan task id.

    ``builder_modules``: the modules a trigger conf may take model builders from.
    ``group`` is the MopTaskGroup's id (None for a whole MOP DAG). ``kubernetes``: run each shard's
    stage and train tasks as pods on its volume and GPUs (:class:`~mop_airflow.deployment.shard_pods.ShardPods`).
    """
    pods = None
    if kubernetes is not None:
        pods = ShardPods.of(kubernetes)
        pods.check_fits(spec.schedule.slots_per_shard)
    renderer = _Renderer(plan, spec.to_dict(), dag_id=dag.dag_id, group=group, pools=pools,
                         builder_modules=list(builder_modules), pods=pods)
    with dag_params_set_aside(dag):
        renderer.render()
    return renderer.ops


@contextlib.contextmanager
def dag_params_set_aside(dag: Any) -> Iterator[None]:
    """Create tasks without their own copy of the DAG's params (the trigger form).

    Airflow deep-copies the DAG's params into every task it creates, then serializes and validates
    each copy: for the 2,584 tasks of 256 configurations x 16 shards x 10 iterations that was 2.7 s
    of a 3.5 s parse and 13.2 s of a 13.5 s serialization (12.9 MB against 2.1 MB). A task never
    needs the copy: at run time its params are the DAG's, then its own, then the trigger conf
    (``airflow.sdk.definitions.param.process_params``). Params a task was given itself stay.
    """
    params = dag.params
    dag.params = ParamsDict()
    try:
        yield
    finally:
        dag.params = params


class _Renderer:
    def __init__(self, plan: TaskPlan, spec: dict[str, Any], *, dag_id: str, group: str | None, pools: str,
                 builder_modules: list[str], pods: ShardPods | None = None) -> None:
        self.plan = plan
        self.pods = pods
        self.group = group
        self.selection = selection_id(dag_id, group)
        self.spec = spec
        self.pools = pools
        self.builder_modules = builder_modules
        self.ops: dict[str, Any] = {}
        self.containers: dict[str, TaskGroup] = {}

    def render(self) -> None:
        for spec in self.plan.tasks:
            self.ops[spec.task_id] = self._operator(spec)

    def _common(self, spec: TaskSpec) -> dict[str, Any]:
        return {"task_id": spec.task_id.rsplit(".", 1)[-1], "store": self.spec["store"], "selection": self.group,
                "priority_weight": spec.priority_weight, "weight_rule": "absolute", "trigger_rule": spec.trigger_rule,
                **({"pool": spec.pool} if spec.pool else {}), **({"queue": spec.queue} if spec.queue else {}),
                **self._pod(spec)}

    def _pod(self, spec: TaskSpec) -> dict[str, Any]:
        """A shard's stage and train tasks as pods on its volume (and, training, its GPUs); else nothing."""
        if self.pods is None or spec.kind not in ("stage", "train"):
            return {}
        pod = self.pods.pod(spec.args["shard"], train=spec.kind == "train", slots=self.plan.slots)
        return {"executor_config": executor_config(pod),
                **({"executor": self.pods.executor} if self.pods.executor else {})}

    def _operator(self, spec: TaskSpec) -> Any:
        kwargs = {**self._common(spec), **{k: v for k, v in spec.args.items()}}
        container = self._container(spec.task_id.rpartition(".")[0])
        if container is not None:
            kwargs["task_group"] = container
        if spec.kind == "preflight":
            kwargs.pop("store")
            op = MopPreflightOperator(spec=self.spec, pools=self.pools,
                                      builder_modules=self.builder_modules, **kwargs)
        elif spec.kind == "plan":
            op = MopPlanOperator(priority=self.plan.priority, **kwargs)
        elif spec.kind == "train":  # one shard slot of a block: it reads what the block trains as it starts
            slot = f" slot {spec.args['slot']}" if self.plan.slots > 1 else ""
            op = MopTrainShardOperator(slots=self.plan.slots, shards=self.plan.shards, priority=self.plan.priority,
                                       task_display_name=f"train on shard {spec.args['shard']}{slot}", **kwargs)
        elif spec.kind == "publish":  # its outlet: the Asset downstream DAGs schedule on
            op = MopPublishOperator(outlets=[champion_asset(self.selection)], **kwargs)
        elif spec.kind == "scatter":  # one instance per slice of files that list_data returns
            op = MopScatterOperator.partial(map_index_template="slice {{ task.slice_index }}", **kwargs).expand(
                slice_index=self.ops[spec.upstream[0]].output)
        else:
            op = OPERATORS[spec.kind](**kwargs)
        for up in spec.upstream:
            self.ops[up] >> op
        return op

    def _container(self, path: str, label: str | None = None) -> TaskGroup | None:
        """The task group ``path`` names (``block_2``) and its parents, made on first use;
        ``label`` names the innermost one when it is not a block."""
        parts = path.split(".") if path else []
        parent = None
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            if prefix not in self.containers:
                label, tooltip = (label, "") if depth == len(parts) and label else self._describe(parts[:depth])
                kwargs = {"parent_group": parent} if parent is not None else {}
                self.containers[prefix] = TaskGroup(group_id=parts[depth - 1], group_display_name=label,
                                                    tooltip=tooltip, **kwargs)
            parent = self.containers[prefix]
        return parent

    def _describe(self, parts: list[str]) -> tuple[str, str]:
        """A block's label and tooltip: block k (1 is the first) of a run holding several."""
        k = int(parts[0].split("_")[1])
        return (f"block {k + 1}", f"Block {k + 1}: every configuration the decision after block {k} kept trains to "
                                  "the next decision point (a rung's end, a PBT boundary); then the next decision")
