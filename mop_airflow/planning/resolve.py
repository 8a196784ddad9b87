"""Resolve a run once: the effective spec and its configurations, as a typed record.

The first task of a run calls :func:`resolve_run` (trigger conf applied, search space expanded,
every model builder's module found); the plan task then calls
:func:`mop_airflow.planning.plan.make_plan`. Nothing later expands the search space: it reads
:class:`~mop_airflow.records.RunRecord` from the store.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
from typing import Any, Mapping, Sequence

from mop_airflow.errors import SpecError
from mop_airflow.records import RunRecord
from mop_airflow.config import MopSpec
from mop_airflow.config.trigger import apply_conf

def resolve_run(spec: MopSpec | Mapping[str, Any], conf: Any, *, dag_id: str, run_id: str,
                allowed_modules: Sequence[str] | None = None) -> RunRecord:
    """The run's effective spec (the trigger ``conf`` applied to the DAG's spec, see
    :func:`~mop_airflow.config.trigger.apply_conf`) and configurations.

    Fails with a :class:`SpecError` before anything trains: a conf key that is neither a field of
    the DAG's trigger form nor a spec section (a misspelt key is an error, not silently ignored), a
    bad value, a field and JSON overrides that set the same thing, an empty search
    space, a model builder whose module cannot be found on this worker (found without importing
    it, which would import TensorFlow here).
    """
    spec = spec if isinstance(spec, MopSpec) else MopSpec.from_dict(spec)
    effective = apply_conf(spec, conf)
    configs = effective.configurations()
    if not configs:
        raise SpecError("search.space", effective.search.space.to_dict(), "expands to no configuration",
                        "list at least one value for every searched parameter")
    for path in sorted({c["model"] for c in configs}):
        module = path.split(":", 1)[0]
        # A builder is code the workers run: the trigger conf may only pick among the modules the
        # DAG's author allowed (a module, or a package and everything under it).
        if allowed_modules is not None and not any(module == m or module.startswith(m + ".") for m in allowed_modules):
            raise SpecError("search.space.params.model", path,
                            f"module {module!r} is not among the builder modules this DAG allows {list(allowed_modules)}",
                            "pick a builder from those modules, or have the DAG's author add the module to "
                            "build_mop_dag(builder_modules=[...])")
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise SpecError("search.space.params.model", path, f"module {module!r} is not importable on this worker",
                            "install the module on every worker (or put it next to the DAG file) and check the spelling")
    return RunRecord(dag_id=dag_id, run_id=run_id, created_at=dt.datetime.now(dt.timezone.utc).isoformat(),
                     spec=effective.to_dict(), configs=configs)
