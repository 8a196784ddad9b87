"""Which configurations share an offset class (start on the same shard), and in which order the
shard slots take a class's configurations. Pure and seeded; no Airflow, no TensorFlow.

A block is one warm train task per shard slot that trains every hop the block puts on its slot as
soon as it is ready (:mod:`mop_airflow.slots.driver`). What the plan decides for it: which
configurations share an offset class (:func:`deal`: the seeded deal, or each model's configurations
together when hops are short next to building a model), and the order a class's configurations are
taken in (:func:`line_up`: by model, so a slot trains the configurations that share a compiled model
one after another). The plan records that order as its ``lineup``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from mop_airflow.planning.schedule import deal_classes, seeded_order

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


def deal_groups(groups: Sequence[Sequence[str]], *, shards: int, seed: int) -> list[list[str]]:
    """Fused groups (:func:`~mop_airflow.planning.fusing.fuse_groups`) dealt whole into offset classes, so
    a group's members reach every shard at the same hop: the largest first, those of a size in the seeded
    order of their first members, each to the class with the fewest configurations, the lowest first (so
    the classes stay as even as the groups let them). Groups of one deal as
    :func:`~mop_airflow.planning.schedule.deal_classes` deals configurations. Deterministic."""
    first = {group[0]: group for group in groups}
    classes: list[list[str]] = [[] for _ in range(shards)]
    for leader in sorted(seeded_order(list(first), seed=seed), key=lambda c: -len(first[c])):  # stable
        min(classes, key=len).extend(first[leader])  # min keeps the lowest of equals
    return classes


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


def line_up(classes: Sequence[Sequence[str]], configs: Mapping[str, Mapping[str, Any]], *,
            rows: int) -> list[list[str]]:
    """Every offset class in the order the shard slots take it: its configurations by model key
    (those that share a compiled model side by side), then longest estimated hop first, then id."""
    costs = {cid: hop_cost(configs[cid], rows) for cls in classes for cid in cls}
    keys = {cid: model_key(configs[cid]) for cls in classes for cid in cls}
    return [_lined_up(cls, costs, keys) for cls in classes]
