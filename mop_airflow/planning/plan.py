"""The hop plan of a resolved run: a plain search's configurations dealt into offset classes, each
class lined up in the order its shard slots take it; an adaptive search's brackets, whose blocks are
decided as it trains.

The plan task calls :func:`make_plan` once; later tasks read :class:`~mop_airflow.records.Plan`
from the store; an adaptive search's block decisions (:mod:`mop_airflow.planning.blocks`) deal each
rung's members with :func:`rung_classes`.
"""

from __future__ import annotations

from mop_airflow.planning.lineup import deal_configs, deal_groups, line_up
from mop_airflow.planning.fusing import fuse_limit, groups_of
from mop_airflow.planning.schedule import DEFAULT_PRIORITY, hash_seed, visit_order
from mop_airflow.records import Plan, RunRecord
from mop_airflow.search.adaptive import LADDERS, adaptive_plan, brackets_of, in_slots, split_by_bracket
from mop_airflow.search.asha import AshaPlan
from mop_airflow.search.pbt import PbtPlan


def make_plan(run: RunRecord, priority: str = DEFAULT_PRIORITY, *, rows: int | None = None) -> Plan:
    """Deal the configurations into offset classes (a plain search) or brackets (an adaptive one),
    each class lined up by model (:mod:`mop_airflow.planning.lineup`); ``rows`` is a shard's row
    count (for the cost estimate; unknown before the data is sharded)."""
    schedule = run.schedule
    p, seed = schedule.shards, schedule.seed
    ids = [c["config_id"] for c in run.configs]
    if run.adaptive is None:
        classes = deal_run(run, ids, rows=rows, seed=seed)
        end = schedule.iterations * p
        return Plan(shards=p, iterations=schedule.iterations, seed=seed, priority=priority,
                    model_hops_total=len(ids) * end, classes=classes,
                    visit_order=visit_order(classes, start=0, end=end, shards=p),
                    lineup=lineup_classes(run, classes, rows=rows), shard_rows=rows)
    # no classes up front: the plan task decides block 0 and each block's decide step the next
    adaptive = adaptive_plan(run.adaptive, p)
    asha = isinstance(adaptive, LADDERS)  # no brackets: ASHA's ladder, PBT's population
    longest = adaptive.max_iterations if asha else max(b.rungs[-1].hops_i for b in brackets_of(adaptive)) // p
    return Plan(shards=p, iterations=longest, seed=seed, priority=priority,
                model_hops_total=_expected_iterations(adaptive) * p if asha else adaptive.total_hops,
                adaptive={**adaptive.to_dict(), "decided": "blocks",
                          **({"in_slots": True} if in_slots(adaptive, run.spec["search"]["space"].get("sampler")) else {})},
                brackets={} if asha else {str(s): m for s, m in split_by_bracket(ids, adaptive).items()},
                shard_rows=rows)


# A shard's rows when the data is not sharded yet (a provisional plan): only the costs' ratios matter then.
ROWS_UNKNOWN = 1000


def lineup_classes(run: RunRecord, classes: list[list[str]], *, rows: int | None) -> list[list[str]]:
    """``classes`` in the order their shard slots take them (:func:`mop_airflow.planning.lineup.line_up`)."""
    return line_up(classes, {c["config_id"]: c for c in run.configs}, rows=rows or ROWS_UNKNOWN)


def deal_run(run: RunRecord, config_ids: list[str], *, rows: int | None, seed: int) -> list[list[str]]:
    """``config_ids`` of ``run`` dealt into offset classes (:func:`mop_airflow.planning.lineup.deal`); with
    ``schedule.fuse``, each group that may train fused whole in one class (:func:`~mop_airflow.planning.lineup.deal_groups`)."""
    if fuse_limit(run.schedule.fuse) > 1:
        return deal_groups(groups_of(run, config_ids), shards=run.schedule.shards, seed=seed)
    return deal_configs(config_ids, {c["config_id"]: c for c in run.configs}, rows=rows or ROWS_UNKNOWN,
                        shards=run.schedule.shards, seed=seed)


def rung_classes(run: RunRecord, config_ids: list[str], *, rows: int | None, seed: int, bracket: int,
                 rung: int) -> list[list[str]]:
    """The offset classes of one rung of an adaptive search (survivors are dealt again at every rung,
    so a rung of few configurations still spreads over the shards)."""
    return deal_run(run, config_ids, rows=rows, seed=hash_seed(seed, bracket, rung))


def _expected_iterations(plan: AshaPlan | PbtPlan) -> int:
    return plan.expected_iterations() if isinstance(plan, AshaPlan) else plan.halving_iterations()
