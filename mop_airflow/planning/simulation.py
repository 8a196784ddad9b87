"""Replay a task plan as Airflow runs it: when each model-hop starts and ends.

:func:`simulate` takes a :class:`~mop_airflow.planning.task_plan.TaskPlan` (the very plan the DAG is
rendered from) and applies Airflow's pool and priority semantics to it, so the simulation and the
DAG cannot drift apart. It gives the wall-time estimate of a plan and drives
``benchmarks/schedule_sim.py``, which compares it with other MOP schedulers.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from mop_airflow.planning.schedule import deal_classes, hash_seed
from mop_airflow.planning.task_plan import ClassGroup, TaskPlan, TaskSpec

@dataclass(frozen=True)
class HopEvent:
    """One model-hop as the simulation ran it."""

    config_id: str
    task_id: str
    t: int
    shard: int
    slot: int
    start: float
    end: float


@dataclass(frozen=True)
class Simulation:
    events: tuple[HopEvent, ...]
    makespan: float
    slots: int
    shards: int

    @property
    def busy_fraction(self) -> float:
        """Share of the shard slots' time (up to the makespan) taken by hops (training plus each
        hop's fixed ``task_seconds``)."""
        work = sum(e.end - e.start for e in self.events)
        return work / (self.makespan * self.shards * self.slots) if self.makespan else 1.0


Members = Callable[[ClassGroup, Mapping[str, Sequence[str]]], Sequence[str]]
"""``members(group, expanded)``: what the chains of ``group`` carry (configurations, or bundles),
given what every group expanded before it carries (a later rung's survivors come from its previous
rung's groups). Chain ``k`` carries the ``k``-th; chains past the list are skipped."""
Seconds = Callable[[str, int, int], float]


def simulate(plan: TaskPlan, members: Members, seconds: Seconds, *, slots: int,
             task_seconds: float = 0.0) -> Simulation:
    """Replay ``plan`` as Airflow runs it and return every model-hop's start and end.

    - ``members(group, expanded)`` lists what a class group's chains carry, asked when its source
      task finishes (see :data:`Members`); a chain with nothing to carry is skipped at once, as the
      source task skips it in Airflow.
    - ``seconds(unit, t, shard)`` is the training time of one hop of what a chain carries; every
      task also pays ``task_seconds`` of fixed cost (Airflow's start-up), hops included.
    - A shard pool runs at most ``slots`` hops at once; tasks outside shard pools never wait.
    - A free slot takes the ready hop with the highest priority weight, then the earliest task in the
      plan (Airflow's scheduler order within one run; the last tie is the order in which the database
      returns rows, which the plan order stands in for).
    """
    tasks = {spec.task_id: spec for spec in plan.tasks}
    order = {spec.task_id: k for k, spec in enumerate(plan.tasks)}
    downstream: dict[str, list[str]] = defaultdict(list)
    for spec in plan.tasks:
        for up in spec.upstream:
            downstream[up].append(spec.task_id)
    sourced: dict[str, list[ClassGroup]] = defaultdict(list)
    for group in plan.groups:
        sourced[group.source].append(group)

    expanded: dict[str, list[str]] = {}   # group id -> what its chains carry, once its source finished
    waiting = {spec.task_id: len(spec.upstream) for spec in plan.tasks}
    done: set[str] = set()
    ready: dict[str, list[tuple[int, int, str]]] = defaultdict(list)   # pool -> heap
    running: list[tuple[float, int, str, int]] = []                    # (end, seq, task id, slot)
    free_slots = {f"shard:{s}": list(range(slots)) for s in range(plan.shards)}
    events: list[HopEvent] = []
    seq = 0
    now = 0.0

    def pool_of(spec: TaskSpec) -> str:
        return f"shard:{spec.args['shard']}" if spec.pool else "free"

    def carried(spec: TaskSpec) -> str | None:
        units = expanded[spec.group]
        return units[spec.args["chain"]] if spec.args["chain"] < len(units) else None

    def complete(first: str) -> None:
        stack = [first]
        while stack:
            task_id = stack.pop()
            done.add(task_id)
            for group in sourced[task_id]:
                expanded[group.group_id] = list(members(group, dict(expanded)))
                if len(expanded[group.group_id]) > group.chains:
                    raise ValueError(f"{group.group_id} has {group.chains} chain(s) but {len(expanded[group.group_id])} "
                                     "bundles to carry: build the plan with enough chains, or bundle first")
            for down in downstream[task_id]:
                waiting[down] -= 1
                if waiting[down]:
                    continue
                spec = tasks[down]
                if spec.kind == "hop" and carried(spec) is None:
                    stack.append(down)  # skipped: nothing to carry, takes no slot
                else:
                    heapq.heappush(ready[pool_of(spec)], (-spec.priority_weight, order[down], down))

    for spec in plan.tasks:
        if not spec.upstream:
            heapq.heappush(ready[pool_of(spec)], (-spec.priority_weight, order[spec.task_id], spec.task_id))

    while True:
        for pool, heap in ready.items():
            slots_here = free_slots.get(pool)
            while heap and (slots_here is None or slots_here):
                _, _, task_id = heapq.heappop(heap)
                spec = tasks[task_id]
                slot = slots_here.pop(0) if slots_here is not None else -1
                duration = task_seconds
                if spec.kind == "hop":
                    unit = carried(spec)
                    duration += seconds(unit, spec.args["t"], spec.args["shard"])
                    events.append(HopEvent(unit, task_id, spec.args["t"], spec.args["shard"], slot, now, now + duration))
                seq += 1
                heapq.heappush(running, (now + duration, seq, task_id, slot))
        if not running:
            break
        # Everything that ends at the same instant completes before a free slot is filled: the
        # scheduler sees all of them in one loop and ranks every hop they made ready together.
        now = running[0][0]
        while running and running[0][0] == now:
            _, _, task_id, slot = heapq.heappop(running)
            if slot >= 0:
                free_slots[pool_of(tasks[task_id])].append(slot)
                free_slots[pool_of(tasks[task_id])].sort()
            complete(task_id)
    unfinished = [t for t in tasks if t not in done]
    if unfinished:
        raise RuntimeError(f"the simulation stalled with {len(unfinished)} tasks never run, e.g. {unfinished[:3]}")
    return Simulation(tuple(events), max((e.end for e in events), default=0.0), slots, plan.shards)


def simulate_bundles(plan: TaskPlan, bundles: Sequence[Sequence[Sequence[str]]], seconds: Seconds, *, slots: int,
                     task_seconds: float = 0.0, config_seconds: float = 0.0, model_seconds: float = 0.0,
                     keys: Mapping[str, str] | None = None) -> Simulation:
    """Replay a plain search whose class ``o`` expands over ``bundles[o]`` (:mod:`mop_airflow.planning.bundling`).

    A bundle's hop takes its configurations' ``seconds`` one after another, plus ``config_seconds``
    each (restoring and saving its state), plus ``model_seconds`` per distinct model key in it
    (building a model and tracing its train step once per task), plus the task's ``task_seconds``.
    Events name the bundle (``b<index>``).
    """
    members: dict[str, list[str]] = {}
    per_class: list[list[str]] = []
    for per in bundles:
        per_class.append([])
        for bundle in per:
            bid = f"b{len(members)}"
            members[bid] = list(bundle)
            per_class[-1].append(bid)

    def bundle_seconds(bid: str, t: int, shard: int) -> float:
        configs = members[bid]
        models = len({(keys or {}).get(cid, cid) for cid in configs}) if keys is not None else 1
        return sum(seconds(cid, t, shard) + config_seconds for cid in configs) + model_seconds * models

    return simulate(plan, lambda group, expanded: per_class[group.offset], bundle_seconds, slots=slots,
                    task_seconds=task_seconds)


def lower_bound(hop_seconds: Mapping[str, float], hops: Mapping[str, int], *, shards: int, slots: int) -> float:
    """No schedule beats max(total work / slots, the longest configuration's own chain)."""
    total = sum(hop_seconds[c] * hops[c] for c in hops)
    return max(total / (shards * slots), max((hop_seconds[c] * hops[c] for c in hops), default=0.0))


def stand_in_members(plan: TaskPlan, config_ids: Sequence[str], *, adaptive: Any = None, seed: int = 0) -> Members:
    """Who each class group expands over when nobody has trained yet: the configurations dealt as the
    plan task deals them; at a later rung the first ``keep`` of the previous rung (by id) stand in
    for the ones the ranking will promote (with equal hop times, which ones does not matter)."""
    if adaptive is None:
        classes = deal_classes(config_ids, shards=plan.shards, seed=seed)
        return lambda group, expanded: classes[group.offset]
    from mop_airflow.search.adaptive import split_by_bracket  # noqa: PLC0415

    by_bracket = split_by_bracket(list(config_ids), adaptive)
    keep = {(s.args["bracket"], s.args["rung"]): s.args["keep"] for s in plan.tasks if s.kind == "promote"}

    def members(group: ClassGroup, expanded: Mapping[str, Sequence[str]]) -> Sequence[str]:
        if group.rung == 0:
            candidates = by_bracket[group.bracket]
        else:
            previous = sorted(cid for g in plan.groups if (g.bracket, g.rung) == (group.bracket, group.rung - 1)
                              for cid in expanded[g.group_id])
            candidates = previous[:keep[(group.bracket, group.rung - 1)]]
        return deal_classes(candidates, shards=plan.shards, seed=hash_seed(seed, group.bracket, group.rung))[
            group.offset]

    return members


def estimate_seconds(plan: TaskPlan, configurations: int, *, seconds_per_hop: float, slots: int,
                     adaptive: Any = None, task_seconds: float = 0.0) -> Simulation:
    """The plan replayed with every configuration's hop taking ``seconds_per_hop`` (plus
    ``task_seconds`` per task): each class's configurations fill its chains as evenly as they can."""
    ids = [f"c{i:04d}" for i in range(configurations)]
    per_config = stand_in_members(plan, ids, adaptive=adaptive)
    carried: dict[str, list[str]] = {}

    def members(group: ClassGroup, expanded: Mapping[str, Sequence[str]]) -> list[str]:
        configs = {g: [cid for unit in units for cid in carried[unit]] for g, units in expanded.items()}
        mine = list(per_config(group, configs))
        chains = min(group.chains, len(mine))
        units = [f"{group.group_id}/{k}" for k in range(chains)]
        for k, unit in enumerate(units):
            carried[unit] = mine[k::chains]
        return units

    return simulate(plan, members, lambda unit, t, shard: seconds_per_hop * len(carried[unit]), slots=slots,
                    task_seconds=task_seconds)
