"""Which configurations hop together: bundles, and how many. Pure and seeded; no Airflow, no TensorFlow.

The unit of Airflow work is the hop of a **bundle** on a shard: one task instance trains each
configuration of its bundle in turn, the way a MADlib segment trains all its models per hop. A
bundle lives inside one offset class (its configurations share the visit order), waits only for
itself, and its configurations' results never depend on who shares it (each keeps its own seed,
batch order, checkpoint and record).

Which configurations share an offset class (:func:`deal`): the seeded deal, or each model's
configurations together when hops are short next to building a model.

How many bundles (``schedule.bundle_size: "auto"``), in this order:

1. enough chains to keep every slot busy: at most ``CHAINS_PER_SLOT`` per shard slot, and never
   fewer than one per slot when there are that many configurations;
2. beyond that, as few task instances as the training allows: a task should carry at least
   ``AMORTISE`` times its fixed cost (``FIXED_SECONDS``) of estimated training;
3. and a run stays within ``TASK_INSTANCE_BUDGET`` hop task instances (Airflow's scheduler
   examines every waiting one in every loop), down to one bundle per offset class.

``benchmarks/schedule_sim.py`` replays the rule against fixed sizes with the simulator.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from mop_airflow.planning.schedule import deal_classes, seeded_order

CHAINS_PER_SLOT = 2
AMORTISE = 4.0
FIXED_SECONDS = 2.0  # a hop task's start and hand-off on the embedded Airflow, measured (README, Performance)
TASK_INSTANCE_BUDGET = 2000
# A rough CPU cost model for balancing before anything has trained: per optimizer step and per row.
STEP_SECONDS = 0.004
ROW_SECONDS = 2e-5
# Building a model and tracing its train and test steps, paid once per distinct model a task trains
# (the demo grid's fresh hops, 2-core machine: 0.15 s build, ~0.7 s of tracing in the first steps).
BUILD_SECONDS = 1.0


def hop_cost(config: Mapping[str, Any], rows: int) -> float:
    """Estimated seconds of one hop of ``config`` over a shard of ``rows`` rows (relative, for balancing)."""
    epochs = int(config.get("epochs_per_hop") or 1)
    steps = math.ceil(max(rows, 1) / int(config["batch_size"])) * epochs
    return steps * STEP_SECONDS + rows * epochs * ROW_SECONDS


def chain_count(configurations: int, *, shards: int, slots: int, hops: int, cost_per_hop: float,
                bundle_size: int | str = "auto") -> int:
    """How many bundles (chains of hop tasks) a set of ``configurations`` is split into.

    ``hops`` is how many hops each chain makes, ``cost_per_hop`` the estimated training seconds
    of one hop of all the configurations together.
    """
    if configurations <= 0:
        return 0
    if bundle_size != "auto":
        return math.ceil(configurations / int(bundle_size))
    busy = min(configurations, shards * slots)
    chains = min(configurations, CHAINS_PER_SLOT * shards * slots)
    amortised = math.inf if math.isinf(cost_per_hop) else math.floor(cost_per_hop / (AMORTISE * FIXED_SECONDS))
    chains = max(busy, min(chains, amortised))
    within_budget = max(min(configurations, shards), TASK_INSTANCE_BUDGET // max(hops, 1))
    return max(1, min(chains, within_budget))


def chains_per_class(configurations: int, *, shards: int, slots: int, hops: int,
                     bundle_size: int | str = "auto") -> int:
    """How many chains each offset class renders: fixed when the DAG is parsed, from the spec's own
    search space (a run's bundles then fill at most that many; extra chains are skipped).

    With ``"auto"`` it is :func:`chain_count` before the cost rule (the shard's rows are unknown at
    parse time), so a run of cheap hops fills fewer chains than it has.
    """
    if configurations <= 0:
        return 1
    classes = min(configurations, shards)
    largest = math.ceil(configurations / shards)  # the deal gives classes sizes that differ by at most one
    if bundle_size != "auto":
        return max(1, math.ceil(largest / int(bundle_size)))
    total = chain_count(configurations, shards=shards, slots=slots, hops=hops, cost_per_hop=math.inf)
    return max(1, min(largest, math.ceil(total / classes)))


def model_key(config: Mapping[str, Any]) -> str:
    """Configurations with the same key can train in one compiled Keras model, one after another:
    same builder and hparams, optimizer class and settings but the learning rate, loss, metrics."""
    params = {k: v for k, v in (config.get("optimizer_params") or {}).items() if k != "learning_rate"}
    return json.dumps([config["model"], config.get("hparams") or {}, config.get("optimizer"), params,
                       config.get("loss"), config.get("metrics") or []], sort_keys=True, default=str)


def deal(config_ids: Sequence[str], costs: Mapping[str, float], keys: Mapping[str, str], *, shards: int,
         seed: int) -> list[list[str]]:
    """The offset classes: the seeded round-robin deal (:func:`~mop_airflow.planning.schedule.deal_classes`),
    or the same class sizes filled with configurations that share a model, whichever makes the
    costliest class's estimated hop shorter.

    A class's hop is estimated as its configurations' ``costs`` plus ``BUILD_SECONDS`` per distinct
    model key in it (its tasks build and trace each once). The seeded deal mixes models across
    classes; when hops are short next to a build (the demo grid: 8 configurations, 2 models), classes
    of one model each build half as many models, and when hops are long the seeded deal stays.
    Uniform configurations always get the seeded deal (the simulator replays it). Deterministic.
    """
    dealt = [list(c) for c in deal_classes(config_ids, shards=shards, seed=seed)]
    by_key: dict[str, list[str]] = {}
    for cid in sorted(seeded_order(config_ids, seed=seed), key=lambda c: -costs[c]):  # stable: seeded ties
        by_key.setdefault(keys[cid], []).append(cid)
    # Each model's configurations side by side, its costliest and cheapest alternating, so the
    # classes cut from the line hold a similar mix of costs.
    grouped_order = [cid for key in sorted(by_key) for cid in _ends_inward(by_key[key])]
    grouped, at = [], 0
    for cls in dealt:
        grouped.append(grouped_order[at:at + len(cls)])
        at += len(cls)

    def costliest(classes: list[list[str]]) -> float:
        return max((sum(costs[c] for c in cls) + BUILD_SECONDS * len({keys[c] for c in cls}) for cls in classes),
                   default=0.0)

    return grouped if costliest(grouped) < costliest(dealt) else dealt


def bundle_class(members: Sequence[str], count: int, costs: Mapping[str, float],
                 keys: Mapping[str, str]) -> list[list[str]]:
    """Split one offset class into ``count`` bundles of about equal estimated cost.

    The members are lined up by model key (then by cost, longest first, and id) and cut into
    ``count`` consecutive runs of about equal cost: configurations that share a compiled model sit
    in as few bundles as possible, so a task builds and traces few models. Deterministic.
    """
    count = max(1, min(count, len(members)))
    ordered = _lined_up(members, costs, keys)
    total = sum(costs[c] for c in ordered)
    bundles: list[list[str]] = [[]]
    done = 0.0
    for k, cid in enumerate(ordered):
        left = len(ordered) - k  # never leave a later bundle empty
        due = len(bundles) < count and bundles[-1] and (
            done + costs[cid] / 2 > total * len(bundles) / count or left == count - len(bundles))
        if due:
            bundles.append([])
        bundles[-1].append(cid)
        done += costs[cid]
    return bundles


def _lined_up(members: Sequence[str], costs: Mapping[str, float], keys: Mapping[str, str]) -> list[str]:
    """By model key (configurations sharing a compiled model side by side), then longest first, then id."""
    return sorted(members, key=lambda c: (keys[c], -costs[c], c))


def _ends_inward(ordered: list[str]) -> list[str]:
    """``[a, b, c, d, e]`` -> ``[a, e, b, d, c]``."""
    return [ordered[k // 2] if k % 2 == 0 else ordered[-(k // 2) - 1] for k in range(len(ordered))]


def deal_configs(config_ids: Sequence[str], configs: Mapping[str, Mapping[str, Any]], *, rows: int, shards: int,
                 seed: int) -> list[list[str]]:
    """:func:`deal` from the configurations themselves (estimated hop cost over ``rows`` rows, model key)."""
    return deal(config_ids, {c: hop_cost(configs[c], rows) for c in config_ids},
                {c: model_key(configs[c]) for c in config_ids}, shards=shards, seed=seed)


def make_bundles(classes: Sequence[Sequence[str]], configs: Mapping[str, Mapping[str, Any]], *, rows: int,
                 shards: int, slots: int, hops: int, bundle_size: int | str = "auto",
                 chains: Sequence[int] | None = None) -> list[list[list[str]]]:
    """Every offset class split into bundles: ``result[o]`` lists class ``o``'s bundles, at most
    ``chains[o]`` of them (the chains the DAG rendered for the class)."""
    members = [cid for cls in classes for cid in cls]
    return split_classes(classes, {cid: hop_cost(configs[cid], rows) for cid in members},
                         {cid: model_key(configs[cid]) for cid in members}, shards=shards, slots=slots, hops=hops,
                         bundle_size=bundle_size, chains=chains)


def split_classes(classes: Sequence[Sequence[str]], costs: Mapping[str, float], keys: Mapping[str, str], *,
                  shards: int, slots: int, hops: int, bundle_size: int | str = "auto",
                  chains: Sequence[int] | None = None) -> list[list[list[str]]]:
    """:func:`make_bundles` from estimated hop seconds and model keys per configuration.

    A class needing more bundles than the ``chains`` rendered for it (a trigger conf that widened
    the search space, or a fixed ``bundle_size`` too small for it) gets that many larger ones.
    """
    caps = list(chains) if chains is not None else [len(cls) for cls in classes]
    if bundle_size != "auto":  # exactly bundle_size each (the last may hold fewer), in model-key order
        size = int(bundle_size)
        return [[ordered[i:i + size] for i in range(0, len(ordered), size)] if math.ceil(len(ordered) / size) <= cap
                else bundle_class(ordered, cap, costs, keys)
                for ordered, cap in zip((_lined_up(cls, costs, keys) for cls in classes), caps)]
    members = [c for cls in classes for c in cls]
    total = chain_count(len(members), shards=shards, slots=slots, hops=hops,
                        cost_per_hop=sum(costs[c] for c in members))
    # the chains spread over the classes in proportion to their size, at least one each
    return [bundle_class(cls, min(cap, max(1, round(total * len(cls) / len(members)))), costs, keys) if cls else []
            for cls, cap in zip(classes, caps)]
