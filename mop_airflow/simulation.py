"""Replay a task plan as Airflow runs it: when each model-hop starts and ends.

:func:`simulate` takes a :class:`~mop_airflow.task_plan.TaskPlan` (the very plan the DAG is
rendered from) and applies Airflow's pool and priority semantics to it, so the simulation and the
DAG cannot drift apart. It gives the wall-time estimate of a plan and drives
``benchmarks/schedule_sim.py``, which compares it with other MOP schedulers.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from mop_airflow.schedule import deal_classes, hash_seed
from mop_airflow.task_plan import ClassGroup, TaskPlan

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
"""``members(group, expanded)``: the configurations ``group`` expands over, given the members of
every group expanded before it (a later rung's survivors come from its previous rung's groups)."""
Seconds = Callable[[str, int, int], float]


def simulate(plan: TaskPlan, members: Members, seconds: Seconds, *, slots: int,
             task_seconds: float = 0.0) -> Simulation:
    """Replay ``plan`` as Airflow runs it and return every model-hop's start and end.

    - ``members(group, expanded)`` lists the configurations a class group expands over, asked
      when its source task finishes (see :data:`Members`).
    - ``seconds(config_id, t, shard)`` is the training time of one hop; every task also pays
      ``task_seconds`` of fixed cost (Airflow's start-up), hops included.
    - A shard pool runs at most ``slots`` hops at once; tasks outside shard pools never wait.
    - A free slot takes the ready hop with the highest priority weight, then the lowest map index,
      then the earliest task in the plan (Airflow's scheduler order; the last tie is the order in
      which the database returns rows, which the plan order stands in for).
    """
    tasks = {spec.task_id: spec for spec in plan.tasks}
    order = {spec.task_id: k for k, spec in enumerate(plan.tasks)}
    downstream: dict[str, list[str]] = defaultdict(list)
    for spec in plan.tasks:
        for up in spec.upstream:
            downstream[up].append(spec.task_id)

    # A task instance is (task_id, map_index); unmapped tasks have map index -1.
    expanded: dict[str, list[str]] = {}           # group id -> configurations, once its source finished
    waiting: dict[tuple[str, int], int] = {}      # instance -> upstream instances not yet done
    done: set[str] = set()                        # unmapped tasks done, or mapped tasks with all instances done
    remaining: dict[str, int] = {}                # mapped task -> instances not yet done
    ready: dict[str, list[tuple[int, int, int, str]]] = defaultdict(list)   # pool -> heap
    running: list[tuple[float, int, tuple[str, int], int]] = []               # (end, seq, instance, slot)
    free_slots = {f"shard:{s}": list(range(slots)) for s in range(plan.shards)}
    events: list[HopEvent] = []
    seq = 0
    now = 0.0

    def pool_of(spec) -> str:
        return f"shard:{spec.args['shard']}" if spec.pool else "free"

    def instances(task_id: str) -> list[int]:
        group = tasks[task_id].group
        return [-1] if group is None else list(range(len(expanded[group])))

    def make_ready(instance: tuple[str, int]) -> None:
        spec = tasks[instance[0]]
        heapq.heappush(ready[pool_of(spec)], (-spec.priority_weight, instance[1], order[spec.task_id], spec.task_id))

    def unmapped_upstream_done(spec) -> bool:
        return all(up in done for up in spec.upstream if tasks[up].group != spec.group or spec.group is None)

    def arm(task_id: str) -> None:
        """Create the instances of ``task_id`` once what they wait for can be counted."""
        spec = tasks[task_id]
        if spec.group is not None and spec.group not in expanded:
            return
        if not unmapped_upstream_done(spec):
            return
        mapped_up = [up for up in spec.upstream if spec.group is not None and tasks[up].group == spec.group]
        idx = instances(task_id)
        if not idx:  # an empty expansion: the group's tasks are skipped at once
            finish_task(task_id)
            return
        remaining[task_id] = len(idx)
        for m in idx:
            key = (task_id, m)
            if key in waiting:
                continue
            waiting[key] = len(mapped_up)
            if not mapped_up:
                make_ready(key)

    def finish_task(task_id: str) -> None:
        done.add(task_id)
        spec = tasks[task_id]
        for g in plan.groups:
            if g.source == task_id and g.group_id not in expanded:
                expanded[g.group_id] = list(members(g, dict(expanded)))
                for member_task in (s.task_id for s in plan.tasks if s.group == g.group_id):
                    arm(member_task)
        for down in downstream[task_id]:
            if tasks[down].group is not None and tasks[down].group == spec.group:
                continue  # instance-level edges inside a mapped group are handled in complete()
            arm(down)

    def complete(instance: tuple[str, int]) -> None:
        task_id, m = instance
        spec = tasks[task_id]
        for down in downstream[task_id]:
            if spec.group is not None and tasks[down].group == spec.group and (down, m) in waiting:
                waiting[(down, m)] -= 1
                if waiting[(down, m)] == 0:
                    make_ready((down, m))
        remaining[task_id] -= 1
        if remaining[task_id] == 0:
            finish_task(task_id)

    for spec in plan.tasks:
        if not spec.upstream and spec.group is None:
            arm(spec.task_id)

    while True:
        for pool, heap in ready.items():
            slots_here = free_slots.get(pool)
            while heap and (slots_here is None or slots_here):
                _, m, _, task_id = heapq.heappop(heap)
                spec = tasks[task_id]
                slot = slots_here.pop(0) if slots_here is not None else -1
                duration = task_seconds
                if spec.kind == "hop":
                    cid = expanded[spec.group][m]
                    duration += seconds(cid, spec.args["t"], spec.args["shard"])
                    events.append(HopEvent(cid, task_id, spec.args["t"], spec.args["shard"], slot, now, now + duration))
                seq += 1
                heapq.heappush(running, (now + duration, seq, (task_id, m), slot))
        if not running:
            break
        # Everything that ends at the same instant completes before a free slot is filled: the
        # scheduler sees all of them in one loop and ranks every hop they made ready together.
        now = running[0][0]
        while running and running[0][0] == now:
            _, _, instance, slot = heapq.heappop(running)
            if slot >= 0:
                free_slots[pool_of(tasks[instance[0]])].append(slot)
                free_slots[pool_of(tasks[instance[0]])].sort()
            complete(instance)
    unfinished = [t for t in tasks if t not in done]
    if unfinished:
        raise RuntimeError(f"the simulation stalled with {len(unfinished)} tasks never run, e.g. {unfinished[:3]}")
    return Simulation(tuple(events), max((e.end for e in events), default=0.0), slots, plan.shards)


def simulate_bundles(plan: TaskPlan, bundles: Sequence[Sequence[Sequence[str]]], seconds: Seconds, *, slots: int,
                     task_seconds: float = 0.0, config_seconds: float = 0.0, model_seconds: float = 0.0,
                     keys: Mapping[str, str] | None = None) -> Simulation:
    """Replay a plain search whose class ``o`` expands over ``bundles[o]`` (:mod:`mop_airflow.bundling`).

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
    """The plan replayed with every hop taking ``seconds_per_hop`` (plus ``task_seconds`` per task)."""
    ids = [f"c{i:04d}" for i in range(configurations)]
    return simulate(plan, stand_in_members(plan, ids, adaptive=adaptive), lambda cid, t, shard: seconds_per_hop,
                    slots=slots, task_seconds=task_seconds)
