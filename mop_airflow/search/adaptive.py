"""Adaptive search in a spec: ``search.adaptive`` -> a Hyperband or successive-halving plan.

    "adaptive": {"method": "hyperband", "R": 9, "eta": 3}               # rounding, skip_last optional
    "adaptive": {"method": "successive_halving", "n": 9, "r": 1, "eta": 3}  # rungs optional
    "adaptive": {"method": "asha", "n": 64, "r": 1, "R": 27, "eta": 3}
    "adaptive": {"method": "pbt", "population": 8, "iterations": 12, "interval": 2, "mutations": {...}}

Hyperband, successive halving and population-based training are decided between blocks of hops,
each block training every configuration to the next decision point (:mod:`mop_airflow.planning.blocks`).
Hyperband's and successive halving's plan fixes where those are (every rung end of the brackets side
by side), so like ``schedule.shards`` it cannot change per run, and the whole search is one DAG run of
one block per rung end. Each bracket draws its own configurations from the (random) search space.
Population-based training (:mod:`mop_airflow.search.pbt`) takes one block per ``interval``, also in
one run.

ASHA (:mod:`mop_airflow.search.asha`) drawing its configurations at random is decided inside the
shard slots (:mod:`mop_airflow.planning.asha_slots`, :func:`in_slots`): one block of train tasks in one
DAG run, with or without a budget, whose slots ask ASHA what trains next. Only a model-based ASHA
(``space.sampler="tpe"``, whose proposals wait for results) is decided between blocks, ending a block
whenever one of its jobs ends: with a budget its blocks fit one run; without one their number is not
known up front, so each block's decision starts the DAG's next run.
"""

from __future__ import annotations

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
# Options of Hyperband and successive halving that the blocks to the next decision retired.
RETIRED = {
    "between_runs": "Hyperband and successive halving are decided between blocks, each block training to the next "
                    "rung's end, and run whole in one DAG run of one block per rung end",
    "allow_partial_iterations": "a rung ends at a block's end, at an iteration boundary, where every configuration "
                                "has seen every shard equally often; choose R a multiple of eta**s_max "
                                "(e.g. 9, 27 or 81 with eta=3)",
}
# Searches with no brackets: one ladder of rungs (ASHA: inside the shard slots, or between blocks when TPE proposes)
# or one population (PBT, between blocks).
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
    for retired, why in RETIRED.items():
        if retired in options:
            raise SpecError(f"search.adaptive.{retired}", options[retired], f"no longer exists: {why}",
                            f"remove search.adaptive.{retired}")
    return _halving_plan(method, options, shards)


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


def in_slots(plan: Any, sampler: str | None = None) -> bool:
    """Whether a search is decided inside the shard slots (:mod:`mop_airflow.planning.asha_slots`): ASHA
    drawing its configurations at random. A model-based ASHA's proposals wait for results between blocks."""
    return isinstance(plan, AshaPlan) and sampler != "tpe"


def decision_points(plan: HyperbandPlan | Bracket | PbtPlan) -> list[int]:
    """The iterations at which a search with a known shape decides: every rung end of Hyperband's
    brackets side by side (R=81, eta=3: 1, 3, 9, 27, 81), or PBT's boundaries and its end."""
    if isinstance(plan, PbtPlan):
        return sorted({*plan.boundaries, plan.iterations})
    from mop_airflow.search.halving import rung_iterations  # noqa: PLC0415

    return sorted({end for bracket in brackets_of(plan) for end in rung_iterations(bracket)})


def most_blocks(plan: Any, capacity: int) -> int | None:
    """The most blocks a search can take, where that is known up front. A block trains to the next
    decision point, so Hyperband and successive halving take one per distinct rung end, PBT one per
    segment; a one-rung ASHA (a model-based random search) one per wave of ``capacity``
    configurations (each trains ``R`` iterations, all starting together); an ASHA budget at most one
    per iteration of its deadline. None for ASHA with promotions and no budget."""
    if not isinstance(plan, AshaPlan):
        return len(decision_points(plan))
    bounds = [-(-plan.n // max(1, capacity))] if len(plan.rungs) == 1 else []
    if plan.budget is not None:  # nothing begins a leg it cannot end by the budget's last iteration
        bounds.append(plan.budget // max(1, capacity))
    return min(bounds) if bounds else None


def split_by_bracket(config_ids: list[str], plan: HyperbandPlan | Bracket) -> dict[int, list[str]]:
    """Bracket ``s`` takes the next ``n`` configurations of the seeded draw, in bracket order."""
    out, offset = {}, 0
    for bracket in brackets_of(plan):
        out[bracket.s] = config_ids[offset:offset + bracket.n]
        offset += bracket.n
    return out
