"""The hop plan: which configuration trains on which shard at which hop. Pure and seeded.

Configurations are dealt (in a seeded order) into ``p`` groups, one per shard. At global hop
``t`` (``t = iteration * p + hop``) group ``g`` sits on shard ``(g + t) mod p``: the groups rotate
one shard per hop, so in every iteration each configuration visits each shard exactly once, and the
group arriving at shard ``s`` at hop ``t`` is the one that left shard ``s - 1``. That single
predecessor is the only thing a shard waits for (no global barrier), and the DAG's edges follow
from ``p`` alone, so the seed and the search space can change per run without re-parsing the DAG.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from typing import Any, Sequence


def group_on(shard: int, t: int, shards: int) -> int:
    """The group training on ``shard`` at global hop ``t``."""
    return (shard - t) % shards


def shard_of(group: int, t: int, shards: int) -> int:
    """The shard that ``group`` trains on at global hop ``t``."""
    return (group + t) % shards


def upstream_shard(shard: int, shards: int) -> int:
    """Where the models arriving at ``shard`` trained in the previous hop."""
    return (shard - 1) % shards


def hop_key(t: int, shard: int) -> str:
    """XCom key of the assignments of one (hop, shard) training task."""
    return f"t{t:03d}_s{shard:02d}"


@dataclass(frozen=True)
class HopPlan:
    shards: int
    iterations: int
    seed: int
    groups: tuple[tuple[str, ...], ...]

    @property
    def total_hops(self) -> int:
        return self.shards * self.iterations

    def configs_at(self, t: int, shard: int) -> tuple[str, ...]:
        return self.groups[group_on(shard, t, self.shards)]

    def visit_order(self) -> dict[str, list[int]]:
        """For each configuration, the shard it trains on at each global hop."""
        order: dict[str, list[int]] = {}
        for g, members in enumerate(self.groups):
            for cid in members:
                order[cid] = [shard_of(g, t, self.shards) for t in range(self.total_hops)]
        return order

    def to_dict(self) -> dict[str, Any]:
        return {"shards": self.shards, "iterations": self.iterations, "seed": self.seed,
                "groups": [list(g) for g in self.groups], "visit_order": self.visit_order()}


def build_plan(config_ids: Sequence[str], *, shards: int, iterations: int, seed: int) -> HopPlan:
    """Deal the configurations into one group per shard in a seeded order (same seed, same plan)."""
    ids = list(config_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("configuration ids must be unique")
    random.Random(f"mop-plan:{seed}").shuffle(ids)
    groups = tuple(tuple(ids[g::shards]) for g in range(shards))
    return HopPlan(shards=shards, iterations=iterations, seed=seed, groups=groups)


def simulate(plan: HopPlan, *, slots: int, seconds_per_hop: float | dict[str, float] = 1.0) -> list[dict[str, Any]]:
    """Replay the plan the way the DAG runs it: a (hop, shard) task starts when the group it receives
    has finished its previous hop; the shard's pool runs at most ``slots`` models at once.

    Returns one event per model-hop: config_id, t, shard, slot, start, end (seconds). Used for the
    wall-time estimate shown before a run and to check the schedule's invariants.
    """
    cost = (lambda cid: seconds_per_hop[cid]) if isinstance(seconds_per_hop, dict) else (lambda cid: seconds_per_hop)
    ready = {s: 0.0 for s in range(plan.shards)}   # when the group arriving at s may start
    slot_free = {s: [(0.0, k) for k in range(slots)] for s in range(plan.shards)}
    events: list[dict[str, Any]] = []
    for t in range(plan.total_hops):
        finished: dict[int, float] = {}
        for shard in range(plan.shards):
            done = ready[shard]
            for cid in plan.configs_at(t, shard):
                free_at, slot = heapq.heappop(slot_free[shard])
                start = max(free_at, ready[shard])
                end = start + cost(cid)
                heapq.heappush(slot_free[shard], (end, slot))
                events.append({"config_id": cid, "t": t, "shard": shard, "slot": slot, "start": start, "end": end})
                done = max(done, end)
            finished[shard] = done
        ready = {s: finished[upstream_shard(s, plan.shards)] for s in range(plan.shards)}
    return events


def hash_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts: the same on every host and Python process."""
    import zlib

    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def config_seed(seed: int, config_id: str) -> int:
    """The seed of one configuration's initial weights and batch order: stable across runs and hosts."""
    return hash_seed(seed, config_id)
