"""Resolve a run once: the effective spec, its configurations, and the hop plan, as typed records.

The first task of a run calls :func:`resolve_run` (trigger conf applied, search space expanded,
every model builder's module found); the plan task calls :func:`make_plan`. Nothing later expands
the search space or re-derives the plan: it reads :class:`~mop_airflow.records.RunRecord` and
:class:`~mop_airflow.records.Plan` from the store.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
from typing import Any, Mapping, Sequence

from mop_airflow.errors import SpecError
from mop_airflow.records import Plan, RunRecord
from mop_airflow.schedule import DEFAULT_PRIORITY, hash_seed, visit_order
from mop_airflow.spec import MopSpec
from mop_airflow.trigger_form import apply_conf

def builder_modules(spec: MopSpec) -> list[str]:
    """The modules a DAG's own spec takes builders from: by default, the only ones a trigger conf may name."""
    return sorted({path.split(":", 1)[0] for path in spec.search.space.builders()})


def resolve_run(spec: MopSpec | Mapping[str, Any], conf: Any, *, dag_id: str, run_id: str,
                allowed_modules: Sequence[str] | None = None) -> RunRecord:
    """The run's effective spec (the trigger ``conf`` applied to the DAG's spec, see
    :func:`~mop_airflow.trigger_form.apply_conf`) and configurations.

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


def with_warm_start(run: RunRecord) -> RunRecord:
    """``run`` with the earlier run's checkpoints its configurations start from (``search.warm_start``)."""
    wanted = run.spec["search"].get("warm_start")
    if not wanted:
        return run
    from mop_airflow.store import Store  # noqa: PLC0415
    from mop_airflow.warm_start import resolve_warm_start  # noqa: PLC0415

    found = resolve_warm_start(Store.from_spec(run.store), run.dag_id, run.run_id, run.configs, wanted)
    return dataclasses.replace(run, warm_start=found)


def make_plan(run: RunRecord, priority: str = DEFAULT_PRIORITY, *, rows: int | None = None,
              chains: Mapping[str, int] | None = None) -> Plan:
    """Deal the configurations into offset classes (a plain search) or brackets (an adaptive one),
    and split every class into bundles (:mod:`mop_airflow.bundling`); ``rows`` is a shard's row count
    (for the cost estimate; unknown before the data is sharded), ``chains`` the chains the DAG
    rendered per class group (``class_0``, ``bracket_1.rung_0.class_2``): a class gets at most that
    many bundles."""
    chains = dict(chains or {})
    schedule = run.schedule
    p, seed = schedule.shards, schedule.seed
    ids = [c["config_id"] for c in run.configs]
    if run.adaptive is None:
        classes = deal_run(run, ids, rows=rows, seed=seed)
        end = schedule.iterations * p
        return Plan(shards=p, iterations=schedule.iterations, seed=seed, priority=priority,
                    model_hops_total=len(ids) * end, classes=classes,
                    visit_order=visit_order(classes, start=0, end=end, shards=p),
                    bundles=bundle_classes(run, classes, hops=end, rows=rows, chains=class_chains(chains, "", p)),
                    bundle_size=schedule.bundle_size, shard_rows=rows, chains=chains)
    from mop_airflow.search.adaptive import adaptive_plan, brackets_of, split_by_bracket  # noqa: PLC0415

    adaptive = adaptive_plan(run.adaptive, p)
    brackets = split_by_bracket(ids, adaptive)
    longest = max(b.rungs[-1].hops_i for b in brackets_of(adaptive))
    rung0 = {str(s): rung_classes(run, m, rows=rows, seed=seed, bracket=s, rung=0) for s, m in brackets.items()}
    first_hops = {str(b.s): b.rungs[0].hops_i for b in brackets_of(adaptive)}
    return Plan(shards=p, iterations=-(-longest // p), seed=seed, priority=priority,
                model_hops_total=adaptive.total_hops, brackets={str(s): m for s, m in brackets.items()},
                rung0_classes=rung0, adaptive=adaptive.to_dict(), bundle_size=schedule.bundle_size, shard_rows=rows,
                rung0_bundles={s: bundle_classes(run, classes, hops=first_hops[s], rows=rows,
                                                 chains=class_chains(chains, f"bracket_{s}.rung_0.", p))
                               for s, classes in rung0.items()}, chains=chains)


# A shard's rows when the data is not sharded yet (a provisional plan): only the costs' ratios matter then.
ROWS_UNKNOWN = 1000


def class_chains(chains: Mapping[str, int], prefix: str, shards: int) -> list[int] | None:
    """The chains of classes ``<prefix>class_0`` .. ``class_<shards - 1>`` (a class the DAG has no chain
    for gets none), or None when the DAG said nothing (a plan made outside a DAG: no cap)."""
    if not chains:
        return None
    return [chains.get(f"{prefix}class_{o}", 0) for o in range(shards)]


def bundle_classes(run: RunRecord, classes: list[list[str]], *, hops: int, rows: int | None,
                   chains: list[int] | None = None) -> list[list[list[str]]]:
    """``classes`` split into bundles by ``schedule.bundle_size`` (:func:`mop_airflow.bundling.make_bundles`),
    at most ``chains[o]`` for class ``o``."""
    from mop_airflow.bundling import make_bundles  # noqa: PLC0415

    schedule = run.schedule
    return make_bundles(classes, {c["config_id"]: c for c in run.configs}, rows=rows or ROWS_UNKNOWN,
                        shards=schedule.shards, slots=schedule.slots_per_shard, hops=hops,
                        bundle_size=schedule.bundle_size, chains=chains)


def deal_run(run: RunRecord, config_ids: list[str], *, rows: int | None, seed: int) -> list[list[str]]:
    """``config_ids`` of ``run`` dealt into offset classes (:func:`mop_airflow.bundling.deal`)."""
    from mop_airflow.bundling import deal_configs  # noqa: PLC0415

    return deal_configs(config_ids, {c["config_id"]: c for c in run.configs}, rows=rows or ROWS_UNKNOWN,
                        shards=run.schedule.shards, seed=seed)


def rung_classes(run: RunRecord, config_ids: list[str], *, rows: int | None, seed: int, bracket: int,
                 rung: int) -> list[list[str]]:
    """The offset classes of one rung of an adaptive search (survivors are dealt again at every rung,
    so a rung of few configurations still spreads over the shards)."""
    return deal_run(run, config_ids, rows=rows, seed=hash_seed(seed, bracket, rung))
