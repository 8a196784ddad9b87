"""The searches the slot simulation runs, drawn from a seed.

A :class:`Shape` is one schedule's world: the search (a plain grid, successive halving, Hyperband's
brackets side by side, PBT, ASHA), its shards and slots, fused groups, the configurations that fail or
diverge at a drawn hop, and the infrastructure's faults (kills, hangs, late pools, a slow and failing
store). :class:`Search` says which block trains next from the results of the one before, as the
product's decisions between blocks do, ranking with the production rule
(:func:`~mop_airflow.search.promotion.promote`): it is under test. The reference the simulation is
checked against (:mod:`~slot_sim.oracle`) is written apart from it, from the papers. A checkpoint is a
hash chain, ``sha(t) = H(sha(t - 1), config, t, shard)``, and a hop's metric a function of its hash.
No Airflow, no Keras.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from mop_airflow.search.promotion import promote
from mop_airflow.slots.machine import State

MASK = (1 << 64) - 1


def mix(*values: int) -> int:
    """A 64-bit hash of integers (splitmix64 steps): the same in every process, unlike ``hash()``."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = ((h ^ (v & MASK)) * 0xBF58476D1CE4E5B9) & MASK
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & MASK
        h ^= h >> 29
    return h


def after(state: State, index: int, t: int, shard: int) -> State:
    """The checkpoint hop ``t`` of configuration number ``index`` leaves on ``shard``."""
    return State(state.config_id, t, mix(state.checkpoint_sha256 or 0, index, t, shard))


def metric(sha: int) -> float:
    return (sha % 1_000_003) / 1_000_003  # lower is better


@dataclass
class Shape:
    """One schedule: the search and the faults, all drawn from its seed."""

    method: str
    shards: int
    slots: int
    configs: list[str]
    iterations: int = 1  # grid
    runs: int = 1  # grid: the search split into this many blocks (schedule.iterations_per_run)
    eta: int = 2
    rungs: tuple = ()  # successive halving, ASHA: iterations at each rung's end
    brackets: tuple = ()  # Hyperband: ((configs, rung ends), ...)
    pbt_blocks: int = 0
    budget: int | None = None  # ASHA
    fuse: int = 1  # configurations of one model key that may train as one program
    fail: dict = field(default_factory=dict)  # config -> (hop, status): fails there whenever trained
    # infrastructure
    wait: float = 120.0
    stall: float = 30.0
    retries: int = 2
    retry_delay: tuple = (5.0, 20.0)
    detect: float = 2.0  # at most, until Airflow sees a try's process gone
    scheduler_late: float = 2.0  # at most, a task's start after it is due
    give_back: float = 30.0
    latency: tuple = (0.001, 0.01)
    transient: float = 0.0  # share of store requests that fail and are retried
    conflict: float = 0.0  # share of exclusive creates answered 409 and retried
    lag: float = 0.0  # share of markers listed late
    lag_most: float = 0.0
    poll_most: float = 0.05
    durations: dict = field(default_factory=dict)  # config -> a hop's seconds
    late: dict = field(default_factory=dict)  # (block, shard, slot) -> seconds its pool is held elsewhere
    faults: list = field(default_factory=list)  # (block, shard, slot, seconds into the block, "kill" | "stop")
    benign: bool = True  # every fault within what the protocol must absorb: the search must succeed

    @property
    def index(self) -> dict:
        return {cid: i for i, cid in enumerate(self.configs)}

    def silence(self) -> float:
        """The longest a slot may show no progress from infrastructure faults within the envelope: hung
        until its watchdog kills it, seen gone, retried, started late, its status read late."""
        return (self.stall + self.detect + self.retry_delay[1] + self.scheduler_late + 2 * 5.0
                + 4 * (self.latency[1] + 2.0 * (self.transient > 0)))


@dataclass
class Block:
    """Configurations ``members`` ((config, offset class), in the plan's order) train hops ``start`` to
    ``end - 1`` from ``starts``; ``ends``: those whose rung ends at ``end`` (evaluated there)."""

    index: int
    start: int
    end: int
    members: list
    starts: dict
    ends: frozenset = frozenset()
    copies: dict = field(default_factory=dict)  # PBT: config -> the state it was copied to


def draw(rng: random.Random) -> Shape:
    """A random schedule: small shapes mostly (the interleavings that break a protocol show at a few
    shards), up to 16 shards x 3 slots."""
    shards = rng.choice((1, 2, 2, 3, 3, 4, 4, 4, 5, 6, 8, 12, 16))
    slots = rng.choice((1, 1, 1, 2, 2, 3))
    method = rng.choice(("grid",) * 5 + ("sha", "sha", "hyperband", "hyperband", "pbt", "asha", "asha", "asha"))
    room = rng.choice((12, 24, 36, 72))  # hops in all, about: the interleavings that break show in small ones
    s = Shape(method, shards, slots, [])
    if method == "grid":
        s.iterations = rng.choice((1, 1, 2, 2, 3))
        n = rng.randint(1, max(1, min(24, room // (s.iterations * shards))))
        s.runs = 2 if s.iterations > 1 and rng.random() < 0.3 else 1
    elif method == "sha":
        s.eta = rng.choice((2, 3))
        s.rungs = (1, s.eta) if rng.random() < 0.7 or shards > 4 else (1, s.eta, s.eta ** 2)
        n = rng.randint(s.eta, max(s.eta, min(12, room // shards)))
    elif method == "hyperband":
        s.eta, top = 2, 1 if shards > 4 or rng.random() < 0.6 else 2
        R = 2 ** top
        s.brackets = tuple((max(1, (top + 1) * 2 ** b // (b + 1)), tuple(R // 2 ** (b - i) for i in range(b + 1)))
                           for b in range(top, -1, -1))
        n = sum(c for c, _ in s.brackets)
    elif method == "pbt":
        s.pbt_blocks = rng.choice((2, 3))
        n = rng.randint(2, max(2, min(8, room // (s.pbt_blocks * shards))))
    else:
        s.eta = rng.choice((2, 3))
        s.rungs = (1, s.eta) if rng.random() < 0.7 or shards > 4 else (1, s.eta, s.eta ** 2)
        n = rng.randint(2, max(2, min(9, room // shards)))
        if rng.random() < 0.3:
            s.budget = shards * slots * s.rungs[-1] * rng.choice((1, 2))
    s.configs = [f"c{i:02d}" for i in range(n)]
    s.fuse = rng.choice((2, 3)) if method != "asha" and rng.random() < 0.25 else 1
    failing = rng.choice((0.0, 0.0, 0.15, 0.4))
    longest = hops_each(s)
    for cid in s.configs:
        if rng.random() < failing:
            t = rng.randrange(longest)
            s.fail[cid] = (t, "failed" if t == 0 else rng.choice(("diverged", "failed")))
    s.durations = {cid: rng.uniform(0.5, 4.0) for cid in s.configs}
    s.retries = rng.choice((1, 2, 3))
    s.stall = rng.uniform(10.0, 40.0)
    s.detect = rng.choice((1.0, 2.0, 20.0))
    s.retry_delay = (5.0, rng.choice((10.0, 20.0)))
    s.scheduler_late = rng.choice((0.5, 2.0, 5.0))
    remote = rng.random() < 0.5
    s.latency = (0.02, 0.2) if remote else (0.001, 0.01)
    s.poll_most = 0.5 if remote else 0.05
    s.transient = rng.choice((0.0, 0.0, 0.01, 0.05))
    s.conflict = rng.choice((0.0, 0.1, 0.3))
    if rng.random() < 0.15:  # an endpoint whose listings show new names late
        s.lag, s.lag_most = rng.choice((0.01, 0.05)), rng.uniform(0.2, 3.0)
    s.wait = 120.0 if rng.random() < 0.8 else rng.uniform(20.0, 90.0)
    s.benign = s.wait > s.silence()
    blocks = max(1, s.runs, len(s.rungs) if method == "sha" else 1, s.pbt_blocks,
                 len({e for _, ends in s.brackets for e in ends}))
    span = longest * sum(s.durations.values()) / max(1, shards * slots) + 10.0
    places = [(b, shard, slot) for b in range(blocks) for shard in range(shards) for slot in range(slots)]
    for _ in range(rng.choice((0, 0, 0, 1, 2))):  # pools held elsewhere: mostly briefly, sometimes past the wait
        place = rng.choice(places)
        s.late[place] = rng.uniform(100.0, 300.0) if rng.random() < 0.2 else rng.uniform(1.0, 60.0)
        s.benign = s.benign and s.late[place] + 2 * 5.0 + s.scheduler_late < s.wait
    count = {}
    for _ in range(rng.choice((0, 0, 1, 1, 2, 3, 6))):  # slots killed or hung, at a random moment
        place = rng.choice(places)
        count[place] = count.get(place, 0) + 1
        s.faults.append((*place, rng.uniform(0.0, span / blocks), rng.choice(("kill", "stop"))))
    s.benign = s.benign and all(c <= s.retries for c in count.values())
    return s


def hops_each(s: Shape) -> int:
    """The most hops one configuration trains."""
    if s.method == "grid":
        return s.iterations * s.shards
    if s.method in ("sha", "asha"):
        return s.rungs[-1] * s.shards
    if s.method == "hyperband":
        return max(ends[-1] for _, ends in s.brackets) * s.shards
    return s.pbt_blocks * s.shards


class Search:
    """Which block trains next, from the results of the last one (``results``: config -> ("ok", State)
    or ("failed", hop, shard, status)): the rule of each method, for the simulation and the oracle."""

    def __init__(self, shape: Shape) -> None:
        self.s = shape
        p = shape.shards
        if shape.method == "grid":
            cut = [shape.iterations * p * k // shape.runs for k in range(shape.runs + 1)]
            cut = [c - c % p for c in cut[:-1]] + [cut[-1]]
            self.bounds = sorted(set(cut))
        elif shape.method == "sha":
            self.bounds = [0] + [r * p for r in shape.rungs]
        elif shape.method == "hyperband":
            self.bounds = [0] + sorted({e * p for _, ends in shape.brackets for e in ends})
            self.bracket = {}
            i = 0
            for b, (count, ends) in enumerate(shape.brackets):
                for cid in shape.configs[i:i + count]:
                    self.bracket[cid] = b
                i += count
        else:
            self.bounds = [k * p for k in range(shape.pbt_blocks + 1)]

    def first(self) -> Block:
        members = [(cid, i % self.s.shards) for i, cid in enumerate(self.s.configs)]
        return self._block(0, members, {cid: State(cid, -1, None) for cid in self.s.configs})

    def _block(self, k: int, members: list, starts: dict, copies: dict | None = None) -> Block:
        start, end = self.bounds[k], self.bounds[k + 1]
        ends = frozenset()
        if self.s.method == "sha":
            ends = frozenset(cid for cid, _ in members)
        elif self.s.method == "hyperband":
            ends = frozenset(cid for cid, _ in members if end // self.s.shards in self.s.brackets[self.bracket[cid]][1])
        return Block(k, start, end, members, starts, ends, copies or {})

    def next(self, block: Block, results: dict) -> Block | None:
        k = block.index + 1
        if k + 1 >= len(self.bounds):
            return None
        ok = [cid for cid, _ in block.members if results[cid][0] == "ok"]
        ranked = [{"config_id": cid, "metric": metric(results[cid][1].checkpoint_sha256), "status": "ok"} for cid in ok]
        keep = set(ok)
        copies = {}
        if self.s.method == "sha":
            keep = set(promote(ranked, keep=max(1, len(ok) // self.s.eta), direction="min")[0]) if ok else set()
        elif self.s.method == "hyperband":
            for b, (count, ends) in enumerate(self.s.brackets):
                rung = [r for r in ranked if self.bracket[r["config_id"]] == b]
                if block.end // self.s.shards in ends:
                    top = ends.index(block.end // self.s.shards) == len(ends) - 1
                    kept = [] if top or not rung else promote(rung, keep=max(1, len(rung) // self.s.eta),
                                                              direction="min")[0]
                    keep -= {r["config_id"] for r in rung} - set(kept)
        elif self.s.method == "pbt" and len(ok) >= 2:
            order = promote(ranked, keep=len(ranked), direction="min")[0]
            q = max(1, len(order) // 4)
            index = self.s.index
            for donor, taker in zip(order[:q], order[-q:]):
                if donor != taker:
                    sha = mix(results[donor][1].checkpoint_sha256, index[taker], 77)
                    copies[taker] = State(taker, block.end - 1, sha)
        members = [(cid, o) for cid, o in block.members if cid in keep]
        if not members:
            return None
        starts = {cid: copies.get(cid, results[cid][1]) for cid, _ in members}
        return self._block(k, members, starts, copies)


def describe(s: Shape) -> str:
    what = {"grid": f"{s.iterations} iteration(s) in {s.runs} run(s)", "sha": f"rungs {s.rungs}",
            "hyperband": f"brackets {s.brackets}", "pbt": f"{s.pbt_blocks} blocks",
            "asha": f"rungs {s.rungs}, budget {s.budget}"}[s.method]
    return (f"{s.method} ({what}) of {len(s.configs)} configuration(s) on {s.shards} shard(s) x {s.slots} slot(s)"
            f"{f', fused by {s.fuse}' if s.fuse > 1 else ''}; failing {dict(sorted(s.fail.items()))}; "
            f"wait {s.wait:.0f} s, stall {s.stall:.0f} s, retries {s.retries}; faults {len(s.faults)}, "
            f"late pools {len(s.late)}, listing lag {s.lag}; {'within' if s.benign else 'beyond'} the envelope")
