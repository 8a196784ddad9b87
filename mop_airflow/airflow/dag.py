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
from mop_airflow.airflow.shard_pods import ShardPods
from mop_airflow.planning.schedule import DEFAULT_PRIORITY
from mop_airflow.search.adaptive import brackets_of, decision_points
from mop_airflow.search.asha import AshaPlan
from mop_airflow.search.pbt import PbtPlan
from mop_airflow.config import MopSpec
from mop_airflow.planning.task_plan import configuration_count, spec_task_plan
from mop_airflow.config.form import form_fields, rung_iterations

def _params(spec: MopSpec) -> dict[str, Param]:
    """The trigger form: typed fields from the spec (:mod:`mop_airflow.config.form`), defaults = the spec."""
    return {f.name: Param(copy.deepcopy(f.default), **copy.deepcopy(dict(f.schema)))
            for f in form_fields(spec).values()}


def _description(spec: MopSpec, plan: Any = None) -> str:
    """What the DAG does, in a line, with how many blocks one run holds (a search decided between blocks)."""
    text = _what(spec)
    decides = [t for t in (plan.tasks if plan is not None else ()) if t.kind == "decide"]
    if decides and (len(decides) > 1 or decides[-1].args.get("whole")):
        held = (f"all {len(decides)} in one DAG run" if decides[-1].args.get("whole")
                else f"{len(decides)} blocks a DAG run")
        return text.replace("one block a DAG run", held)
    return text


def _what(spec: MopSpec) -> str:
    p, schedule = spec.schedule.shards, spec.schedule
    adaptive = spec.adaptive_plan()
    if adaptive is None:
        space = spec.search.space
        count = configuration_count(spec)
        return (f"{space.method.capitalize()} search, {count} configurations by default; models hop across {p} "
                f"shards for {schedule.iterations} iteration(s) of {schedule.epochs_per_hop} epoch(s) per hop")
    space = spec.search.space
    if space.sampler == "tpe" and spec.search.adaptive is None:
        return (f"Model-based random search (TPE): {space.num_samples} configurations, the first "
                f"{min(space.startup, space.num_samples)} drawn at random, each later one proposed from the results; "
                f"each trains {schedule.iterations} iteration(s), decided between blocks (a wave each), one block a "
                f"DAG run; models hop across {p} shards")
    if isinstance(adaptive, AshaPlan):
        how = (f"decided between blocks, each ending where one of its jobs ends; TPE proposes the configurations "
               f"after the first {space.startup}" if space.sampler == "tpe" else
               "decided inside the shard slots, one block in one DAG run")
        return (f"ASHA n={adaptive.n}, r={adaptive.r}, R={adaptive.R}, eta={adaptive.eta}: rungs at "
                f"{', '.join(map(str, adaptive.rungs))} iteration(s), {how}; models hop across {p} shards")
    if isinstance(adaptive, PbtPlan):
        return (f"Population-based training: {adaptive.population} members for {adaptive.iterations} iteration(s); "
                f"every {adaptive.interval} the bottom {adaptive.in_quantile()} copy the top {adaptive.in_quantile()} "
                f"and explore {', '.join(sorted(adaptive.mutations))}, one block per interval in one DAG run; "
                f"models hop across {p} shards")
    brackets = brackets_of(adaptive)
    eta = brackets[0].eta
    named = (f"Hyperband R={adaptive.R}, eta={eta}" if spec.search.adaptive["method"] == "hyperband"
             else f"Successive halving n={brackets[0].n}, r={brackets[0].r}, eta={eta}")
    named += f", one block per rung end ({', '.join(map(str, decision_points(adaptive)))}) in one DAG run"
    return (f"{named}: "
            f"{adaptive.total_configurations} configurations in {len(brackets)} bracket(s), trained "
            f"{' or '.join(', '.join(rung_iterations(adaptive)).rsplit(', ', 1))} iteration(s) (each rung keeps "
            f"the best 1/{eta}); models hop across {p} shards")


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

    ``priority`` picks the rule by which a free shard slot chooses among waiting configurations
    (:data:`mop_airflow.planning.schedule.PRIORITY_RULES`).

    A trigger conf may name model builders only from ``builder_modules`` (modules or packages);
    by default those are the modules the spec's own builders come from, so a conf cannot make the
    workers import arbitrary code.

    ``kubernetes`` (a :class:`~mop_airflow.airflow.shard_pods.ShardPods` or a dict of its fields) runs each
    shard's stage and train tasks as pods through ``executor_config`` pod overrides: on the shard's
    volume, a train pod with its slot's GPUs (docs/how-to/kubernetes.md). Left out, tasks carry no
    executor settings and run wherever the deployment's executor puts them.
    """
    spec = spec if isinstance(spec, MopSpec) else MopSpec.from_dict(spec)
    plan = spec_task_plan(spec, priority)
    p, slots = spec.schedule.shards, spec.schedule.slots_per_shard
    dag = DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=start_date or dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
        catchup=catchup,
        tags=list(tags or ["mop_airflow"]),
        default_args={**RETRIES, **(default_args or {})},
        params=_params(spec),
        description=description or _description(spec, plan),
        max_active_runs=dag_kwargs.pop("max_active_runs", 1),
        # Airflow's default of 16 running tasks per run would idle shard slots past 16 of them;
        # the extra room is for the control tasks (deal, promote) running beside the hops.
        max_active_tasks=dag_kwargs.pop("max_active_tasks", max(16, p * slots + p + 2)),
        **dag_kwargs,
    )
    with dag:
        render_selection(spec, plan, dag=dag, pools=pools, builder_modules=builder_modules, kubernetes=kubernetes)
    return dag
