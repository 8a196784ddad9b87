"""Spec -> a whole Airflow DAG of one model selection: the DAG's arguments, its trigger form and
description around the operators :mod:`mop_airflow.airflow.render` instantiates from the task plan.
A selection placed inside any DAG is :class:`mop_airflow.airflow.group.MopTaskGroup`.
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any, Mapping, Sequence

from airflow.sdk import DAG, Param

from mop_airflow.airflow.render import RETRIES, champion_asset, render_selection
from mop_airflow.deployment.shard_pods import ShardPods
from mop_airflow.planning.schedule import DEFAULT_PRIORITY
from mop_airflow.config import MopSpec
from mop_airflow.config.form import form_fields
from mop_airflow.planning.describe import describe_search
from mop_airflow.planning.shape import dag_shape
from mop_airflow.planning.task_plan import plan_tasks


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
    kubernetes: ShardPods | Mapping[str, Any] | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the MOP model-selection DAG for ``spec``.

    Tasks retry twice with backoff (:data:`RETRIES`); pass ``default_args={"retries": 0}`` to turn it
    off. ``pools`` says what the first task does about the shard pools a run needs, through Airflow's
    REST API: ``"create"`` the missing ones, ``"check"`` they exist (fail naming the command that
    creates them), or ``"off"`` (deployments whose pools are managed elsewhere). ``dag.test()`` and
    ``airflow dags test`` never use pools, so nothing is checked there.

    ``priority`` picks the rule by which a shard slot chooses among the configurations ready to train
    on it (:data:`mop_airflow.planning.schedule.PRIORITY_RULES`): ``"remaining"`` (the default) takes
    the one with the most hops still to go in the block first, which keeps the slowest chains moving;
    ``"done"`` the one furthest ahead (depth-first); ``"none"`` the plan's order. It changes when a
    configuration trains, never what it learns.

    A trigger conf may name model builders only from ``builder_modules`` (modules or packages);
    by default those are the modules the spec's own builders come from, so a conf cannot make the
    workers import arbitrary code.

    ``kubernetes`` (a :class:`~mop_airflow.deployment.shard_pods.ShardPods` or a dict of its fields) runs each
    shard's stage and train tasks as pods through ``executor_config`` pod overrides: on the shard's
    volume, a train pod with its slot's GPUs (docs/how-to/kubernetes.md). Left out, tasks carry no
    executor settings and run wherever the deployment's executor puts them.
    """
    spec = spec if isinstance(spec, MopSpec) else MopSpec.from_dict(spec)
    shape = dag_shape(spec, priority)
    plan = plan_tasks(shape)
    # the trigger form: typed fields from the spec (mop_airflow.config.form), defaults = the spec
    params = {f.name: Param(copy.deepcopy(f.default), **copy.deepcopy(dict(f.schema)))
              for f in form_fields(spec).values()}
    dag = DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=start_date or dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
        catchup=catchup,
        tags=list(tags or ["mop_airflow"]),
        default_args={**RETRIES, **(default_args or {})},
        params=params,
        description=description or describe_search(spec, shape),
        max_active_runs=dag_kwargs.pop("max_active_runs", 1),
        # Airflow's default of 16 running tasks per run would idle shard slots past 16 of them;
        # the extra room is for the control tasks (deal, promote) running beside the hops.
        max_active_tasks=dag_kwargs.pop("max_active_tasks", max(16, shape.shards * shape.slots + shape.shards + 2)),
        **dag_kwargs,
    )
    with dag:
        render_selection(spec, plan, dag=dag, pools=pools, kubernetes=kubernetes,
                         builder_modules=shape.builder_modules if builder_modules is None else builder_modules)
    return dag
