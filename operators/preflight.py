"""First task of a run: resolve the run once and check what would otherwise fail late.

Applies the trigger conf, expands the search space, finds every model builder's module and checks
that the shard pools exist (Airflow never schedules a task whose pool is missing). The resolved
run record goes to XCom; the plan task writes it to the store once the data has passed validation,
so a run with bad input leaves nothing in the store.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mop_airflow.airflow.pools import check_pools, required_pools
from mop_airflow.resolve import resolve_run

from mop_airflow.operators.base import MopBaseOperator


class MopPreflightOperator(MopBaseOperator):
    def __init__(self, *, spec: Mapping[str, Any], check_pools: bool = True,
                 builder_modules: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(store=spec["store"], **kwargs)
        self.spec = dict(spec)
        self.check_pools = check_pools
        self.builder_modules = None if builder_modules is None else list(builder_modules)

    def work(self, context: Any) -> dict[str, Any]:
        # The trigger conf as given (the form sends its sections, the REST API and CLI what they name);
        # params would also hold the DAG's defaults and hide a misspelt section.
        conf = getattr(context.get("dag_run"), "conf", None)
        run = resolve_run(self.spec, conf, dag_id=context["dag"].dag_id, run_id=context["run_id"],
                          allowed_modules=self.builder_modules)
        schedule = run.schedule
        pools = required_pools(schedule.shards)
        if self.check_pools:
            check_pools(pools, shards=schedule.shards, slots=schedule.slots_per_shard)
        self.log.info("%d configurations, %d shards, %d iterations; pools %s", len(run.configs),
                      schedule.shards, schedule.iterations, ", ".join(pools))
        return run.to_dict()
