"""Asynchronous successive halving (ASHA): Li et al., "A System for Massively Parallel Hyperparameter
Tuning" (MLSys 2020), Algorithm 2, the promotion variant, with the resource in MOP iterations.

    "adaptive": {"method": "asha", "n": 64, "r": 1, "R": 27, "eta": 3}
    "adaptive": {"method": "asha", "n": 512, "r": 1, "R": 81, "eta": 3, "budget": 1581}

Rung ``k`` trains a configuration to ``r * eta**k`` iterations; the top rung is ``R``, which must be
one of them. Whenever capacity frees up (:func:`next_jobs`), ASHA looks from the highest rung below
the top down to rung 0 for a configuration that is among the best ``floor(|rung k| / eta)`` of those
that completed rung ``k`` and was not promoted from it yet, and promotes the best such one to rung
``k + 1``; only when nothing can be promoted does it start a new configuration, until ``n`` have
started. So no slot waits for a rung to fill, as a synchronous successive-halving rung does.

With a ``budget`` (iterations trained in all, counted as Hyperband counts its own) the search has a
deadline, as the paper's ASHA has a time budget, but counted in blocks of one iteration so that the
same records give the same decisions: one configuration trains on each slot
(:func:`AshaPlan.capacity`), each one iteration a block, so ``budget // capacity`` blocks spend the
budget. A promotion or a start is handed out only if its leg ends by that block; a leg that cannot
is never begun. Without the deadline, the last promotions to the top rungs come late and their long
legs run alone on one slot each (on MOP a configuration trains on one shard at a time). Simulated at
R=81 on 16 shards with Hyperband's 1,581 iterations as the budget, the slots trained 0.97 of the
time (0.93 at worst over 10 seeds), against 0.75 for ``n=441`` without one
(``benchmarks/schedule_sim.py --adaptive``).

Pure: no Airflow, no TensorFlow. The completions arrive in the order the records say they happened
(the order is part of the input), and the same completions in the same order give the same jobs.
Ranking is :func:`mop_airflow.search.promotion.rank_rung`'s: direction-aware, ties to the lower
configuration id, a failed or diverged configuration never promoted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from mop_airflow.errors import SpecError, unknown_key
from mop_airflow.search.jobs import Completion, Job
from mop_airflow.search.promotion import rank_rung

OPTIONS = ("n", "r", "R", "eta", "budget")


@dataclass(frozen=True)
class AshaPlan:
    """``n`` configurations in all; rung ``k`` ends at ``rungs[k]`` iterations (``rungs[-1] == R``)."""

    n: int
    r: int
    R: int
    eta: int
    rungs: tuple[int, ...]
    budget: int | None = None

    @property
    def total_configurations(self) -> int:
        """How many configurations the search space draws for it: ``n``."""
        return self.n

    @property
    def top(self) -> int:
        return len(self.rungs) - 1

    @property
    def max_iterations(self) -> int:
        """The most iterations any configuration trains (a promoted one resumes from its checkpoint)."""
        return self.R

    def capacity(self, slots: int) -> int:
        """Configurations a block trains at once on ``slots`` slots (shards x slots per shard): one per
        slot under a budget, so each trains an iteration every block and a leg of ``L`` iterations ends
        ``L`` blocks on; otherwise two, so that each shard has one heading to it while another waits."""
        return slots if self.budget is not None else PER_SLOT * slots

    def deadline(self, slots: int) -> int | None:
        """The blocks the budget lasts on ``slots`` slots (None without a budget): blocks ``0`` to
        ``deadline - 1`` train at most ``capacity`` iterations each, so never more than the budget."""
        return None if self.budget is None else self.budget // self.capacity(slots)

    def halving_iterations(self) -> int:
        """What the search trains if every rung promotes exactly ``floor(|rung| / eta)``, as
        synchronous successive halving would: a guide to its budget, not a bound. ASHA may promote
        more (a later, better configuration overtakes one promoted earlier; both have gone on)."""
        total, count, previous = 0, self.n, 0
        for end in self.rungs:
            total += count * (end - previous)
            previous, count = end, count // self.eta
        return total

    def expected_iterations(self) -> int:
        """What the search is expected to train: the synchronous-halving guide, never more than a budget."""
        return self.halving_iterations() if self.budget is None else min(self.halving_iterations(), self.budget)

    def to_dict(self) -> dict[str, Any]:
        out = {"method": "asha", "n": self.n, "r": self.r, "R": self.R, "eta": self.eta, "rungs": list(self.rungs)}
        return out if self.budget is None else {**out, "budget": self.budget}


# Configurations a block trains per slot of every shard without a budget: more than one, so that each
# shard has a configuration heading to it while another waits (simulated at R=81 on 16 shards, n=441:
# slot use 0.750 with two per slot against 0.690 with one; benchmarks/schedule_sim.py --adaptive).
PER_SLOT = 2


def asha_plan(options: Mapping[str, Any]) -> AshaPlan:
    """Validate ``search.adaptive`` (without its ``method``) for ASHA; every error names the field,
    the value, the rule and the fix."""
    unknown_key("search.adaptive", options, OPTIONS, what="an option of asha")
    for name in ("n", "R"):
        if name not in options:
            raise SpecError(f"search.adaptive.{name}", None, "is required",
                            "set n (configurations to start in all) and R (the most iterations one trains), "
                            "e.g. {'method': 'asha', 'n': 64, 'r': 1, 'R': 27, 'eta': 3}")
    n, r, R, eta = options["n"], options.get("r", 1), options["R"], options.get("eta", 3)
    budget = options.get("budget")
    checks = [("n", n, 1), ("r", r, 1), ("R", R, 1), ("eta", eta, 2)]
    if budget is not None:  # checked after R, so its bound is a whole number
        checks.append(("budget", budget, R))
    for name, value, low in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpecError(f"search.adaptive.{name}", value, f"must be a whole number >= {low}",
                            {"n": "start at least one configuration, e.g. n=64",
                             "r": "train the first rung at least one iteration, e.g. r=1",
                             "R": "e.g. R=27 with r=1 and eta=3",
                             "eta": "keep the best 1/eta at each rung: eta=3 is the usual choice",
                             "budget": "give the iterations the whole search may train, at least R (one "
                                       "configuration trained to the top rung), or leave budget out"}[name])
    if r > R:
        raise SpecError("search.adaptive.r", r, f"must be at most R={R}: the first rung cannot train longer than "
                        "the most any configuration trains", f"lower r, or raise R to r * eta**k (e.g. {r * eta})")
    rungs = [r]
    while rungs[-1] < R:
        rungs.append(rungs[-1] * eta)
    if rungs[-1] != R:
        reachable = [x for x in (rungs[-2], rungs[-1]) if x >= r]
        raise SpecError("search.adaptive.R", R, f"is not a rung: rungs end at r * eta**k iterations "
                        f"({', '.join(map(str, rungs))}), and a configuration is ranked only at a rung's end",
                        f"use R={' or R='.join(map(str, reachable))}, or change r or eta")
    return AshaPlan(n=n, r=r, R=R, eta=eta, rungs=tuple(rungs), budget=budget)


def check_budget(plan: AshaPlan, shards: int, slots_per_shard: int) -> None:
    """A budget too small for any configuration to reach ``R`` on these slots is refused before
    anything trains: one trains an iteration a block, so the deadline must be at least ``R`` blocks."""
    slots = shards * slots_per_shard
    deadline = plan.deadline(slots)
    if deadline is None or deadline >= plan.R:
        return
    raise SpecError("search.adaptive.budget", plan.budget,
                    f"lasts {deadline} block(s) of one iteration on {shards} shard(s) x {slots_per_shard} slot(s) "
                    f"({plan.capacity(slots)} configurations at once, one per slot), fewer than the R={plan.R} "
                    "iterations a configuration needs to reach the top rung",
                    f"raise budget to at least R x slots = {plan.R * slots}, or lower R")


def next_jobs(plan: AshaPlan, completions: Sequence[Completion], promoted: Sequence[tuple[str, int]],
              started: Sequence[str], candidates: Sequence[str], free: int, *, direction: str,
              propose: Callable[[], str] | None = None, block: int = 0, slots: int = 1) -> list[Job]:
    """Up to ``free`` jobs, each as ASHA's ``get_job`` would hand it to a free worker.

    ``completions``: every rung completed so far, in the order they completed; ``promoted``: the
    (config_id, rung) pairs already promoted *from* that rung; ``started``: the configurations
    started so far; ``candidates``: the seeded draw of configurations, in order (new ones are taken
    from it). A job handed out here counts at once: the next free capacity sees it as promoted or
    started. ``propose``: once the draw is used up, names a new configuration to start (a
    model-based sampler, :mod:`mop_airflow.search.tpe`), until ``n`` have started. ``block``: the
    block the jobs begin training in; ``slots``: the shards' slots in all. Under a budget, only a leg
    that ends by the deadline (:meth:`AshaPlan.deadline`) is handed out.
    """
    if free < 0:
        raise SpecError("free", free, "must be >= 0", "pass the capacity that is free now")
    by_rung: dict[int, list[Completion]] = {}
    for done in completions:
        by_rung.setdefault(done.rung, []).append(done)
    taken = set(promoted)
    begun = list(started)
    jobs: list[Job] = []
    deadline = plan.deadline(slots)

    def fits(leg: int) -> bool:  # a leg begun in this block ends by the budget's last block
        return deadline is None or block + leg <= deadline

    for _ in range(free):
        job = _promotion(plan, by_rung, taken, direction, fits) or (
            _start(candidates, begun, plan.n, plan.rungs[0], propose) if fits(plan.rungs[0]) else None)
        if job is None:
            break
        if job.kind == "promote":
            taken.add((job.config_id, job.rung - 1))
        else:
            begun.append(job.config_id)
        jobs.append(job)
    return jobs


def _promotion(plan: AshaPlan, by_rung: Mapping[int, list[Completion]], taken: set[tuple[str, int]],
               direction: str, fits: Callable[[int], bool]) -> Job | None:
    for k in range(plan.top - 1, -1, -1):  # the highest rung first: it is the closest to a result
        if not fits(plan.rungs[k + 1] - plan.rungs[k]):
            continue  # its leg would end after the budget's last block
        done = by_rung.get(k, [])
        ranked = rank_rung([c.result() for c in done], direction=direction)
        best = ranked[:len(done) // plan.eta]
        for place, result in enumerate(best):
            if not _rankable(result) or (result["config_id"], k) in taken:
                continue
            return Job(result["config_id"], k + 1, "promote", plan.rungs[k + 1], metric=result["metric"], rank=place + 1,
                       of=len(done))
    return None


def _rankable(result: Mapping[str, Any]) -> bool:
    metric = result["metric"]
    return result["status"] == "ok" and metric is not None and math.isfinite(metric)


def _start(candidates: Sequence[str], begun: list[str], n: int, iterations: int,
           propose: Callable[[], str] | None = None) -> Job | None:
    if len(begun) >= n:
        return None
    seen = set(begun)
    fresh = next((cid for cid in candidates if cid not in seen), None)
    if fresh is None and propose is not None:
        fresh = propose()
    return None if fresh is None else Job(fresh, 0, "start", iterations)
