"""Population-based training (PBT) on hops: Jaderberg et al., "Population Based Training of Neural
Networks" (2017), with the options of Ray Tune's ``PopulationBasedTraining``.

    "adaptive": {"method": "pbt", "population": 8, "iterations": 12, "interval": 2, "quantile": 0.25,
                 "resample_probability": 0.25, "mutations": {"learning_rate": {"distribution": "log_uniform",
                 "low": 1e-4, "high": 1e-1}, "batch_size": [16, 32, 64]}}

The population's members train side by side. Every ``interval`` iterations (at an iteration
boundary, so every member has seen every shard equally often) the members are ranked on the
validation metric; each member of the bottom ``quantile`` copies a member of the top ``quantile``
(drawn at random): its checkpoint, weights *and* optimizer state, and goes on with the copied
member's hyperparameters explored. For each mutated field, with probability
``resample_probability`` a fresh value is drawn from the mutation; otherwise a number is
multiplied by one of ``perturbation_factors`` (1.2 or 0.8), a listed value moves to a neighbour in
its list. These are Ray Tune's names and defaults (``quantile`` is its ``quantile_fraction``,
``interval`` its ``perturbation_interval`` in iterations, ``mutations`` its ``hyperparam_mutations``).

Where this differs from Ray Tune: the population is ranked together at each boundary (Ray Tune's
``synch=True``; its default decides each trial alone when that trial reaches a boundary); a
perturbed number is clipped into its distribution's range and onto its grid, so it never leaves
the range the spec declared (Ray Tune lets it drift); and a failed or diverged member is always
replaced by a copy of a top member, since its own state is lost, even beyond the quantile.

A copy is a new configuration (a new ``config_id``: its own hop records and checkpoints from the
boundary on) in the same member's place; :class:`Exploit` records who copied whom, when, and
which values changed, so a search can be replayed from its records. Pure: no Airflow, no TensorFlow.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from mop_airflow.errors import SpecError, unknown_key
from mop_airflow.search.distributions import Distribution, parse_distribution
from mop_airflow.search.jobs import Completion, Job
from mop_airflow.search.promotion import rank_rung
from mop_airflow.search.space import config_field

OPTIONS = ("population", "iterations", "interval", "quantile", "resample_probability", "perturbation_factors",
           "mutations")
# What a mutation may change: what a checkpoint of another configuration can go on with. The model
# builder, the optimizer (its variables differ), the loss and the metrics cannot.
FIXED = ("model", "optimizer", "loss", "metrics")
TOP_LEVEL = ("learning_rate", "batch_size", "epochs_per_hop")
NESTED = ("hparams", "optimizer_params")


@dataclass(frozen=True)
class PbtPlan:
    population: int
    iterations: int
    interval: int
    quantile: float = 0.25
    resample_probability: float = 0.25
    perturbation_factors: tuple[float, ...] = (1.2, 0.8)
    mutations: dict[str, Any] = field(default_factory=dict)

    @property
    def total_configurations(self) -> int:
        """How many configurations the search space draws for it: the first population."""
        return self.population

    @property
    def max_iterations(self) -> int:
        return self.iterations

    def halving_iterations(self) -> int:
        """The iterations the search trains in all: every member, every iteration (copies included)."""
        return self.population * self.iterations

    @property
    def boundaries(self) -> list[int]:
        """The iterations after which the population is ranked and its bottom copies its top."""
        return list(range(self.interval, self.iterations, self.interval))

    def segment_end(self, segment: int) -> int:
        """Where segment ``segment`` (0 first) ends, in iterations."""
        return min(self.iterations, (segment + 1) * self.interval)

    def in_quantile(self) -> int:
        """How many members the bottom (and the top) quantile hold: Ray Tune's rounding (up, at most half)."""
        count = int(math.ceil(self.population * self.quantile))
        return int(math.floor(self.population / 2)) if count > self.population / 2 else count

    def to_dict(self) -> dict[str, Any]:
        return {"method": "pbt", "population": self.population, "iterations": self.iterations,
                "interval": self.interval, "quantile": self.quantile,
                "resample_probability": self.resample_probability,
                "perturbation_factors": list(self.perturbation_factors), "mutations": self.mutations}


def pbt_plan(options: Mapping[str, Any], space_params: Mapping[str, Any] | None = None) -> PbtPlan:
    """Validate ``search.adaptive`` (without its ``method``) for PBT; every error names the field, the
    value, the rule and the fix. ``space_params``: the search space's params, which every mutated
    field must be part of."""
    unknown_key("search.adaptive", options, OPTIONS, what="an option of pbt")
    for name in ("population", "iterations", "mutations"):
        if name not in options:
            raise SpecError(f"search.adaptive.{name}", None, "is required",
                            "e.g. {'method': 'pbt', 'population': 8, 'iterations': 12, 'interval': 2, "
                            "'mutations': {'learning_rate': {'distribution': 'log_uniform', 'low': 1e-4, 'high': 0.1}}}")
    population, iterations = options["population"], options["iterations"]
    interval = options.get("interval", 1)
    for name, value, low in (("population", population, 2), ("iterations", iterations, 1), ("interval", interval, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpecError(f"search.adaptive.{name}", value, f"must be a whole number >= {low}",
                            {"population": "a population needs members to copy from: e.g. population=8",
                             "iterations": "e.g. iterations=12, how long every member trains",
                             "interval": "rank and copy every few iterations, e.g. interval=2"}[name])
    if interval >= iterations:
        raise SpecError("search.adaptive.interval", interval, f"must be below iterations={iterations}: no member "
                        "would ever copy another", f"use e.g. interval={max(1, iterations // 4)}")
    quantile = _fraction("quantile", options.get("quantile", 0.25), high=0.5, open_low=True,
                         fix="the bottom share that copies the top share: 0.25 is the usual choice, 0.5 the most")
    resample = _fraction("resample_probability", options.get("resample_probability", 0.25), high=1.0,
                         fix="the chance of a fresh draw instead of a perturbation, e.g. 0.25")
    factors = options.get("perturbation_factors", [1.2, 0.8])
    if (not isinstance(factors, (list, tuple)) or not factors
            or any(isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0 for f in factors)):
        raise SpecError("search.adaptive.perturbation_factors", factors, "must be a list of numbers > 0",
                        "use e.g. [1.2, 0.8]: a perturbed value is multiplied by one of them")
    plan = PbtPlan(population=population, iterations=iterations, interval=interval, quantile=quantile,
                   resample_probability=resample, perturbation_factors=tuple(float(f) for f in factors),
                   mutations=dict(options["mutations"]) if isinstance(options["mutations"], Mapping) else {})
    if plan.in_quantile() < 1:
        raise SpecError("search.adaptive.quantile", quantile, f"leaves no member to copy in a population of "
                        f"{population} (ceil({population} x {quantile}) = 0)", "raise quantile or population")
    mutations(options["mutations"], space_params)  # validated here, parsed again where they are used
    return plan


def _fraction(name: str, value: Any, *, high: float, fix: str, open_low: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (value > 0 if open_low else value >= 0)
    if not ok or value > high:
        raise SpecError(f"search.adaptive.{name}", value,
                        f"must be a number {'>' if open_low else '>='} 0 and <= {high}", fix)
    return float(value)


def mutations(given: Any, space_params: Mapping[str, Any] | None = None) -> dict[str, list[Any] | Distribution]:
    """``search.adaptive.mutations`` parsed: field -> a list of values or a :class:`Distribution`.

    A field is ``learning_rate``, ``batch_size``, ``epochs_per_hop``, ``hparams.<name>`` or
    ``optimizer_params.<name>``, and must be part of the search space (``space_params``), so that
    every member has a value to perturb."""
    where = "search.adaptive.mutations"
    if not isinstance(given, Mapping) or not given:
        raise SpecError(where, given, "must be a non-empty mapping of field to values or a distribution",
                        "e.g. {'learning_rate': {'distribution': 'log_uniform', 'low': 1e-4, 'high': 0.1}, "
                        "'batch_size': [16, 32, 64]}")
    out: dict[str, list[Any] | Distribution] = {}
    for key, spec in given.items():
        name = f"{where}.{key}"
        head, _, tail = str(key).partition(".")
        if head in FIXED:
            raise SpecError(name, spec, f"{head} cannot be mutated: a copied checkpoint goes on with the same "
                            "model, optimizer variables, loss and metrics",
                            f"mutate only {list(TOP_LEVEL)}, hparams.<name> or optimizer_params.<name>")
        if head not in TOP_LEVEL + NESTED or (head in NESTED) != bool(tail) or "." in tail:
            raise SpecError(name, spec, "is not a field a mutation can change",
                            f"use one of {list(TOP_LEVEL)}, hparams.<name> or optimizer_params.<name>")
        if space_params is not None and head in NESTED and tail not in dict(space_params.get(head) or {}):
            known = [f"{head}.{k}" for k in dict(space_params.get(head) or {})]
            raise SpecError(name, spec, f"is not in the search space (search.space.params.{head} has "
                            f"{sorted(dict(space_params.get(head) or {})) or 'nothing'})",
                            f"add {tail!r} to search.space.params.{head}, or mutate one of {known or list(TOP_LEVEL)}")
        if isinstance(spec, Mapping):
            dist = parse_distribution(name, spec)
            out[key] = dist
            values = list(dist.choices or []) if dist.name == "choice" else [dist.low, dist.high]
        elif isinstance(spec, (list, tuple)) and spec:
            out[key] = list(spec)
            values = list(spec)
        else:
            raise SpecError(name, spec, "must be a non-empty list of values or a distribution",
                            "e.g. [16, 32, 64], or {'distribution': 'log_uniform', 'low': 1e-4, 'high': 0.1}")
        _check_values(name, head, values, out[key])
    return out


def _check_values(name: str, head: str, values: Sequence[Any], spec: Any) -> None:
    for value in values:
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if head == "learning_rate" and not (number and value > 0):
            raise SpecError(name, value, "a learning rate must be a number > 0", "e.g. log_uniform from 1e-4 to 0.1")
        if head in ("batch_size", "epochs_per_hop"):
            whole = number and float(value).is_integer() and value >= 1
            integral = not isinstance(spec, Distribution) or spec.name in ("int_uniform", "choice") or spec.integer
            if not whole or not integral:
                raise SpecError(name, value, f"{head} must be a whole number >= 1",
                                "list whole numbers, e.g. [16, 32, 64], or use int_uniform")


def set_field(config: Mapping[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = {**config, "hparams": dict(config.get("hparams") or {}),
           "optimizer_params": dict(config.get("optimizer_params") or {})}
    if key == "learning_rate":
        out["optimizer_params"]["learning_rate"] = float(value)
    elif "." in key:
        head, tail = key.split(".", 1)
        out[head][tail] = value
    else:
        out[key] = int(value) if key in ("batch_size", "epochs_per_hop") else value
    return out


def explore(config: Mapping[str, Any], plan: PbtPlan, rng: random.Random) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """``config`` with every mutated field resampled or perturbed, and the changes ({field: [old, new]})."""
    out = {k: v for k, v in config.items() if k != "config_id"}
    changes: dict[str, list[Any]] = {}
    for key, spec in sorted(mutations(plan.mutations).items()):
        old = config_field(config, key)
        resample = rng.random() < plan.resample_probability
        if isinstance(spec, list):
            if resample or old not in spec:
                new = spec[rng.randrange(len(spec))]
            else:
                new = spec[min(len(spec) - 1, max(0, spec.index(old) + rng.choice((-1, 1))))]
        elif resample:
            new = spec.sample(rng)
        else:
            new = _perturbed(spec, old, rng.choice(plan.perturbation_factors))
        out = set_field(out, key, new)
        if config_field(out, key) != old:
            changes[key] = [old, config_field(out, key)]
    return out, changes


def extremes(spec: list[Any] | Distribution) -> list[Any]:
    """The values that bound a mutation: a list's values, a choice's, or a range's two ends."""
    if isinstance(spec, list):
        return list(spec)
    if spec.name == "choice":
        return list(spec.choices or [])
    if spec.name == "int_uniform":
        return [int(spec.low), int(spec.high)]  # type: ignore[arg-type]
    if spec.q is not None:
        return [spec._on_grid(spec.low), spec._on_grid(spec.high)]  # type: ignore[arg-type]
    return [spec.low, spec.high]


def _perturbed(dist: Distribution, value: Any, factor: float) -> Any:
    if dist.name == "choice":
        return value
    low, high = float(dist.low), float(dist.high)  # type: ignore[arg-type]
    moved = min(high, max(low, float(value) * factor))
    if dist.name == "int_uniform":
        return int(min(high, max(low, round(moved))))
    if dist.q is not None:
        return dist._on_grid(moved)
    return moved


@dataclass(frozen=True)
class Exploit:
    """Member ``member`` stopped ``replaced`` (ranked ``rank`` of ``of`` on ``replaced_metric``) after
    ``iteration`` iterations and goes on as ``config_id``: a copy of ``parent`` (``parent_metric``)
    with ``changes`` ({field: [old, new]})."""

    member: int
    iteration: int
    replaced: str
    config_id: str
    parent: str
    parent_metric: float | None
    replaced_metric: float | None
    rank: int
    of: int
    changes: dict[str, list[Any]]


def pbt_decision(plan: PbtPlan, members: Sequence[str], done: Sequence[Completion], configs: Mapping[str, Mapping[str, Any]],
                 *, segment: int, seed: int, direction: str, new_id: Any) -> tuple[list[Job], list[Exploit], list[dict[str, Any]]]:
    """At the end of segment ``segment``: what every member trains next.

    ``members[m]``: member ``m``'s configuration now; ``done``: their completions of the segment;
    ``configs``: every configuration by id; ``new_id(config)`` names a new configuration. Returns
    the next segment's jobs (a member going on, or a copy starting from its parent's checkpoint),
    the copies made, and the new configurations. The same completions give the same answer: each
    member's draws come from a stream seeded by (seed, segment, member)."""
    if segment >= len(plan.boundaries):  # the last segment ended: the search is over
        return [], [], []
    end = plan.segment_end(segment + 1)
    current = set(members)
    ranked = rank_rung([c.result() for c in done if c.config_id in current], direction=direction)
    position = {r["config_id"]: k for k, r in enumerate(ranked)}
    metric = {c.config_id: c.metric for c in done}
    rankable = [r["config_id"] for r in ranked if _finite(r)]
    trained = set(rankable)
    count = plan.in_quantile()
    top = rankable[:count]
    bottom = set(rankable[len(rankable) - count:]) if len(rankable) > count else set()
    bottom |= current - trained  # failed or diverged: its state is lost
    jobs, copies, born = [], [], []
    for m, cid in enumerate(members):
        if cid not in bottom or not top:
            if cid in trained:
                jobs.append(Job(cid, segment + 1, "continue", end, metric=metric.get(cid),
                                rank=position[cid] + 1, of=len(ranked)))
            continue
        rng = random.Random(f"mop:pbt:{seed}:{segment}:{m}")
        parent = top[rng.randrange(len(top))]
        child, changes = explore(configs[parent], plan, rng)
        child = {"config_id": new_id(child), **child}
        born.append(child)
        copies.append(Exploit(member=m, iteration=plan.segment_end(segment), replaced=cid,
                              config_id=child["config_id"], parent=parent, parent_metric=metric.get(parent),
                              replaced_metric=metric.get(cid), rank=position.get(cid, len(ranked)) + 1,
                              of=len(ranked), changes=changes))
        jobs.append(Job(child["config_id"], segment + 1, "exploit", end, metric=metric.get(parent),
                        rank=position[parent] + 1, of=len(ranked)))
    return jobs, copies, born


def _finite(result: Mapping[str, Any]) -> bool:
    value = result.get("metric")
    return result["status"] == "ok" and value is not None and math.isfinite(value)
