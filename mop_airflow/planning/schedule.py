"""Which configuration trains on which shard at which hop, and in which order. Pure and seeded.

Configurations are dealt (in a seeded order) into ``p`` **offset classes** (the plan task may regroup
them by model: :func:`mop_airflow.planning.lineup.deal`). A configuration of class
``o`` trains on shard ``(o + t) mod p`` at its global hop ``t``: in every iteration (``p`` hops) it
visits every shard exactly once. Each configuration's hops form its own chain: a hop waits only for
the same configuration's previous hop and for a free slot in its shard's pool, never for other
configurations (no groups moving in lockstep, no barrier). When several configurations wait for
the same shard, the priority weight of their hop decides which one a free slot takes, as
Airflow's scheduler does (highest weight first, then map index). :mod:`mop_airflow.planning.simulation`
replays the task plan built from these rules.
"""

from __future__ import annotations

import random
import zlib
from typing import Sequence

# How a hop's priority weight is chosen; `benchmarks/schedule_sim.py` compares them.
#   remaining: hops the configuration still has to go after this one, counting this one
#              (the one furthest behind goes first, which keeps the slowest chains moving)
#   done:      hops already done (the one furthest ahead goes first: depth-first)
#   none:      every hop weighs the same (Airflow then takes the lowest map index)
PRIORITY_RULES = ("remaining", "done", "none")
DEFAULT_PRIORITY = "remaining"


def shard_at(offset: int, t: int, shards: int) -> int:
    """The shard a configuration of offset class ``offset`` trains on at global hop ``t``."""
    return (offset + t) % shards


def priority_weight(rule: str, t: int, end: int) -> int:
    """The weight of global hop ``t`` of a chain that ends before hop ``end`` (always >= 1)."""
    if rule == "remaining":
        return end - t
    if rule == "done":
        return t + 1
    if rule == "none":
        return 1
    raise ValueError(f"priority rule {rule!r} is not one of {PRIORITY_RULES}")


def deal_classes(config_ids: Sequence[str], *, shards: int, seed: int) -> tuple[tuple[str, ...], ...]:
    """Deal the configurations round-robin, in a seeded order, into one offset class per shard."""
    ids = seeded_order(config_ids, seed=seed)
    return tuple(tuple(ids[o::shards]) for o in range(shards))


def seeded_order(config_ids: Sequence[str], *, seed: int) -> list[str]:
    """The configurations in the seeded order :func:`deal_classes` deals them in."""
    ids = list(config_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("configuration ids must be unique")
    random.Random(f"mop-plan:{seed}").shuffle(ids)
    return ids


def visit_order(classes: Sequence[Sequence[str]], *, start: int, end: int, shards: int) -> dict[str, list[int]]:
    """For each configuration, the shard of each of its global hops ``start``..``end - 1``."""
    return {cid: [shard_at(o, t, shards) for t in range(start, end)]
            for o, members in enumerate(classes) for cid in members}


def hash_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts: the same on every host and Python process."""
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def config_seed(seed: int, config_id: str) -> int:
    """The seed of one configuration's initial weights and batch order: stable across runs and hosts."""
    return hash_seed(seed, config_id)
