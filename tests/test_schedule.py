"""Invariants of the hop plan over many shapes, including fewer configurations than shards."""

import itertools
from collections import Counter, defaultdict

import pytest

from mop_airflow.schedule import build_plan, group_on, hop_key, shard_of, simulate, upstream_shard

SHAPES = [(n, p, it) for n, p, it in itertools.product([1, 2, 3, 5, 8, 13], [1, 2, 3, 4, 7], [1, 2, 3])]


@pytest.mark.parametrize("n,p,iterations", SHAPES)
def test_each_configuration_visits_each_shard_once_per_iteration(n, p, iterations):
    ids = [f"c{i}" for i in range(n)]
    plan = build_plan(ids, shards=p, iterations=iterations, seed=7)
    order = plan.visit_order()
    assert sorted(order) == sorted(ids)
    for cid, shards in order.items():
        assert len(shards) == p * iterations
        for i in range(iterations):
            assert sorted(shards[i * p:(i + 1) * p]) == list(range(p)), (cid, i, shards)


@pytest.mark.parametrize("n,p,iterations", SHAPES)
def test_a_model_is_on_one_shard_per_hop_and_groups_are_balanced(n, p, iterations):
    plan = build_plan([f"c{i}" for i in range(n)], shards=p, iterations=iterations, seed=1)
    sizes = [len(g) for g in plan.groups]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    for t in range(plan.total_hops):
        on_shards = [cid for s in range(p) for cid in plan.configs_at(t, s)]
        assert len(on_shards) == len(set(on_shards)) == n


@pytest.mark.parametrize("n,p,iterations", SHAPES)
@pytest.mark.parametrize("slots", [1, 2])
def test_no_shard_runs_more_models_than_its_slots(n, p, iterations, slots):
    plan = build_plan([f"c{i}" for i in range(n)], shards=p, iterations=iterations, seed=3)
    costs = {f"c{i}": 1.0 + (i % 3) * 0.7 for i in range(n)}  # uneven so the overlaps are real
    events = simulate(plan, slots=slots, seconds_per_hop=costs)
    assert len(events) == n * p * iterations
    by_shard = defaultdict(list)
    for e in events:
        by_shard[e["shard"]].append(e)
    for shard_events in by_shard.values():
        for e in shard_events:
            concurrent = sum(1 for o in shard_events if o["start"] <= e["start"] < o["end"])
            assert concurrent <= slots
    # A model never runs two hops at once and visits hops in order.
    per_model = defaultdict(list)
    for e in events:
        per_model[e["config_id"]].append(e)
    for hops in per_model.values():
        hops.sort(key=lambda e: e["t"])
        for a, b in zip(hops, hops[1:]):
            assert b["start"] >= a["end"]


def test_same_seed_same_plan_and_other_seed_other_plan():
    ids = [f"c{i}" for i in range(12)]
    a = build_plan(ids, shards=4, iterations=3, seed=5)
    assert a == build_plan(ids, shards=4, iterations=3, seed=5)
    assert a.visit_order() == build_plan(ids, shards=4, iterations=3, seed=5).visit_order()
    assert a.groups != build_plan(ids, shards=4, iterations=3, seed=6).groups


def test_rotation_follows_the_single_upstream_shard():
    p = 5
    for t in range(1, 3 * p):
        for s in range(p):
            # the group on s at t is exactly the one on upstream_shard(s) at t - 1
            assert group_on(s, t, p) == group_on(upstream_shard(s, p), t - 1, p)
            assert shard_of(group_on(s, t, p), t, p) == s


def test_no_global_barrier_in_the_simulated_timeline():
    # A slow model delays nobody who has a free slot: with a barrier after every hop the fast
    # models would end after 4 x 10 s, here they end after 4 x 1 s.
    plan = build_plan(["slow", "a", "b", "c"], shards=4, iterations=1, seed=0)
    costs = {"slow": 10.0, "a": 1.0, "b": 1.0, "c": 1.0}
    events = simulate(plan, slots=2, seconds_per_hop=costs)
    fast_ends = [e["end"] for e in events if e["config_id"] != "slow"]
    assert max(fast_ends) == pytest.approx(4.0)  # fast models never wait for the slow one


def test_empty_groups_when_fewer_configurations_than_shards():
    plan = build_plan(["only"], shards=3, iterations=2, seed=0)
    assert Counter(len(g) for g in plan.groups) == Counter({0: 2, 1: 1})
    assert hop_key(5, 2) == "t005_s02"
