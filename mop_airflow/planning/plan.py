"""The hop plan of a resolved run: its configurations dealt into offset classes (a plain search)
or brackets and rungs (an adaptive one), each class split into bundles.

The plan task calls :func:`make_plan` once; later tasks read :class:`~mop_airflow.records.Plan`
from the store, and the rung tasks deal survivors with :func:`rung_classes`.
"""

from __future__ import annotations

from typing import Mapping

from mop_airflow.planning.bundling import deal_configs, make_bundles
from mop_airflow.planning.schedule import DEFAULT_PRIORITY, hash_seed, visit_order
from mop_airflow.records import Plan, RunRecord
from mop_airflow.search.adaptive import LADDERS, adaptive_plan, brackets_of, decided_between_blocks, split_by_bracket
from mop_airflow.search.asha import AshaPlan
from mop_airflow.search.pbt import PbtPlan


def make_plan(run: RunRecord, priority: str = DEFAULT_PRIORITY, *, rows: int | None = None,
              chains: Mapping[str, int] | None = None) -> Plan:
    """Deal the configurations into offset classes (a plain search) or brackets (an adaptive one),
    and split every class into bundles (:mod:`mop_airflow.planning.bundling`); ``rows`` is a shard's row count
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
    adaptive = adaptive_plan(run.adaptive, p)
    if decided_between_blocks(adaptive):  # no classes up front: each block's step deals its own
        asha = isinstance(adaptive, LADDERS)  # no brackets: ASHA's ladder, PBT's population
        longest = adaptive.max_iterations if asha else max(b.rungs[-1].hops_i for b in brackets_of(adaptive)) // p
        return Plan(shards=p, iterations=longest, seed=seed, priority=priority,
                    model_hops_total=_expected_iterations(adaptive) * p if asha else adaptive.total_hops,
                    adaptive={**adaptive.to_dict(), "decided": "blocks"}, bundle_size=schedule.bundle_size,
                    brackets={} if asha else {str(s): m for s, m in split_by_bracket(ids, adaptive).items()},
                    shard_rows=rows, chains=chains)
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
    """``classes`` split into bundles by ``schedule.bundle_size`` (:func:`mop_airflow.planning.bundling.make_bundles`),
    at most ``chains[o]`` for class ``o``."""
    schedule = run.schedule
    return make_bundles(classes, {c["config_id"]: c for c in run.configs}, rows=rows or ROWS_UNKNOWN,
                        shards=schedule.shards, slots=schedule.slots_per_shard, hops=hops,
                        bundle_size=schedule.bundle_size, chains=chains)


def deal_run(run: RunRecord, config_ids: list[str], *, rows: int | None, seed: int) -> list[list[str]]:
    """``config_ids`` of ``run`` dealt into offset classes (:func:`mop_airflow.planning.bundling.deal`)."""
    return deal_configs(config_ids, {c["config_id"]: c for c in run.configs}, rows=rows or ROWS_UNKNOWN,
                        shards=run.schedule.shards, seed=seed)


def rung_classes(run: RunRecord, config_ids: list[str], *, rows: int | None, seed: int, bracket: int,
                 rung: int) -> list[list[str]]:
    """The offset classes of one rung of an adaptive search (survivors are dealt again at every rung,
    so a rung of few configurations still spreads over the shards)."""
    return deal_run(run, config_ids, rows=rows, seed=hash_seed(seed, bracket, rung))


def _expected_iterations(plan: AshaPlan | PbtPlan) -> int:
    return plan.expected_iterations() if isinstance(plan, AshaPlan) else plan.halving_iterations()
