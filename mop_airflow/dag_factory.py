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
from mop_airflow.operators.report import MopReportOperator
from mop_airflow.operators.train import MopTrainHopOperator
from mop_airflow.pools import shard_pool, shard_queue
from mop_airflow.schedule import upstream_shard
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

        previous: dict[int, Any] = {}
        for s in range(p):
            stage = MopStageShardOperator(task_id=f"stage_shard_{s}", shard=s, pool=shard_pool(s),
                                          queue=shard_queue(s), **common)
            plan >> stage
            previous[s] = stage
        for i in range(iterations):
            with TaskGroup(group_id=f"iteration_{i}", tooltip=f"iteration {i}: every configuration visits every shard"):
                for k in range(p):
                    t = i * p + k
                    with TaskGroup(group_id=f"hop_{k}", tooltip=f"sub-epoch {k} of iteration {i} (global hop {t})"):
                        current = {}
                        for s in range(p):
                            # t == 0: group s starts on shard s (staged there); later it arrives from s - 1.
                            source = previous[s] if t == 0 else previous[upstream_shard(s, p)]
                            current[s] = MopTrainHopOperator.partial(
                                task_id=f"shard_{s}", t=t, shard=s, pool=shard_pool(s), queue=shard_queue(s),
                                map_index_template="{{ task.assignment['config_id'] }}", **common,
                            ).expand(assignment=source.output)
                        previous = current
        report = MopReportOperator(task_id="report", trigger_rule="none_failed_min_one_success", **common)
        for task in previous.values():
            task >> report
    return dag
