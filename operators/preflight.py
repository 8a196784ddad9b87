"""First task of a run: resolve the run's spec and check what would otherwise fail late.

Checks the per-run overrides, that the search space is not empty, that every model builder's module
can be found (without importing it: that would import TensorFlow here), and that the shard pools
exist, since Airflow never schedules a task whose pool is missing.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from mop_airflow.errors import SpecError
from mop_airflow.pools import check_pools, required_pools

from mop_airflow.operators.base import MopBaseOperator


class MopPreflightOperator(MopBaseOperator):
    def __init__(self, *, check_pools: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check_pools = check_pools

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.effective_spec(context)
        configs = spec.configurations()
        if not configs:
            raise SpecError("search.space", spec.search.space.to_dict(), "expands to no configuration",
                            "list at least one value for every searched parameter")
        for path in sorted({c["model"] for c in configs}):
            module = path.split(":", 1)[0]
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                raise SpecError("search.space.params.model", path, f"module {module!r} is not importable on this worker",
                                "install the module on every worker (or put it next to the DAG file) and check the spelling")
        pools = required_pools(spec.schedule.shards)
        if self.check_pools:
            check_pools(pools, shards=spec.schedule.shards, slots=spec.schedule.slots_per_shard)
        self.log.info("%d configurations, %d shards, %d iterations; pools %s", len(configs),
                      spec.schedule.shards, spec.schedule.iterations, ", ".join(pools))
        return {"configurations": len(configs), "pools": pools, "pools_checked": self.check_pools}
