"""An adaptive search's decisions replayed on a model of MOP's slots, before anything runs.

Time goes in hop steps: in each step every slot of every shard can train one hop of one
configuration. A configuration with a job visits the shards in its own rotation (offset ``o``: its
hop ``t`` is on shard ``(o + t) mod p``), one hop at a time; a shard whose slots are taken leaves it
waiting for the next step. When a configuration reaches its job's iterations it completes the rung
with a metric from ``metric_of``; the method (:mod:`mop_airflow.search.asha`,
:mod:`mop_airflow.search.halving`) then answers what trains next for the free capacity. With
``block_hops`` the method is asked only at the end of each block of that many steps (a search
decided between DAG runs), otherwise after every step.

Slot use = hop steps trained / (shards x slots x steps): the fraction of slot time spent training,
fixed costs aside. Pure: no Airflow, no TensorFlow.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

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
    target: dict[str, Job] = {}      # busy configurations and their jobs
    promoted: list[tuple[str, int]] = []
    started: list[str] = []
    waiting_since: dict[str, int] = {}

    def decide() -> None:
        jobs = method(sim.completions, promoted, started, max(0, capacity - len(target)),
                      sim.steps // (block_hops or shards))
        for job in jobs:
            if job.kind == "start":
                started.append(job.config_id)
                hops[job.config_id] = 0
            else:
                promoted.append((job.config_id, job.rung - 1))
            # A job starts at an iteration boundary, where a configuration may change its rotation
            # without seeing a shard twice in an iteration: it joins the shard fewest are heading to.
            heading = [0] * shards
            for cid in target:
                heading[(offset[cid] + hops[cid]) % shards] += 1
            first = min(range(shards), key=lambda sh: (heading[sh], sh))
            offset[job.config_id] = (first - hops[job.config_id]) % shards
            target[job.config_id] = job
            waiting_since[job.config_id] = sim.steps
            sim.decisions.append(job)
        sim.max_active = max(sim.max_active, len(target))

    decide()
    while target and sim.steps < max_steps:
        free = {s: slots for s in range(shards)}
        # the configuration that has waited longest goes first, then the lower id: repeatable.
        # (Most hops to go first, the DAG's default priority, made Hyperband's run 23 % longer here:
        # it holds back the short rung-0 jobs whose results unlock the promotions.)
        for cid in sorted(target, key=lambda c: (waiting_since[c], c)):
            shard = (offset[cid] + hops[cid]) % shards
            if free[shard]:
                free[shard] -= 1
                hops[cid] += 1
                sim.trained_hops += 1
                waiting_since[cid] = sim.steps + 1
        sim.steps += 1
        for cid in sorted(c for c, job in target.items() if hops[c] == job.iterations * shards):
            job = target.pop(cid)
            sim.completions.append(Completion(cid, job.rung, metric_of(cid, job.iterations), bracket=bracket_of(cid)))
        if block_hops is None or sim.steps % block_hops == 0 or not target:
            decide()
    return sim
