"""The policies of benchmarks/schedule_sim.py: the same invariants for every one, and hand-checked timelines."""

import itertools
from collections import defaultdict

import pytest

from benchmarks.schedule_sim import (Workload, main, make_workload, policies, run_cerebro, run_group_rotation,
                                     run_madlib, run_mop)

POLICIES = dict(policies())
SHAPES = list(itertools.product([1, 3, 8], [1, 2, 3], [1, 2], ["equal", "spread"]))


def workload(cost, *, shards, iterations=1, slots=1, seed=0):
    return Workload(tuple(cost), dict(cost), shards, iterations, slots, seed)


@pytest.mark.parametrize("label", list(POLICIES))
@pytest.mark.parametrize("n,p,slots,durations", SHAPES)
def test_every_policy_trains_every_hop_within_the_slots(label, n, p, slots, durations):
    w = make_workload(n, p, iterations=2, slots=slots, durations=durations, seed=n + p)
    result = POLICIES[label](w)
    assert len(result.events) == n * p * 2
    chains = defaultdict(list)
    per_slot = defaultdict(list)
    for e in result.events:
        assert 0 <= e.slot < slots and e.end - e.start == pytest.approx(w.cost[e.config_id])
        chains[e.config_id].append(e)
        per_slot[e.shard, e.slot].append(e)
    for hops in chains.values():
        hops.sort(key=lambda e: e.start)
        assert [e.t for e in hops] == list(range(2 * p))
        assert all(b.start >= a.end - 1e-9 for a, b in zip(hops, hops[1:]))
        for i in range(2):  # every shard once per iteration
            assert sorted(e.shard for e in hops[i * p:(i + 1) * p]) == list(range(p))
    for hops in per_slot.values():
        hops.sort(key=lambda e: e.start)
        assert all(b.start >= a.end - 1e-9 for a, b in zip(hops, hops[1:]))
    assert result.makespan >= w.lower_bound - 1e-9
    assert result.makespan == pytest.approx(max(e.end for e in result.events)) or "Cerebro" in label


def test_workloads_are_seeded_and_spread_over_60x():
    a = make_workload(64, 4, durations="spread", seed=3)
    assert a == make_workload(64, 4, durations="spread", seed=3)
    assert a.cost != make_workload(64, 4, durations="spread", seed=4).cost
    assert all(1.0 <= c <= 60.0 for c in a.cost.values()) and max(a.cost.values()) / min(a.cost.values()) > 20
    assert set(make_workload(8, 4, durations="equal").cost.values()) == {1.0}
    with pytest.raises(ValueError):
        make_workload(8, 4, durations="bimodal")


def test_madlib_waits_for_the_slowest_model_after_every_hop():
    # Two models on two segments of 2 slots: every hop ends when the 3 s model ends, so the 1 s
    # model's hops start at 0 and 3; without the barrier (mop_airflow) it ends at 2. (With 1 slot it
    # would wait for the 3 s model to leave its next shard anyway, barrier or not.)
    w = workload({"a": 1.0, "b": 3.0}, shards=2, slots=2)
    starts = sorted((e.config_id, e.t, e.start) for e in run_madlib(w).events)
    assert starts == [("a", 0, 0.0), ("a", 1, 3.0), ("b", 0, 0.0), ("b", 1, 3.0)]
    assert run_madlib(w).makespan == 6.0
    assert max(e.end for e in run_mop(w).events if e.config_id == "a") == 2.0


def test_group_rotation_waits_for_the_whole_group_ahead():
    # 3 configurations of 1 s on 2 shards, 1 slot: groups of 2 and 1. At hop 1 the group of 2 may
    # enter shard 1 only when it finished hop 0 on shard 0 (at 2 s): 2 + 2 = 4 s. mop_airflow's
    # chains reach the lower bound, 3 configurations x 2 hops / 2 slots = 3 s.
    w = workload({"a": 1.0, "b": 1.0, "c": 1.0}, shards=2)
    assert sorted(len(c) for c in w.classes) == [1, 2]
    assert run_group_rotation(w).makespan == 4.0
    assert run_mop(w).makespan == w.lower_bound == 3.0


def test_cerebro_polls_every_two_seconds_and_sleeps_once_after_an_epoch():
    # One model, one worker, two epochs of one 1 s sub-epoch. Polling every 2 s: it starts at 0,
    # is seen done at 2, the loop sleeps to 4, starts the next epoch's sub-epoch at 4, seen done at 6.
    w = workload({"m": 1.0}, shards=1, iterations=2)
    polled = run_cerebro(w, poll=2.0)
    assert [(e.t, e.start, e.end) for e in polled.events] == [(0, 0.0, 1.0), (1, 4.0, 5.0)]
    assert polled.makespan == 6.0
    assert run_cerebro(w, poll=0.0).makespan == 2.0


def test_cerebro_has_a_barrier_per_epoch():
    # Two models, two workers; the 4 s model makes every epoch last 8 s, and the 1 s model cannot
    # start its second epoch before the first one ends.
    w = workload({"fast": 1.0, "slow": 4.0}, shards=2, iterations=2)
    result = run_cerebro(w)
    second = min(e.start for e in result.events if e.config_id == "fast" and e.t == 2)
    assert second == 8.0 and result.makespan == 16.0


def test_the_table_prints_every_policy(capsys):
    assert main(["--quick", "--seeds", "1", "--iterations", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("schedule_sim: 1 iterations, 1 seeds per cell")
    assert "machine:" in out and "date:" in out
    for label in POLICIES:
        assert out.count(label) >= 8  # 2 scales x 2 slot counts x 2 duration kinds


def test_an_adaptive_search_replayed_on_slots_counts_every_hop_and_idle_slot():
    from mop_airflow.planning.search_sim import simulate_search
    from mop_airflow.search.asha import asha_plan, next_jobs

    plan = asha_plan({"n": 3, "r": 1, "R": 3, "eta": 3})  # rungs at 1 and 3 iterations
    draw = ["a", "b", "c"]
    loss = {"a": 0.3, "b": 0.1, "c": 0.2}
    sim = simulate_search(lambda done, promoted, started, free, block: next_jobs(plan, done, promoted, started, draw,
                                                                               free, direction="min"),
                          shards=2, capacity=2, metric_of=lambda cid, iterations: loss[cid])
    # a and b start on the two shards and finish rung 0 after 2 steps; nothing is promotable from
    # two completions (floor(2/3) = 0), so c starts and runs alone for 2 steps (one slot idle); then
    # b (best of three) is promoted and trains 2 more iterations (4 hops) alone: 8 steps in all
    assert [(j.config_id, j.kind, j.rung) for j in sim.decisions] == [
        ("a", "start", 0), ("b", "start", 0), ("c", "start", 0), ("b", "promote", 1)]
    # each job taken by a slot with nothing ready, as in production: the one idle longest, then the
    # lowest. c takes shard 0 (both idle since step 2); b's promotion takes shard 0 too, idle since
    # step 3 (c's last hop, at step 3, was on shard 1)
    assert sim.placed == [(0, 0), (1, 0), (0, 0), (0, 0)]
    assert (sim.steps, sim.trained_hops) == (8, 2 * 3 + 4)
    assert sim.slot_use == 10 / 16
    assert [(c.config_id, c.rung) for c in sim.completions] == [("a", 0), ("b", 0), ("c", 0), ("b", 1)]


def test_a_replayed_hop_trains_only_on_the_slot_that_took_its_job_as_in_production():
    """Production trains hop t of a job on shard (offset + t) mod p and always on the deciding slot's
    index (asha_slots), so a hop waits for its own slot even while another slot of its shard is free."""
    from mop_airflow.planning.asha_slots import leg_offset, leg_owner
    from mop_airflow.planning.search_sim import simulate_search
    from mop_airflow.search.jobs import Job

    def three(done, promoted, started, free, block):  # a long job, then two of one iteration
        return [] if started else [Job("a", 0, "start", 3), Job("b", 0, "start", 1), Job("c", 0, "start", 1)]

    sim = simulate_search(three, shards=1, slots=2, capacity=3)
    # a and b take the two idle slots; c goes to the slot fewest head to, the lowest of a tie: a's.
    # Step 0: a and b train, c waits; step 1: c (waited longer) trains on slot 0, a waits though
    # slot 1 is free (b is done); steps 2-3: a. Before, c or a took slot 1 at step 1: 3 steps.
    assert sim.placed == [(0, 0), (0, 1), (0, 0)]
    assert (sim.steps, sim.trained_hops, sim.slot_use) == (4, 5, 5 / 8)
    # the rule itself: a leg that begins at hop 16 of 16 shards, decided on shard 3 slot 1, trains
    # its first hop there and its hop t on shard (3 + t) mod 16, slot 1
    offset = leg_offset(3, 16, 16)
    assert [leg_owner(offset, 1, t, 16) for t in (16, 17, 31)] == [(3, 1), (4, 1), (2, 1)]


def test_asha_with_hyperbands_budget_as_a_deadline_trains_at_least_nine_tenths_of_the_slot_time():
    """R=81, eta=3 on 16 shards x 1 slot, decided between blocks of one iteration: with Hyperband's
    1,581 iterations as its budget, ASHA never begins a leg it cannot end, so no long leg runs alone
    at the end; every job stays within the budget's 98 blocks."""
    from mop_airflow.planning.search_sim import simulate_search
    from mop_airflow.search.asha import asha_plan, next_jobs

    plan = asha_plan({"n": 441, "r": 1, "R": 81, "eta": 3, "budget": 1581})
    draw = [f"c{i:04d}" for i in range(441)]
    sim = simulate_search(lambda done, promoted, started, free, block: next_jobs(
        plan, done, promoted, started, draw, free, direction="min", block=block, slots=16),
        shards=16, capacity=plan.capacity(16), block_hops=16)
    assert sim.slot_use >= 0.9
    assert sim.steps <= plan.deadline(16) * 16 and sim.iterations <= 1581
    assert any(c.rung == plan.top for c in sim.completions)  # some configuration still reaches R=81
