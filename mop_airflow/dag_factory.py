"""Spec -> Airflow DAG: the one core module that imports Airflow.

Shape (depends only on ``schedule.shards`` and ``schedule.iterations``)::

    preflight >> validate >> shard >> plan >> stage_shard_<s>
    iteration_<i>.hop_<k>.shard_<s>   (one MOP training task per shard and hop, mapped over the
                                      configurations on that shard; pool and queue mop_shard_<s>)
    ... >> report

At global hop ``t`` the group on shard ``s`` is the one that was on shard ``s - 1`` at ``t - 1``
(see :mod:`mop_airflow.schedule`), so each training task expands over exactly one upstream
task's output: it waits for the models it receives and nothing else. Building the DAG is plain
data work (no TensorFlow, no Great Expectations), so the file parses in well under a second.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Mapping

from airflow.sdk import DAG, Param, TaskGroup

from mop_airflow.operators.data import MopShardOperator, MopValidateDataOperator
from mop_airflow.operators.plan import MopPlanOperator, MopStageShardOperator
from mop_airflow.operators.preflight import MopPreflightOperator
from mop_airflow.operators.promote import MopPromoteOperator
from mop_airflow.operators.report import MopReportOperator
from mop_airflow.operators.train import MopTrainHopOperator
from mop_airflow.pools import shard_pool, shard_queue
from mop_airflow.schedule import upstream_shard
from mop_airflow.search.adaptive import brackets_of, rung_spans
from mop_airflow.spec import MopSpec


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


def build_mop_dag(
    spec: MopSpec | Mapping[str, Any],
    *,
    dag_id: str,
    schedule: Any = None,
    start_date: dt.datetime | None = None,
    catchup: bool = False,
    tags: list[str] | None = None,
    default_args: Mapping[str, Any] | None = None,
    check_pools: bool = True,
    description: str | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the MOP model-selection DAG for ``spec``.

    ``check_pools=False`` skips the REST-API pool check of the first task (for ``dag.test()`` or
    deployments whose pools are managed elsewhere).
    """
    spec = spec if isinstance(spec, MopSpec) else MopSpec.from_dict(spec)
    spec_dict = spec.to_dict()
    p, iterations = spec.schedule.shards, spec.schedule.iterations
    args = {"retries": 0, **(default_args or {})}
    dag = DAG(
        dag_id=dag_id,
        schedule=schedule,
        start_date=start_date or dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
        catchup=catchup,
        tags=list(tags or ["mop_airflow"]),
        default_args=args,
        params=_params(spec),
        description=description or f"MOP model selection: {p} shards x {iterations} iterations",
        max_active_runs=dag_kwargs.pop("max_active_runs", 1),
        **dag_kwargs,
    )
    with dag:
        common = {"spec": spec_dict}
        preflight = MopPreflightOperator(task_id="preflight", check_pools=check_pools, **common)
        validate = MopValidateDataOperator(task_id="validate", **common)
        shard = MopShardOperator(task_id="shard", **common)
        plan = MopPlanOperator(task_id="plan", **common)
        preflight >> validate >> shard >> plan
        adaptive = spec.adaptive_plan()
        if adaptive is None:
            finals = list(_hops(_stages(plan, p, common), 0, iterations * p, p, common).values())
        else:
            finals = _adaptive(adaptive, plan, p, common)
        report = MopReportOperator(task_id="report", trigger_rule="none_failed_min_one_success", **common)
        for task in finals:
            task >> report
    return dag


def _stages(gate: Any, p: int, common: Mapping[str, Any], t0: int = 0, bracket: int | None = None,
            rung: int = 0) -> dict[int, Any]:
    """One stage task per shard, on that shard's pool and queue, after ``gate``."""
    stages = {}
    for s in range(p):
        stages[s] = MopStageShardOperator(task_id=f"stage_shard_{s}", shard=s, t0=t0, bracket=bracket, rung=rung,
                                          pool=shard_pool(s), queue=shard_queue(s), **common)
        gate >> stages[s]
    return stages


def _hops(sources: dict[int, Any], start: int, end: int, p: int, common: Mapping[str, Any], *,
          rung_end: bool = False, prune_failures: bool = False) -> dict[int, Any]:
    """Training tasks for global hops ``start``..``end - 1``; returns the last hop's task per shard.

    At hop ``start`` shard ``s`` trains what ``sources[s]`` emits; afterwards the group on shard ``s``
    is the one that was on shard ``s - 1`` a hop earlier.
    """
    previous = sources
    for i in range(start // p, -(-end // p)):
        with TaskGroup(group_id=f"iteration_{i}", tooltip=f"iteration {i}: every configuration visits every shard"):
            for t in range(max(start, i * p), min(end, (i + 1) * p)):
                k = t - i * p
                with TaskGroup(group_id=f"hop_{k}", tooltip=f"sub-epoch {k} of iteration {i} (global hop {t})"):
                    current = {}
                    for s in range(p):
                        source = previous[s] if t == start else previous[upstream_shard(s, p)]
                        current[s] = MopTrainHopOperator.partial(
                            task_id=f"shard_{s}", t=t, shard=s, pool=shard_pool(s), queue=shard_queue(s),
                            rung_end=rung_end and t == end - 1, prune_failures=prune_failures,
                            # a pruned or failed configuration's skipped hop must not skip its group-mates
                            trigger_rule="none_failed_min_one_success" if prune_failures else "all_success",
                            map_index_template="{{ task.assignment['config_id'] }}", **common,
                        ).expand(assignment=source.output)
                previous = current
    return previous


def _adaptive(plan_obj: Any, plan_task: Any, p: int, common: Mapping[str, Any]) -> list[Any]:
    """Brackets side by side (they share the shard pools); rungs joined by branching promote tasks."""
    finals: list[Any] = []
    for bracket in brackets_of(plan_obj):
        with TaskGroup(group_id=f"bracket_{bracket.s}", tooltip=f"bracket s={bracket.s}: {bracket.n} configurations"):
            gate = plan_task
            spans = rung_spans(bracket)
            for span in spans:
                with TaskGroup(group_id=f"rung_{span.i}",
                               tooltip=f"rung {span.i}: {span.n_i} configurations up to hop {span.end}"):
                    stages = _stages(gate, p, common, t0=span.start, bracket=bracket.s, rung=span.i)
                    last = _hops(stages, span.start, span.end, p, common, rung_end=True, prune_failures=True)
                    if span.last:
                        finals.extend(last.values())
                        continue
                    nxt = f"bracket_{bracket.s}.rung_{span.i + 1}"
                    promote = MopPromoteOperator(
                        task_id="promote", bracket=bracket.s, rung=span.i, start=span.start, end=span.end,
                        keep=span.keep, next_stage_ids=[f"{nxt}.stage_shard_{s}" for s in range(p)],
                        trigger_rule="none_failed", **common)
                    for task in last.values():
                        task >> promote
                    gate = promote
    return finals
