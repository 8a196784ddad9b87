"""Replay a task plan as Airflow runs it: when each model-hop starts and ends.

:func:`simulate` takes a :class:`~mop_airflow.planning.task_plan.TaskPlan` (the very plan the DAG is
rendered from) and applies Airflow's pool and priority semantics to it; each train task's hops are the
ones production puts on its shard slot, placed by production's own function
(:func:`~mop_airflow.planning.placement.block_hops`), so the simulation, the DAG and the train tasks
cannot drift apart. It gives the wall-time estimate of a plan and drives ``benchmarks/schedule_sim.py``,
which compares it with other MOP schedulers.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from mop_airflow.planning.placement import BlockHop, block_hops
from mop_airflow.planning.schedule import deal_classes
from mop_airflow.planning.task_plan import TaskPlan, TaskSpec
from mop_airflow.records import Assignment


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


Seconds = Callable[[str, int, int], float]
Fuse = Callable[[Sequence[str]], list[list[str]]]


def _own_model(config_id: str) -> str:
    return config_id  # a configuration known only by its id: a model of its own


def simulate(plan: TaskPlan, classes: Sequence[Sequence[str]], seconds: Seconds, *, slots: int,
             task_seconds: float = 0.0, block_ends: Mapping[str, int] | None = None,
             block_starts: Mapping[str, int] | None = None,
             block_classes: Mapping[str, Sequence[Sequence[str]]] | None = None,
             key: Callable[[str], str] = _own_model, fuse: Fuse | None = None) -> Simulation:
    """Replay ``plan`` as Airflow runs it and return every model-hop's start and end.

    - ``classes[o]`` lists the configurations of a plain search's offset class ``o``, in the order
      its shard slots take them (an adaptive search's blocks: ``block_classes``).
    - ``seconds(unit, t, shard)`` is the training time of one hop of a configuration; every task pays
      ``task_seconds`` of fixed cost (Airflow's start-up) once, a train task included, and then
      trains its hops back to back.
    - A shard pool runs at most ``slots`` tasks at once (its Airflow pool's slots; the plan's own
      slots per shard say how many train tasks a block has); tasks outside shard pools never wait. Among
      ready tasks the highest priority weight goes first, then the earliest in the plan.
    - A train task (one shard slot of a block, :mod:`mop_airflow.slots.driver`) trains the hops
      production puts on its shard slot: :func:`~mop_airflow.planning.placement.block_hops`, the
      function the train task calls, deals the block's configurations to the slots by ``key`` (each
      configuration's model key) and ``fuse`` (its class's fused groups), a run's own from
      :func:`~mop_airflow.planning.placement.slot_rules`; by default every configuration is a model of
      its own and none fuse. Idle, it takes its ready hop (the unit's previous hop ended) of the
      highest weight, then the earliest in the block; it ends when its hops are done (at once without
      any). A fused group's hops train one after another here, not as one program.
    - ``block_ends``: where each block of an adaptive search ends (its train tasks' group, ``""`` for
      the first block, ``block_1`` ...), as its decision says at run time; by default the plan's own end;
      ``block_starts``: the hop of the search each begins at (a hop's ``t`` in the events);
      ``block_classes``: what each block's offset classes carry, as its decision deals them.
    Raises when tasks never run: a block whose train tasks cannot all run at once deadlocks, in
    Airflow as here.
    """
    ends = dict(block_ends or {})
    dealt = dict(block_classes or {})
    tasks = {spec.task_id: spec for spec in plan.tasks}
    order = {spec.task_id: k for k, spec in enumerate(plan.tasks)}
    downstream: dict[str, list[str]] = defaultdict(list)
    for spec in plan.tasks:
        for up in spec.upstream:
            downstream[up].append(spec.task_id)
    waiting = {spec.task_id: len(spec.upstream) for spec in plan.tasks}
    done: set[str] = set()
    ready: dict[str, list[tuple[int, int, str]]] = defaultdict(list)   # pool -> heap of tasks
    running: list[tuple[float, int, str, Any]] = []                    # (end, seq, kind, what)
    free_slots = {f"shard:{s}": list(range(slots)) for s in range(plan.shards)}
    processes: dict[str, _Process] = {}   # train task id -> its process, once started
    placed: dict[str, dict[tuple[int, int], list[BlockHop]]] = {}  # block -> (shard, slot) -> its hops
    hop_ends: dict[tuple[str, str, int], float] = {}  # (block, unit, step) -> when that hop ended
    events: list[HopEvent] = []
    seq = 0
    now = 0.0

    def hops_of(spec: TaskSpec) -> list[BlockHop]:
        """The hops of ``spec``'s block on its shard slot, as the train task places them."""
        prefix = spec.task_id.rpartition(".")[0]
        if prefix not in placed:
            placed[prefix] = _slot_hops(plan, spec, classes, ends, dealt, (block_starts or {}).get(prefix, 0),
                                        key, fuse)
        return placed[prefix].get((spec.args["shard"], spec.args["slot"]), [])

    def pool_of(spec: TaskSpec) -> str:
        return f"shard:{spec.args['shard']}" if spec.pool else "free"

    def push(end: float, kind: str, what: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(running, (end, seq, kind, what))

    def complete(first: str) -> None:
        stack = [first]
        while stack:
            task_id = stack.pop()
            done.add(task_id)
            for down in downstream[task_id]:
                waiting[down] -= 1
                if waiting[down]:
                    continue
                spec = tasks[down]
                if spec.kind == "train" and not hops_of(spec):
                    stack.append(down)  # nothing to train on this slot: skipped, takes no slot
                else:
                    heapq.heappush(ready[pool_of(spec)], (-spec.priority_weight, order[down], down))

    def start_hops() -> None:
        for task_id, process in processes.items():
            if process.busy or not process.live:
                continue
            hop = process.next_ready(hop_ends)
            if hop is None:
                continue
            duration = seconds(hop.config_id, hop.hop, hop.shard)
            process.busy = True
            events.append(HopEvent(hop.config_id, task_id, hop.hop, hop.shard, process.pool_slot, now, now + duration))
            push(now + duration, "hop", (task_id, hop))

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
                if spec.kind == "train":
                    processes[task_id] = _Process(spec, hops_of(spec), slot)
                    push(now + task_seconds, "live", task_id)
                else:
                    push(now + task_seconds, "task", (task_id, slot))
        start_hops()
        if not running:
            break
        # Everything that ends at the same instant completes before a free slot is filled: the
        # scheduler sees all of them in one loop and ranks every task they made ready together.
        now = running[0][0]
        while running and running[0][0] == now:
            _, _, kind, what = heapq.heappop(running)
            if kind == "live":
                processes[what].live = True
            elif kind == "hop":
                task_id, hop = what
                process = processes[task_id]
                process.busy = False
                process.pending.remove(hop)
                hop_ends[(process.block, hop.config_id, hop.step)] = now
                if not process.pending:
                    push(now, "task", (task_id, process.pool_slot))
            else:
                task_id, slot = what
                if slot >= 0:
                    free_slots[pool_of(tasks[task_id])].append(slot)
                    free_slots[pool_of(tasks[task_id])].sort()
                processes.pop(task_id, None)
                complete(task_id)
        start_hops()
    unfinished = [t for t in tasks if t not in done]
    if unfinished:
        raise RuntimeError(f"the simulation stalled with {len(unfinished)} tasks never run, e.g. {unfinished[:3]}")
    return Simulation(tuple(events), max((e.end for e in events), default=0.0), slots, plan.shards)


def _slot_hops(plan: TaskPlan, spec: TaskSpec, plain: Sequence[Sequence[str]], ends: Mapping[str, int],
               dealt: Mapping[str, Sequence[Sequence[str]]], shift: int, key: Callable[[str], str],
               fuse: Fuse | None) -> dict[tuple[int, int], list[BlockHop]]:
    """The hops of train task ``spec``'s block on each shard slot: production's
    :func:`~mop_airflow.planning.placement.block_hops`, called as the train task calls it (hop ``t`` of
    class ``o`` on shard ``(o + t) mod p``, each configuration on the slot ``key`` and ``fuse`` deal it
    to); ``shift``: the search's hop the block begins at."""
    prefix = spec.task_id.rpartition(".")[0]
    classes = dealt.get(prefix, ()) if spec.args.get("relative") else plain
    starts = [[Assignment(config_id=cid, t=-1, checkpoint=None) for cid in units] for units in classes]
    by_slot: dict[tuple[int, int], list[BlockHop]] = defaultdict(list)
    for hop in block_hops(starts, shards=plan.shards, slots=plan.slots, start=0, end=ends.get(prefix, spec.args["end"]),
                          priority=plan.priority, shift=shift, key=key, fuse=fuse):
        by_slot[hop.shard, hop.slot].append(hop)
    return by_slot


class _Process:
    """A train task's warm process: its hops still to train, and whether it trains one now."""

    def __init__(self, spec: TaskSpec, hops: list[BlockHop], pool_slot: int) -> None:
        self.block = spec.task_id.rpartition(".")[0]
        self.pending = sorted(hops, key=lambda h: (-h.weight, h.order))
        self.pool_slot = pool_slot
        self.live = False  # started up
        self.busy = False

    def next_ready(self, hop_ends: Mapping[tuple[str, str, int], float]) -> BlockHop | None:
        for hop in self.pending:
            if hop.step == 0 or (self.block, hop.config_id, hop.step - 1) in hop_ends:
                return hop
        return None


def lower_bound(hop_seconds: Mapping[str, float], hops: Mapping[str, int], *, shards: int, slots: int) -> float:
    """No schedule beats max(total work / slots, the longest configuration's own chain)."""
    total = sum(hop_seconds[c] * hops[c] for c in hops)
    return max(total / (shards * slots), max((hop_seconds[c] * hops[c] for c in hops), default=0.0))


def stand_in_blocks(adaptive: Any, config_ids: Sequence[str], *, shards: int, seed: int = 0
                    ) -> list[tuple[int, list[list[str]]]]:
    """An adaptive search's blocks when nobody has trained yet, as (hops, classes): every job completes,
    and the configurations with the lower ids stand in for the ones the ranking will promote (with
    equal hop times, which ones does not matter). Hyperband's and successive halving's blocks end at
    every rung end of the brackets side by side, PBT's at every boundary (its population trains on,
    copies in place of members); each block's classes as the decisions deal them
    (:func:`mop_airflow.planning.blocks.block_length`, :func:`~mop_airflow.planning.blocks.next_classes`)."""
    from mop_airflow.planning.blocks import block_length, next_classes  # noqa: PLC0415
    from mop_airflow.search.adaptive import brackets_of, split_by_bracket  # noqa: PLC0415
    from mop_airflow.search.halving import halving_jobs  # noqa: PLC0415
    from mop_airflow.search.jobs import Completion, Job  # noqa: PLC0415
    from mop_airflow.search.pbt import PbtPlan  # noqa: PLC0415

    ids = list(config_ids)
    if isinstance(adaptive, PbtPlan):
        members = ids[:adaptive.population]
        classes = [list(c) for c in deal_classes(members, shards=shards, seed=seed)]
        points = [0, *adaptive.boundaries, adaptive.iterations]
        return [((b - a) * shards, classes) for a, b in zip(points, points[1:])]
    brackets, by_bracket = brackets_of(adaptive), split_by_bracket(ids, adaptive)

    def ask(done: list[Completion], jobs: list[Job], free: int) -> list[Job]:
        return halving_jobs(brackets, by_bracket, done, [(j.config_id, j.rung - 1) for j in jobs if j.kind == "promote"],
                            [j.config_id for j in jobs if j.kind == "start"], free, direction="min")

    capacity = adaptive.total_configurations
    jobs = ask([], [], capacity)
    training = {j.config_id: 0 for j in jobs}
    rotation: dict[str, int] = {}
    done: list[Completion] = []
    blocks = []
    while training:
        new = list(dict.fromkeys(j.config_id for j in jobs if j.config_id in training and j.config_id not in rotation))
        classes, rotation = next_classes(training, new, shards=shards, rotation=rotation)
        length, ends = block_length(training, jobs, shards)
        blocks.append((length, classes))
        latest = {j.config_id: j for j in jobs}
        done += [Completion(cid, latest[cid].rung, float(int(cid.lstrip("c") or 0)), bracket=latest[cid].bracket)
                 for cid in ends]
        training = {cid: hops + length for cid, hops in training.items() if cid not in ends}
        handed = ask(done, jobs, capacity - len(training))
        for job in handed:
            training[job.config_id] = latest[job.config_id].iterations * shards if job.kind == "promote" else 0
            rotation.pop(job.config_id, None)
        jobs += handed
    return blocks


def estimate_seconds(plan: TaskPlan, configurations: int, *, seconds_per_hop: float, slots: int,
                     adaptive: Any = None, task_seconds: float = 0.0, seed: int = 0) -> Simulation:
    """The plan replayed with every configuration's hop taking ``seconds_per_hop`` (plus
    ``task_seconds`` per task), the configurations dealt as the plan task deals them; an adaptive
    search's blocks as :func:`stand_in_blocks` gives them."""
    ids = [f"c{i:04d}" for i in range(configurations)]

    def seconds(unit: str, t: int, shard: int) -> float:
        return seconds_per_hop

    if adaptive is None:
        return simulate(plan, deal_classes(ids, shards=plan.shards, seed=seed), seconds, slots=slots,
                        task_seconds=task_seconds)
    return simulate_blocks(plan, stand_in_blocks(adaptive, ids, shards=plan.shards, seed=seed), seconds, slots=slots,
                           task_seconds=task_seconds)


def simulate_blocks(plan: TaskPlan, blocks: Sequence[tuple[int, Sequence[Sequence[str]]]], seconds: Seconds, *,
                    slots: int, task_seconds: float = 0.0, key: Callable[[str], str] = _own_model,
                    fuse: Fuse | None = None) -> Simulation:
    """Replay an adaptive search's task plan whose block ``k`` trains ``blocks[k]`` (its hops, and its
    classes as the decision before it dealt them); a block the search never reaches trains nothing.
    ``key``, ``fuse``: as :func:`simulate` takes them."""
    prefixes = sorted({spec.task_id.rpartition(".")[0] for spec in plan.tasks if spec.kind == "train"},
                      key=lambda prefix: int(prefix.split("_")[1]) if prefix else 0)
    by_prefix = dict(zip(prefixes, blocks))
    starts = dict(zip(prefixes, itertools.accumulate((hops for hops, _ in blocks), initial=0)))
    return simulate(plan, (), seconds, slots=slots, task_seconds=task_seconds, key=key, fuse=fuse,
                    block_ends={prefix: hops for prefix, (hops, _) in by_prefix.items()}, block_starts=starts,
                    block_classes={prefix: classes for prefix, (_, classes) in by_prefix.items()})
