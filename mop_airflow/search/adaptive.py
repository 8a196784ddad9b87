"""Adaptive search in a spec: ``search.adaptive`` -> a Hyperband or successive-halving plan.

    "adaptive": {"method": "hyperband", "R": 9, "eta": 3}               # rounding, skip_last optional
    "adaptive": {"method": "successive_halving", "n": 9, "r": 1, "eta": 3}  # rungs optional
    "adaptive": {"method": "asha", "n": 64, "r": 1, "R": 27, "eta": 3}
    "adaptive": {"method": "pbt", "population": 8, "iterations": 12, "interval": 2, "mutations": {...}}

Hyperband's and successive halving's plan fixes the DAG's shape (brackets, rungs, hops), so like
``schedule.shards`` it cannot change per run. Each bracket draws its own configurations from the
(random) search space. ASHA (:mod:`mop_airflow.search.asha`) is decided between blocks of hops, one
block a DAG run, so its DAG holds one block whatever ``n`` and ``R`` are; so is population-based
training (:mod:`mop_airflow.search.pbt`), whose blocks a small search holds all in one run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from mop_airflow.errors import SpecError, unknown_key
from mop_airflow.search.asha import OPTIONS as ASHA_OPTIONS
from mop_airflow.search.asha import AshaPlan, asha_plan
from mop_airflow.search.hyperband import Bracket, HyperbandPlan, hyperband_plan, successive_halving
from mop_airflow.search.pbt import OPTIONS as PBT_OPTIONS
from mop_airflow.search.pbt import PbtPlan, pbt_plan

_KEYS = {
    "hyperband": {"R", "eta", "rounding", "skip_last", "allow_partial_iterations", "between_runs"},
    "successive_halving": {"n", "r", "eta", "rungs", "allow_partial_iterations", "between_runs"},
    "asha": set(ASHA_OPTIONS),
    "pbt": set(PBT_OPTIONS),
}
# Searches with no brackets: one ladder of rungs (ASHA) or one population (PBT), always decided between blocks.
LADDERS = (AshaPlan, PbtPlan)


def adaptive_plan(adaptive: Mapping[str, Any], shards: int, space_params: Mapping[str, Any] | None = None
                  ) -> HyperbandPlan | Bracket | AshaPlan | PbtPlan:
    """Validate ``search.adaptive`` and return its plan for ``shards`` shards (``space_params``: the
    search space's params, which PBT's mutations must be part of)."""
    if not isinstance(adaptive, Mapping):
        raise SpecError("search.adaptive", adaptive, "must be a mapping",
                        "use e.g. {'method': 'hyperband', 'R': 9, 'eta': 3}")
    method = adaptive.get("method")
    if method not in _KEYS:
        raise SpecError("search.adaptive.method", method, f"must be one of {sorted(_KEYS)}",
                        "use 'hyperband' (several brackets), 'successive_halving' (one bracket), 'asha' "
                        "(asynchronous successive halving) or 'pbt' (population-based training)")
    unknown_key("search.adaptive", {k: v for k, v in adaptive.items() if k != "method"}, _KEYS[method],
                what=f"an option of {method}")
    options = {k: v for k, v in adaptive.items() if k != "method"}
    if method == "asha":
        return asha_plan(options)
    if method == "pbt":
        return pbt_plan(options, space_params)
    between = options.pop("between_runs", "auto")
    if between not in (True, False, "auto"):
        raise SpecError("search.adaptive.between_runs", between, "must be true, false or \"auto\"",
                        "leave it out (\"auto\": decided between DAG runs when the rungs would hold more than "
                        f"{STATIC_HOP_TASKS} class-hops), or true / false to choose")
    plan = _halving_plan(method, options, shards)
    return plan if between == "auto" else dataclasses.replace(plan, between_runs=between)


def effective_adaptive(adaptive: Mapping[str, Any] | None, space: Mapping[str, Any],
                       iterations: int) -> dict[str, Any] | None:
    """``search.adaptive`` as written, or, for a model-based random search without one
    (``space.sampler="tpe"``), the one-rung ASHA it runs as: every configuration trains all
    ``iterations``, and a new one is proposed whenever one finishes, until ``num_samples`` have started."""
    if adaptive is None and space.get("sampler") == "tpe":
        return {"method": "asha", "n": space.get("num_samples"), "r": iterations, "R": iterations}
    return None if adaptive is None else dict(adaptive)


def _halving_plan(method: str, options: dict[str, Any], shards: int) -> HyperbandPlan | Bracket:
    if method == "hyperband":
        if "R" not in options:
            raise SpecError("search.adaptive.R", None, "is required", "set R, the most iterations a configuration trains")
        return hyperband_plan(options.pop("R"), options.pop("eta", 3), shards=shards, **options)
    if "n" not in options:
        raise SpecError("search.adaptive.n", None, "is required", "set n, the configurations the bracket starts with")
    return successive_halving(options.pop("n"), options.pop("r", 1), options.pop("eta", 3), options.pop("rungs", None),
                              shards=shards, **options)


def brackets_of(plan: HyperbandPlan | Bracket | AshaPlan | PbtPlan) -> tuple[Bracket, ...]:
    """Hyperband's brackets, successive halving's one; ASHA (one ladder of rungs, no barrier) and PBT
    (one population) have none."""
    if isinstance(plan, LADDERS):
        return ()
    return plan.brackets if isinstance(plan, HyperbandPlan) else (plan,)


# How large a Hyperband or successive-halving search may be and still be drawn into one DAG run, in
# class-hops (each offset class's hops, rung by rung; what the DAG drew as hop tasks before a rung
# became one train task per shard slot): R=9, eta=3 on 4 shards holds 244 and stays in one run
# (dag.test() runs it); R=27 on 4 shards would hold 1,128, R=81 on 16 shards 23,040. Drawn rungs run
# one block after another, so past this size deciding between blocks keeps the slots fuller.
STATIC_HOP_TASKS = 600


def drawn_hop_tasks(plan: HyperbandPlan | Bracket) -> int:
    """The class-hops of the brackets' rungs drawn into one DAG run (one per offset class and hop)."""
    return sum(min(b.shards, rung.n_i) * rung.new_hops for b in brackets_of(plan) for rung in b.rungs)


def decided_between_blocks(plan: Any) -> bool:
    """Whether the search is decided between blocks of hops (one block a DAG run, or all of a small
    PBT or TPE search in one) rather than drawn
    into the DAG's shape: always for ASHA, and for Hyperband or successive halving whose rungs
    would hold more than ``STATIC_HOP_TASKS`` class-hops. PBT too: its copies are decided as it trains."""
    if plan is None or isinstance(plan, LADDERS):
        return plan is not None
    if plan.between_runs is not None:  # the spec chose
        return plan.between_runs
    return drawn_hop_tasks(plan) > STATIC_HOP_TASKS


def most_blocks(plan: Any, capacity: int) -> int | None:
    """The most blocks of one iteration a search decided between blocks can take, where that is known
    up front: PBT's ``iterations``; a one-rung ASHA's (a model-based random search) waves of
    ``capacity`` configurations trained ``R`` iterations each (a configuration that stops early only
    lets the next one start sooner); an ASHA budget's deadline. None for ASHA with promotions and no
    budget, and for Hyperband."""
    if isinstance(plan, PbtPlan):
        return plan.iterations
    if not isinstance(plan, AshaPlan):
        return None
    bounds = [-(-plan.n // max(1, capacity)) * plan.R] if len(plan.rungs) == 1 else []
    if plan.budget is not None:  # nothing begins a leg it cannot end by the budget's last block
        bounds.append(plan.budget // max(1, capacity))
    return min(bounds) if bounds else None


@dataclass(frozen=True)
class RungSpan:
    """Rung ``i`` of bracket ``s`` trains its configurations from global hop ``start`` to ``end`` (exclusive)."""

    s: int
    i: int
    n_i: int
    keep: int
    start: int
    end: int
    last: bool


def rung_spans(bracket: Bracket) -> list[RungSpan]:
    spans, start = [], 0
    for k, rung in enumerate(bracket.rungs):
        spans.append(RungSpan(s=bracket.s, i=rung.i, n_i=rung.n_i, keep=rung.keep, start=start, end=rung.hops_i,
                              last=k == len(bracket.rungs) - 1))
        start = rung.hops_i
    return spans


def split_by_bracket(config_ids: list[str], plan: HyperbandPlan | Bracket) -> dict[int, list[str]]:
    """Bracket ``s`` takes the next ``n`` configurations of the seeded draw, in bracket order."""
    out, offset = {}, 0
    for bracket in brackets_of(plan):
        out[bracket.s] = config_ids[offset:offset + bracket.n]
        offset += bracket.n
    return out
