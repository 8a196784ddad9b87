"""Hyperband's synchronous rungs as answers to "what trains next?", on R=9, eta=3 (hand-computable):
bracket 2 is 9@1 -> 3@3 -> 1@9, bracket 1 is 5@3 -> 1@9, bracket 0 is 3@9."""

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.search.adaptive import adaptive_plan, brackets_of
from mop_airflow.search.hyperband import hyperband_plan
from mop_airflow.search.halving import halving_jobs, rung_iterations
from mop_airflow.search.jobs import Completion

BRACKETS = brackets_of(adaptive_plan({"method": "hyperband", "R": 9, "eta": 3}, 4))
MEMBERS = {2: [f"a{i}" for i in range(9)], 1: [f"b{i}" for i in range(5)], 0: ["c0", "c1", "c2"]}
ALL = [cid for s in (2, 1, 0) for cid in MEMBERS[s]]


def jobs(completions=(), promoted=(), started=(), free=100):
    return halving_jobs(BRACKETS, MEMBERS, list(completions), list(promoted), list(started), free, direction="min")


def test_every_bracket_starts_its_first_rung_longest_bracket_first():
    first = jobs(free=10)
    assert [(j.config_id, j.bracket, j.iterations) for j in first[:2]] == [("a0", 2, 1), ("a1", 2, 1)]
    assert [j.config_id for j in first] == ALL[:10]
    assert {(j.bracket, j.iterations) for j in jobs()} == {(2, 1), (1, 3), (0, 9)}
    assert len(jobs()) == 17 and jobs(started=ALL) == []


def test_a_rung_is_ranked_only_when_every_member_completed_it():
    partial = [Completion(f"a{i}", 0, 0.1 * i, bracket=2) for i in range(8)]
    assert jobs(partial, started=ALL) == []  # a8 still trains: bracket 2 waits at rung 0
    full = partial + [Completion("a8", 0, 0.05, bracket=2)]
    promoted = jobs(full, started=ALL)
    # keep floor(9 / 3) = 3: the three lowest losses, best first
    assert [(j.config_id, j.rung, j.kind, j.iterations, j.rank, j.of) for j in promoted] == [
        ("a0", 1, "promote", 3, 1, 9), ("a8", 1, "promote", 3, 2, 9), ("a1", 1, "promote", 3, 3, 9)]
    # issued once: with the promotions recorded nothing more is due, and capacity caps what is issued
    assert jobs(full, promoted=[("a0", 0), ("a8", 0), ("a1", 0)], started=ALL) == []
    assert [j.config_id for j in jobs(full, started=ALL, free=2)] == ["a0", "a8"]


def test_the_next_rung_waits_for_the_promoted_only_and_a_failed_member_counts_as_done():
    rung0 = [Completion(f"a{i}", 0, 0.1 * i, bracket=2) for i in range(9)]
    rung1 = [Completion("a0", 1, 0.3, bracket=2), Completion("a1", 1, None, "failed", bracket=2),
             Completion("a2", 1, 0.2, bracket=2)]
    taken = [("a0", 0), ("a1", 0), ("a2", 0)]
    final = jobs(rung0 + rung1, promoted=taken, started=ALL)
    assert [(j.config_id, j.rung, j.iterations) for j in final] == [("a2", 2, 9)]


def test_a_rung_that_ends_between_iterations_is_refused_with_the_option_that_allowed_it():
    with pytest.raises(SpecError) as raised:
        adaptive_plan({"method": "hyperband", "R": 4, "eta": 3, "allow_partial_iterations": True}, 3)
    assert raised.value.field == "search.adaptive.allow_partial_iterations"
    assert "no longer exists" in raised.value.rule and "iteration boundary" in raised.value.rule
    assert raised.value.fix == "remove search.adaptive.allow_partial_iterations"
    assert rung_iterations(hyperband_plan(9, 3, shards=3).brackets[0]) == [1, 3, 9]


