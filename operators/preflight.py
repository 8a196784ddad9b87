"""First task of a run: resolve the run once and check what would otherwise fail late.

Applies the trigger conf, expands the search space, finds every model builder's module and makes
sure the shard pools exist (Airflow never schedules a task whose pool is missing). The resolved
run record goes to XCom; the plan task writes it to the store once the data has passed validation,
so a run with bad input leaves nothing in the store.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mop_airflow.airflow.pools import POOL_MODES, ensure_pools, required_pools
from mop_airflow.errors import SpecError
from mop_airflow.resolve import resolve_run, with_warm_start

from mop_airflow.operators.base import MopBaseOperator


def running_in_dag_test() -> bool:
    """True inside ``dag.test()`` / ``airflow dags test``: tasks run one by one in that process and
    no scheduler, hence no pool, ever holds them back; there may be no REST API to ask either."""
    try:
        from airflow.sdk.execution_time import task_runner  # noqa: PLC0415
        from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms  # noqa: PLC0415
    except ImportError:  # another Airflow layout: assume a real deployment and check
        return False
    return isinstance(getattr(task_runner, "SUPERVISOR_COMMS", None), InProcessSupervisorComms)


class MopPreflightOperator(MopBaseOperator):
    def __init__(self, *, spec: Mapping[str, Any], pools: str = "create",
                 builder_modules: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(store=spec["store"], **kwargs)
        if pools not in POOL_MODES:
            raise SpecError("pools", pools, f"must be one of {list(POOL_MODES)}",
                            "pass build_mop_dag(pools='create'), 'check' or 'off'")
        self.spec = dict(spec)
        self.pools = pools
        self.builder_modules = None if builder_modules is None else list(builder_modules)

    def work(self, context: Any) -> dict[str, Any]:
        # The trigger conf as given (the form sends its sections, the REST API and CLI what they name);
        # params would also hold the DAG's defaults and hide a misspelt section.
        conf = getattr(context.get("dag_run"), "conf", None)
        run = with_warm_start(resolve_run(self.spec, conf, dag_id=context["dag"].dag_id, run_id=context["run_id"],
                                          allowed_modules=self.builder_modules))
        if run.warm_start:
            sources = sorted({f"{w['run_id']}/{w['config_id']}" for w in run.warm_start.values()})
            self.log.info("%d of %d configurations start warm from %s", len(run.warm_start), len(run.configs),
                          ", ".join(sources))
        schedule = run.schedule
        pools = required_pools(schedule.shards)
        if self.pools != "off" and running_in_dag_test():
            self.log.info("dag.test(): tasks run one at a time in this process, pools are not used; not checked")
        else:
            created = ensure_pools(pools, shards=schedule.shards, slots=schedule.slots_per_shard, mode=self.pools)
            if created:
                self.log.info("created pools %s with %d slot(s) each", ", ".join(created), schedule.slots_per_shard)
        # an adaptive search's iterations are its rungs' (search.adaptive), not schedule.iterations
        length = (f"search.adaptive {dict(run.adaptive)}" if run.adaptive
                  else f"{schedule.iterations} iterations")
        self.log.info("%d configurations, %d shards, %s; pools %s", len(run.configs), schedule.shards, length,
                      ", ".join(pools))
        return run.to_dict()
