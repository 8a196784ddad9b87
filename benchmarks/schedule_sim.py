"""How close each model-hopping policy gets to the lower bound on wall time. Prints figures.

Every policy replays the same workload: ``n`` configurations, ``p`` shards, ``iterations`` passes
over the data (``iterations * p`` hops per configuration), each shard a pool of ``slots`` slots,
and one duration per configuration for each of its hops (all 1.0 s, or spread log-uniformly over
60x: ``60 ** U(0, 1)`` seconds). No policy pays any fixed cost per hop (task start-up, polling
excepted where named), so the figures compare the scheduling policies alone.

Policies:

  mop_airflow                  this project's DAG: :func:`mop_airflow.planning.simulation.simulate` on the plan of
                               :func:`mop_airflow.planning.task_plan.build_task_plan`. Configurations are dealt into
                               p offset classes; each configuration's hops form an independent chain
                               (no barrier, no groups) on the shard slot a train task puts it on
                               (:func:`mop_airflow.planning.placement.block_hops`, every configuration a
                               model of its own); a free slot takes its ready hop with the highest
                               priority weight. "remaining" (the default rule) is compared with the
                               other rules, "done" and "none".
  group rotation               the previous mop_airflow (re-implemented here; it left the library):
                               p fixed groups rotating in lockstep. The (hop t, shard s) task starts when
                               the group it receives finished hop t - 1 on shard s - 1, and trains that
                               group's configurations through the shard's slots. Its makespan equals
                               MADlib's: a group waits for the group ahead to leave, which waits for
                               the one ahead of it, and so on round the ring to the slowest group, so
                               the whole ring moves at the slowest group's pace, as with a barrier.
  MADlib                       madlib_keras_fit_multiple_model: one SQL statement per hop, models rotate
                               to the next segment (LEAD(dist_key)); every segment trains its models
                               for one sub-epoch, then all wait for the slowest (a barrier after every
                               hop). With slots > 1 a segment spreads its models over its slots (list
                               scheduling in class order), but the hop still ends at the barrier.
  Cerebro                      cerebro/backend/spark/backend.py, train_for_one_epoch: all (model, worker)
                               pairs in a shuffled order; on each pass over the workers, an idle worker
                               takes the first pair in that order for it whose model is idle, and a
                               busy worker whose sub-epoch ended is freed (it takes new work on the
                               next pass); an epoch ends when every pair ran (a barrier per epoch).
                               Here a worker is one slot of a shard. Cerebro sleeps 2 s between passes
                               (its polling period): rows "poll 0 s" (event-driven, an ideal Cerebro)
                               and "poll 2 s" (as shipped). Cerebro's own seeding line is
                               ``random.seed = 2020``, which seeds nothing; here the order is seeded per
                               workload seed and epoch so the figures are repeatable.

All policies deal the configurations with the same :func:`~mop_airflow.planning.schedule.deal_classes`
(group rotation's groups, MADlib's initial segments and mop_airflow's offset classes coincide).

Efficiency = lower bound / makespan, with lower bound = max(total work / (shards * slots), the
longest configuration's own chain) (:func:`mop_airflow.planning.simulation.lower_bound`); 1.0 is optimal.

Adaptive searches (``--adaptive``): Hyperband and ASHA as their decision modules answer "what trains
next?" (:mod:`mop_airflow.search.halving`, :mod:`mop_airflow.search.asha`), replayed on p shards of
one slot by :func:`mop_airflow.planning.search_sim.simulate_search` (each job placed as production places
an ASHA job decided inside the shard slots) with a synthetic learning curve per configuration, decided
after every hop step or only between blocks of one iteration (a search decided between DAG runs). Slot use is the fraction of slot time spent training. ASHA gets Hyperband's budget:
the smallest ``n`` whose synchronous-halving budget reaches Hyperband's iterations, or Hyperband's
iterations as its own ``budget`` (a deadline: no leg begins that would end after it). "at R": the
configurations that completed the top rung; "best loss": the best synthetic loss among them.

    python benchmarks/schedule_sim.py [--seeds 10] [--iterations 3] [--quick]
    python benchmarks/schedule_sim.py --adaptive [--R 81] [--eta 3] [--shards 16]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import header  # noqa: E402
from mop_airflow.planning.schedule import deal_classes  # noqa: E402
from mop_airflow.planning.simulation import HopEvent, lower_bound, simulate  # noqa: E402
from mop_airflow.planning.task_plan import build_task_plan  # noqa: E402

SCALES = ((16, 8), (256, 8), (256, 16), (16, 16))  # (configurations, shards)
QUICK_SCALES = ((16, 8), (16, 16))
SLOTS = (1, 2)
DURATIONS = ("equal", "spread")
SPREAD = 60.0  # the slowest configuration's hop takes up to this many times the fastest's
CEREBRO_POLLS = (0.0, 2.0)
MOP_RULES = ("remaining", "done", "none")
TARGET = 0.97  # mop_airflow's efficiency goal on spread durations


# -- workload ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """``ids`` train ``iterations * shards`` hops each, every hop of ``cid`` taking ``cost[cid]`` s."""

    ids: tuple[str, ...]
    cost: dict[str, float]
    shards: int
    iterations: int
    slots: int
    seed: int

    @property
    def hops(self) -> dict[str, int]:
        return {cid: self.iterations * self.shards for cid in self.ids}

    @property
    def lower_bound(self) -> float:
        return lower_bound(self.cost, self.hops, shards=self.shards, slots=self.slots)

    @property
    def classes(self) -> tuple[tuple[str, ...], ...]:
        return deal_classes(self.ids, shards=self.shards, seed=self.seed)


def make_workload(n: int, shards: int, *, iterations: int = 3, slots: int = 1, durations: str = "spread",
                  seed: int = 0) -> Workload:
    """``n`` configurations with equal (1.0 s) or log-uniformly spread (1 to 60 s) hop durations."""
    if durations not in DURATIONS:
        raise ValueError(f"durations {durations!r} is not one of {DURATIONS}")
    ids = tuple(f"c{i:03d}" for i in range(n))
    rng = random.Random(f"schedule-sim:{durations}:{n}:{seed}")
    cost = {cid: (SPREAD ** rng.random() if durations == "spread" else 1.0) for cid in ids}
    return Workload(ids, cost, shards, iterations, slots, seed)


@dataclass(frozen=True)
class Result:
    makespan: float
    events: tuple[HopEvent, ...]


Policy = Callable[[Workload], Result]


# -- policies ---------------------------------------------------------------------------------

def run_mop(w: Workload, priority: str = "remaining") -> Result:
    """This DAG: the task plan replayed by the library's own simulator."""
    plan = build_task_plan(w.shards, w.iterations, priority=priority, slots=w.slots)
    sim = simulate(plan, w.classes, lambda cid, t, shard: w.cost[cid], slots=w.slots)
    return Result(sim.makespan, sim.events)


def run_group_rotation(w: Workload) -> Result:
    """The previous mop_airflow: p groups rotating in lockstep, one (hop, shard) task per group and hop.

    Group g sits on shard (g + t) mod p at hop t. The task (t, s) receives the group that left
    shard s - 1 and starts once that whole task finished; the shard's pool runs its members through
    ``slots`` slots in group order (slots carry over from the previous hop's task on that shard).
    In effect every group waits, round the ring, for the slowest group, so the makespan is the
    slowest group's time per hop times the hops, as with MADlib's barrier (the two agree on every
    workload of the table).
    """
    p, groups = w.shards, w.classes
    ready = {s: 0.0 for s in range(p)}  # when the group arriving at s may start
    slot_free = {s: [(0.0, k) for k in range(w.slots)] for s in range(p)}
    events: list[HopEvent] = []
    for t in range(w.iterations * p):
        finished: dict[int, float] = {}
        for shard in range(p):
            done = ready[shard]
            for cid in groups[(shard - t) % p]:
                free_at, slot = heapq.heappop(slot_free[shard])
                start = max(free_at, ready[shard])
                end = start + w.cost[cid]
                heapq.heappush(slot_free[shard], (end, slot))
                events.append(HopEvent(cid, "", t, shard, slot, start, end))
                done = max(done, end)
            finished[shard] = done
        ready = {s: finished[(s - 1) % p] for s in range(p)}
    return Result(max((e.end for e in events), default=0.0), tuple(events))


def run_madlib(w: Workload) -> Result:
    """MADlib's fit_multiple_model: round-robin rotation with a barrier after every hop."""
    p, classes = w.shards, w.classes
    barrier = 0.0
    events: list[HopEvent] = []
    for t in range(w.iterations * p):
        hop_end = barrier
        for shard in range(p):
            slots = [(barrier, k) for k in range(w.slots)]
            for cid in classes[(shard - t) % p]:  # the class whose rotation brought it here
                free_at, slot = heapq.heappop(slots)
                end = free_at + w.cost[cid]
                heapq.heappush(slots, (end, slot))
                events.append(HopEvent(cid, "", t, shard, slot, free_at, end))
                hop_end = max(hop_end, end)
        barrier = hop_end
    return Result(barrier, tuple(events))


def run_cerebro(w: Workload, poll: float = 0.0) -> Result:
    """Cerebro's randomized greedy scheduler with a barrier per epoch; ``poll`` is its sleep between passes.

    A pass visits the workers (shard-major, then slot) in order: an idle worker takes the first
    pair (model, its shard) in the shuffled order whose model is idle; a busy worker whose
    sub-epoch has ended by now is freed. With ``poll == 0`` passes repeat at the same instant
    until nothing changes, then time jumps to the next end; otherwise passes happen every
    ``poll`` seconds from the epoch's start, and after the pass that frees the last pair the
    scheduler sleeps once more before the next epoch (as its loop does). The makespan is the
    pass that sees the last hop end.
    """
    p = w.shards
    workers = [(s, k) for s in range(p) for k in range(w.slots)]
    visits = {cid: 0 for cid in w.ids}  # hops done so far: the t of the next one
    events: list[HopEvent] = []
    now = 0.0
    for epoch in range(w.iterations):
        pairs = [(cid, s) for cid in w.ids for s in range(p)]
        random.Random(f"cerebro:{w.seed}:{epoch}").shuffle(pairs)
        todo: dict[int, list[str]] = {s: [] for s in range(p)}  # per shard, its models in pair order
        for cid, s in pairs:
            todo[s].append(cid)
        left = len(pairs)
        busy: set[str] = set()
        running: dict[int, tuple[float, str]] = {}  # worker -> (end, model)
        start, polls = now, 0
        while left:
            changed = False
            for wi, (s, slot) in enumerate(workers):
                job = running.get(wi)
                if job is None:
                    cid = next((c for c in todo[s] if c not in busy), None)
                    if cid is not None:
                        end = now + w.cost[cid]
                        running[wi] = (end, cid)
                        busy.add(cid)
                        events.append(HopEvent(cid, "", visits[cid], s, slot, now, end))
                        visits[cid] += 1
                        changed = True
                elif job[0] <= now:
                    todo[s].remove(job[1])
                    busy.discard(job[1])
                    del running[wi]
                    left -= 1
                    changed = True
            if not left:
                break
            if poll == 0.0:
                if not changed:
                    now = min(end for end, _ in running.values())
            else:
                if changed:
                    polls += 1
                else:  # nothing happens before the first poll at or after the next end
                    first_end = min(end for end, _ in running.values())
                    polls = max(polls + 1, int(-(-(first_end - start) // poll)))
                    while start + polls * poll < first_end:  # guard against rounding
                        polls += 1
                now = start + polls * poll
        makespan = now
        now += poll  # the loop's sleep after its last pass
    return Result(makespan if w.ids else 0.0, tuple(events))


def policies() -> list[tuple[str, Policy]]:
    """(row label, policy) in the order the table prints them; mop_airflow's default rule first."""
    rows: list[tuple[str, Policy]] = [
        (f"mop_airflow (priority={rule})", (lambda w, rule=rule: run_mop(w, rule))) for rule in MOP_RULES]
    rows.append(("group rotation (previous mop_airflow)", run_group_rotation))
    rows.append(("MADlib (barrier per hop)", run_madlib))
    rows += [(f"Cerebro (barrier per epoch, poll {poll:g} s)", (lambda w, poll=poll: run_cerebro(w, poll)))
             for poll in CEREBRO_POLLS]
    return rows


MOP = "mop_airflow (priority=remaining)"
PEERS = ("MADlib (barrier per hop)", *(f"Cerebro (barrier per epoch, poll {poll:g} s)" for poll in CEREBRO_POLLS))


# -- adaptive searches ---------------------------------------------------------------------------

def adaptive_table(R: int, eta: int, shards: int, seeds: int) -> None:
    from mop_airflow.planning.search_sim import simulate_search, synthetic_metric
    from mop_airflow.search.adaptive import adaptive_plan, brackets_of, split_by_bracket
    from mop_airflow.search.asha import asha_plan, next_jobs
    from mop_airflow.search.halving import halving_jobs

    hb = adaptive_plan({"method": "hyperband", "R": R, "eta": eta}, shards)
    brackets = brackets_of(hb)
    ids = [f"c{i:04d}" for i in range(hb.total_configurations)]  # one draw: ids nest
    members = split_by_bracket(ids, hb)
    bracket_of = {cid: b for b, group in members.items() for cid in group}
    budget = hb.incremental_resource_iterations
    n = 1
    while asha_plan({"n": n, "r": 1, "R": R, "eta": eta}).halving_iterations() < budget:
        n += 1
    print(f"Hyperband: {hb.total_configurations} configurations, {float(budget):g} iterations (paper rounding); "
          f"ASHA with the same budget: n={n}, r=1; mean over {seeds} seeds of learning curves (worst)")
    head = (f"{'search':<44} {'decided':<16} {'iterations':>10} {'steps':>7} {'slot use (worst)':>15} {'at R':>5} "
            f"{'best loss':>9}")
    print(head)
    print("-" * len(head))
    rows = [("Hyperband, every bracket at once", lambda c, pr, st, f, b: halving_jobs(
                brackets, members, c, pr, st, f, direction="min"), 10**9, bracket_of.get),
            (f"Hyperband, {shards} configurations at once", lambda c, pr, st, f, b: halving_jobs(
                brackets, members, c, pr, st, f, direction="min"), None, bracket_of.get)]
    for label, size in ((f"ASHA n={n} (Hyperband's budget)", n), ("ASHA n=256", 256)):
        plan, draw = asha_plan({"n": size, "r": 1, "R": R, "eta": eta}), [f"c{i:04d}" for i in range(size)]
        for width in (1, 2):
            rows.append((f"{label}, {width * shards} at once",
                         lambda c, pr, st, f, b, plan=plan, draw=draw: next_jobs(plan, c, pr, st, draw, f,
                                                                                 direction="min"),
                         width * shards, lambda cid: None))
    # ASHA with Hyperband's budget as its own (a deadline in blocks, one configuration per slot)
    for size in (n, 2 * n):
        plan, draw = asha_plan({"n": size, "r": 1, "R": R, "eta": eta, "budget": int(budget)}), [
            f"c{i:04d}" for i in range(size)]
        rows.append((f"ASHA n={size}, budget={int(budget)}, {plan.capacity(shards)} at once",
                     lambda c, pr, st, f, b, plan=plan, draw=draw: next_jobs(plan, c, pr, st, draw, f, direction="min",
                                                                             block=b, slots=shards),
                     plan.capacity(shards), lambda cid: None))
    for label, method, capacity, bracket in rows:
        for block, when in ((None, "after every hop"), (shards, f"every {shards} hops")):
            runs = []
            for seed in range(seeds):  # each seed: other learning curves for the same draw
                sim = simulate_search(method, shards=shards, capacity=capacity, block_hops=block, bracket_of=bracket,
                                      metric_of=lambda cid, it, seed=seed: synthetic_metric(cid, it, seed))
                top = max((c.rung for c in sim.completions), default=0)
                finals = [c.metric for c in sim.completions if c.rung == top]
                runs.append((sim.iterations, sim.steps, sim.slot_use, len(finals), min(finals)))
            it, steps, use, at_r, best = (statistics.mean(col) for col in zip(*runs))
            print(f"{label:<44} {when:<16} {it:>10.0f} {steps:>7.0f} {use:>7.3f} ({min(r[2] for r in runs):.3f})"
                  f" {at_r:>5.1f} {best:>9.4f}")


# -- the table --------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="workload seeds per cell (default 10)")
    parser.add_argument("--iterations", type=int, default=3, help="passes over the data (default 3)")
    parser.add_argument("--quick", action="store_true", help="only the 16-configuration scales, 3 seeds")
    parser.add_argument("--adaptive", action="store_true", help="slot use of Hyperband and ASHA instead")
    parser.add_argument("--R", type=int, default=81, help="--adaptive: the most iterations (default 81)")
    parser.add_argument("--eta", type=int, default=3, help="--adaptive: eta (default 3)")
    parser.add_argument("--shards", type=int, default=16, help="--adaptive: shards of one slot (default 16)")
    args = parser.parse_args(argv)
    if args.adaptive:
        header("schedule_sim", f"--adaptive: R={args.R}, eta={args.eta}, {args.shards} shards x 1 slot")
        adaptive_table(args.R, args.eta, args.shards, args.seeds)
        return 0
    seeds = range(3 if args.quick and args.seeds == 10 else args.seeds)
    scales = QUICK_SCALES if args.quick else SCALES

    began = time.perf_counter()
    header("schedule_sim", f"{args.iterations} iterations, {len(seeds)} seeds per cell, hop durations equal (1 s) "
           f"or spread log-uniformly over {SPREAD:g}x")
    print("efficiency = lower bound / makespan (1.000 is optimal): mean over seeds (worst seed)")
    print()
    head = f"{'scale':<23} {'slots':>5}  {'durations':<9}  {'policy':<41} {'efficiency':>16}  {'makespan mean':>13}"
    print(head)
    print("-" * len(head))

    findings: list[str] = []
    for n, p in scales:
        for slots in SLOTS:
            for durations in DURATIONS:
                loads = [make_workload(n, p, iterations=args.iterations, slots=slots, durations=durations, seed=s)
                         for s in seeds]
                bounds = [w.lower_bound for w in loads]
                spans: dict[str, list[float]] = {}
                for label, policy in policies():
                    spans[label] = [policy(w).makespan for w in loads]
                    eff = [b / m if m else 1.0 for b, m in zip(bounds, spans[label])]
                    print(f"{f'{n} configs x {p} shards':<23} {slots:>5}  {durations:<9}  {label:<41} "
                          f"{statistics.mean(eff):>7.3f} ({min(eff):.3f})  {statistics.mean(spans[label]):>11.1f} s")
                findings += _check(f"{n} configs x {p} shards, slots {slots}, {durations}", durations, seeds,
                                   bounds, spans)
                print()

    print("checks: mop_airflow (priority=remaining) against the goal (>= "
          f"{TARGET} of the lower bound on spread durations) and against MADlib and Cerebro, seed by seed:")
    for line in findings or ["all met: never below the goal, never slower than a peer on any seed"]:
        print(f"  {line}")
    print(f"\nran in {time.perf_counter() - began:.1f} s")
    return 0


def _check(cell: str, durations: str, seeds: range, bounds: list[float],
           spans: dict[str, list[float]]) -> list[str]:
    """One line per shortfall of mop_airflow in one cell, naming every seed and the worst one."""
    out = []
    mop = spans[MOP]
    if durations == "spread":
        below = [(b / m, seed, m, b) for seed, b, m in zip(seeds, bounds, mop) if b / m < TARGET]
        if below:
            eff, seed, m, b = min(below)
            out.append(f"BELOW {TARGET} in {cell}: seeds {[s for _, s, _, _ in sorted(below, key=lambda x: x[1])]}; "
                       f"worst seed {seed}: efficiency {eff:.4f} (makespan {m:.2f} s, lower bound {b:.2f} s)")
    for peer in PEERS:
        slower = [(m / other, seed, m, other) for seed, m, other in zip(seeds, mop, spans[peer])
                  if m > other * (1 + 1e-9)]
        if slower:
            ratio, seed, m, other = max(slower)
            out.append(f"SLOWER THAN {peer} in {cell}: {len(slower)} of {len(seeds)} seeds "
                       f"{[s for _, s, _, _ in sorted(slower, key=lambda x: x[1])]}; worst seed {seed}: makespan "
                       f"{m:.2f} s vs {other:.2f} s (+{100 * (ratio - 1):.1f} %)")
    return out


if __name__ == "__main__":
    sys.exit(main())
