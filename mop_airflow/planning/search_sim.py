"""An adaptive search's decisions replayed on a model of MOP's slots, before anything runs.

Time goes in hop steps: in each step every shard slot ``(shard, slot)`` trains at most one hop.
Jobs are placed as production places an ASHA job decided inside the shard slots, by the same rule
(:func:`~mop_airflow.planning.asha_slots.leg_offset`, :func:`~mop_airflow.planning.asha_slots.leg_owner`):
a job is taken by a slot with nothing ready to train (while one has nothing; past that, by the slot
the fewest are heading to); the configuration's first hop of the job is on that slot's shard, its hop
``t`` on shard ``(offset + t) mod p``, and every hop on that slot's index. So each hop has one owner,
and waits while its owner trains another (the one that waited longest first), even with a slot of
the same shard free. When a configuration reaches its job's iterations it completes the rung with a
metric from ``metric_of``; the method (:mod:`mop_airflow.search.asha`,
:mod:`mop_airflow.search.halving`) then answers what trains next for the free capacity. With
``block_hops`` the method is asked only at the end of each block of that many steps (a search
decided between DAG runs), otherwise after every step.

Slot use = hop steps trained / (shards x slots x steps): the fraction of slot time spent training,
fixed costs aside. Pure: no Airflow, no TensorFlow.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from mop_airflow.planning.asha_slots import leg_offset, leg_owner
from mop_airflow.search.jobs import Completion, Job

# (completions, promoted, started, free, block) -> jobs: a method with its plan and members bound;
# ``block``: the blocks of one iteration gone by, the clock an ASHA budget's deadline is counted on
Method = Callable[[Sequence[Completion], Sequence[tuple[str, int]], Sequence[str], int, int], list[Job]]


@dataclass
class SearchSim:
    steps: int = 0
    trained_hops: int = 0
    shards: int = 1
    slots: int = 1
    decisions: list[Job] = field(default_factory=list)
    placed: list[tuple[int, int]] = field(default_factory=list)  # the slot (shard, slot) that took each job
    completions: list[Completion] = field(default_factory=list)
    max_active: int = 0

    @property
    def slot_use(self) -> float:
        return self.trained_hops / (self.shards * self.slots * self.steps) if self.steps else 0.0

    @property
    def iterations(self) -> float:
        return self.trained_hops / self.shards


def synthetic_metric(cid: str, iterations: int, seed: int = 0) -> float:
    """A validation loss that falls with training toward a floor set by the configuration's quality
    (seeded by its id), so early ranks predict late ones, imperfectly."""
    digest = hashlib.sha256(f"{seed}:{cid}".encode()).digest()
    quality = int.from_bytes(digest[:4], "big") / 2**32
    speed = 2 + 8 * int.from_bytes(digest[4:8], "big") / 2**32
    return round(quality + (1 - quality) * math.exp(-iterations / speed), 6)


def simulate_search(method: Method, *, shards: int, slots: int = 1, capacity: int | None = None,
                    block_hops: int | None = None, metric_of: Callable[[str, int], float] = synthetic_metric,
                    bracket_of: Callable[[str], int | None] = lambda cid: None,
                    max_steps: int = 10**6) -> SearchSim:
    """Replay ``method`` until it hands out no more jobs and nothing trains.

    ``capacity``: configurations with a job at once (default: one per slot, ``shards * slots``);
    a job is handed out only while fewer are busy."""
    capacity = shards * slots if capacity is None else capacity
    sim = SearchSim(shards=shards, slots=slots)
    hops: dict[str, int] = {}        # hops trained so far, per configuration
    offset: dict[str, int] = {}
    slot_of: dict[str, int] = {}     # the index of the slot that took the configuration's latest job
    target: dict[str, Job] = {}      # busy configurations and their jobs
    promoted: list[tuple[str, int]] = []
    started: list[str] = []
    waiting_since: dict[str, int] = {}
    every = [(shard, slot) for shard in range(shards) for slot in range(slots)]
    idle_since = dict.fromkeys(every, 0)  # the step since which each slot has trained nothing

    def owner(cid: str) -> tuple[int, int]:
        return leg_owner(offset[cid], slot_of[cid], hops[cid], shards)

    def decide() -> None:
        jobs = method(sim.completions, promoted, started, max(0, capacity - len(target)),
                      sim.steps // (block_hops or shards))
        heading = Counter(owner(cid) for cid in target)
        for job in jobs:
            # In production the slot that takes a job is one with nothing ready to train, which decides
            # it. Here: a slot no busy configuration is heading to, the one idle longest first (it would
            # ask first), then the lowest (shard, slot), so the replay repeats. With more jobs than idle
            # slots (a capacity above one a slot), the slot the fewest are heading to: the one that runs
            # out of ready hops first, and so would ask next.
            shard, slot = min(every, key=lambda s: (heading[s], idle_since[s], s))
            heading[shard, slot] += 1
            if job.kind == "start":
                started.append(job.config_id)
                hops[job.config_id] = 0
            else:
                promoted.append((job.config_id, job.rung - 1))
            # the configuration's next hop (a job starts at an iteration boundary) on the deciding slot
            offset[job.config_id] = leg_offset(shard, hops[job.config_id], shards)
            slot_of[job.config_id] = slot
            target[job.config_id] = job
            waiting_since[job.config_id] = sim.steps
            sim.decisions.append(job)
            sim.placed.append((shard, slot))
        sim.max_active = max(sim.max_active, len(target))

    decide()
    while target and sim.steps < max_steps:
        taken: set[tuple[int, int]] = set()
        # the configuration that has waited longest goes first, then the lower id: repeatable.
        # (Most hops to go first, the DAG's default priority, made Hyperband's run 23 % longer here:
        # it holds back the short rung-0 jobs whose results unlock the promotions.)
        for cid in sorted(target, key=lambda c: (waiting_since[c], c)):
            place = owner(cid)
            if place not in taken:
                taken.add(place)
                hops[cid] += 1
                sim.trained_hops += 1
                waiting_since[cid] = sim.steps + 1
                idle_since[place] = sim.steps + 1
        sim.steps += 1
        for cid in sorted(c for c, job in target.items() if hops[c] == job.iterations * shards):
            job = target.pop(cid)
            sim.completions.append(Completion(cid, job.rung, metric_of(cid, job.iterations), bracket=bracket_of(cid)))
        if block_hops is None or sim.steps % block_hops == 0 or not target:
            decide()
    return sim
