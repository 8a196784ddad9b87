"""Hyperband brackets against Li et al. (JMLR 2018) Algorithm 1, its published R=81 table, an
independent float re-derivation, Apache MADlib's rounding and MOP's hop accounting."""

import json
import math
from fractions import Fraction

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.search.hyperband import (
    Bracket,
    HyperbandPlan,
    estimate_wall_seconds,
    format_plan,
    hyperband_plan,
    s_max,
    successive_halving,
)

# The paper's table for R=81, eta=3 (Li et al. 2018, Table 1): per bracket s, (n_i, r_i) per rung.
PAPER_81 = {
    4: [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
    3: [(34, 3), (11, 9), (3, 27), (1, 81)],
    2: [(15, 9), (5, 27), (1, 81)],
    1: [(8, 27), (2, 81)],
    0: [(5, 81)],
}
# MADlib's n = floor((s_max+1)/(s+1)) * eta**s for the same R and eta.
MADLIB_81 = {
    4: [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
    3: [(27, 3), (9, 9), (3, 27), (1, 81)],
    2: [(9, 9), (3, 27), (1, 81)],
    1: [(6, 27), (2, 81)],
    0: [(5, 81)],
}
CASES = [(81, 3), (27, 3), (9, 3), (243, 3), (8, 2), (16, 4), (1, 3)]


def reference(R, eta, madlib=False):
    """Algorithm 1 written out the obvious way in floats (fine for these small R)."""
    top = int(math.log(R) / math.log(eta) + 1e-9)
    B = (top + 1) * R
    table = {}
    for s in range(top, -1, -1):
        if madlib:
            n = int((top + 1) / (s + 1)) * eta ** s
        else:
            n = math.ceil(B / R * eta ** s / (s + 1))
        r = R * eta ** (-s)
        table[s] = [(math.floor(n / eta ** i), r * eta ** i) for i in range(s + 1)]
    return table


def table_of(plan):
    return {b.s: [(g.n_i, g.r_i) for g in b.rungs] for b in plan.brackets}


def test_paper_table_for_r81_eta3():
    plan = hyperband_plan(81, 3)
    assert table_of(plan) == PAPER_81
    assert [b.n for b in plan.brackets] == [81, 34, 15, 8, 5]
    assert [b.r for b in plan.brackets] == [1, 3, 9, 27, 81]
    assert [[g.keep for g in b.rungs] for b in plan.brackets] == [
        [27, 9, 3, 1, 0], [11, 3, 1, 0], [5, 1, 0], [2, 0], [0]]


@pytest.mark.parametrize("R,eta", CASES)
@pytest.mark.parametrize("rounding", ["paper", "madlib"])
def test_brackets_match_an_independent_float_derivation(R, eta, rounding):
    plan = hyperband_plan(R, eta, rounding=rounding)
    expected = reference(R, eta, madlib=rounding == "madlib")
    got = table_of(plan)
    assert list(got) == list(expected)
    for s in expected:
        assert [n for n, _ in got[s]] == [n for n, _ in expected[s]]
        assert [float(r) for _, r in got[s]] == pytest.approx([r for _, r in expected[s]])
        assert got[s][-1][1] == R  # the last rung of every bracket trains to R
    for b in plan.brackets:
        assert all(g.keep == g.n_i // eta for g in b.rungs[:-1]) and b.rungs[-1].keep == 0
        assert all(b.rungs[i + 1].n_i == b.rungs[i].keep for i in range(len(b.rungs) - 1))


def test_other_hand_computed_tables():
    assert table_of(hyperband_plan(9, 3)) == {2: [(9, 1), (3, 3), (1, 9)], 1: [(5, 3), (1, 9)], 0: [(3, 9)]}
    assert table_of(hyperband_plan(8, 2)) == {3: [(8, 1), (4, 2), (2, 4), (1, 8)], 2: [(6, 2), (3, 4), (1, 8)],
                                              1: [(4, 4), (2, 8)], 0: [(4, 8)]}
    assert table_of(hyperband_plan(16, 4)) == {2: [(16, 1), (4, 4), (1, 16)], 1: [(6, 4), (1, 16)], 0: [(3, 16)]}
    assert table_of(hyperband_plan(1, 3)) == {0: [(1, 1)]}
    assert [b.n for b in hyperband_plan(243, 3).brackets] == [243, 98, 41, 18, 9, 6]


def test_madlib_table_for_r81_eta3():
    plan = hyperband_plan(81, 3, rounding="madlib")
    assert table_of(plan) == MADLIB_81
    assert plan.total_configurations == 128


def test_s_max_is_integer_where_a_float_log_is_wrong():
    assert math.log(243, 3) < 5 and math.log(1000, 10) < 3  # 4.999999999999999, 2.9999999999999996
    assert s_max(243, 3) == 5 and s_max(1000, 10) == 3
    assert [s_max(R, eta) for R, eta in [(81, 3), (9, 3), (8, 2), (1, 3), (26, 3), (1023, 2)]] == [4, 2, 3, 0, 2, 9]
    assert len(hyperband_plan(243, 3).brackets) == 6
    assert hyperband_plan(1000, 10).s_max == 3


def test_madlib_rounding_is_exact_where_madlib_floats_truncate():
    # MADlib's schedule table computes int(n * eta**-i) in floats: 0 configurations in the last rung.
    assert int(729 * math.pow(3, -6)) == 0
    plan = hyperband_plan(729, 3, rounding="madlib")
    assert plan.brackets[0].rungs[-1].n_i == 1


@pytest.mark.parametrize("skip_last,rows", [(0, 15), (2, 6), (3, 3)])
def test_skip_last_drops_the_last_rungs_of_every_bracket_like_madlib(skip_last, rows):
    # Row counts from MADlib's own unit test (test_madlib_keras_automl.py_in): 15, 15-(2*5-1), 15-(3*5-3).
    plan = hyperband_plan(81, 3, rounding="madlib", skip_last=skip_last)
    assert sum(len(b.rungs) for b in plan.brackets) == rows
    assert [b.s for b in plan.brackets] == list(range(4, skip_last - 1, -1))
    assert all(b.rungs[-1].keep == 0 for b in plan.brackets)


def test_skip_last_totals():
    paper = hyperband_plan(81, 3, skip_last=2)
    assert table_of(paper) == {4: [(81, 1), (27, 3), (9, 9)], 3: [(34, 3), (11, 9)], 2: [(15, 9)]}
    assert paper.total_configurations == 81 + 34 + 15
    assert hyperband_plan(81, 3, rounding="madlib", skip_last=2).total_configurations == 81 + 27 + 9


def test_budget_totals_r81():
    plan = hyperband_plan(81, 3, shards=4)
    assert plan.budget_per_bracket == 405
    assert [b.total_resource_iterations for b in plan.brackets] == [405, 363, 351, 378, 405]
    assert plan.total_configurations == 143
    assert plan.total_resource_iterations == 1902
    # Resuming: 81*1+27*2+9*6+3*18+1*54 = 297, 34*3+11*6+3*18+54 = 276, 135+90+54 = 279, 216+108 = 324, 405.
    assert [b.incremental_resource_iterations for b in plan.brackets] == [297, 276, 279, 324, 405]
    assert plan.incremental_resource_iterations == 1581
    assert plan.total_hops == 1581 * 4
    assert [g.new_hops for g in plan.brackets[0].rungs] == [4, 8, 24, 72, 216]
    assert [g.hops_i for g in plan.brackets[0].rungs] == [4, 12, 36, 108, 324]
    madlib = hyperband_plan(81, 3, rounding="madlib")
    assert (madlib.total_resource_iterations, madlib.incremental_resource_iterations) == (1701, 1404)


@pytest.mark.parametrize("R,eta", CASES)
def test_incremental_resource_is_the_sum_of_the_increments(R, eta):
    plan = hyperband_plan(R, eta, shards=3)
    expected, scratch = 0, 0
    for s, rungs in reference(R, eta).items():
        previous = 0
        for n_i, r_i in rungs:
            expected += n_i * (r_i - previous)
            scratch += n_i * r_i
            previous = r_i
    assert float(plan.incremental_resource_iterations) == pytest.approx(expected)
    assert float(plan.total_resource_iterations) == pytest.approx(scratch)
    assert plan.total_hops == plan.incremental_resource_iterations * 3


def test_a_rung_between_iterations_is_rejected_with_the_r_that_ends_each_rung_at_one():
    for shards in (1, 3):
        with pytest.raises(SpecError) as err:
            hyperband_plan(4, 3, shards=shards)
        e = err.value
        assert e.field == "search.adaptive.R" and e.value == 4
        assert "bracket s=1 rung i=0" in e.rule and "4/3" in e.rule and "eta=3" in e.rule
        assert "[3, 6]" in e.fix and "where a block ends and the search decides" in e.fix
        assert "allow_partial" not in e.fix and "allow-partial" not in e.fix  # a retired option (docs/upgrade.md)


def test_with_shards_rechecks():
    plan = hyperband_plan(9, 3, shards=3)
    assert plan.with_shards(6).total_hops == 2 * plan.total_hops
    with pytest.raises(SpecError, match="schedule.shards=0"):
        plan.with_shards(0)


@pytest.mark.parametrize("kwargs,field,words", [
    ({"R": 0}, "search.adaptive.R", "integer >= 1"),
    ({"R": 9.0}, "search.adaptive.R", "integer >= 1"),
    ({"R": True}, "search.adaptive.R", "integer >= 1"),
    ({"R": 9, "eta": 1}, "search.adaptive.eta", "integer >= 2"),
    ({"R": 9, "rounding": "exact"}, "search.adaptive.rounding", "must be one of"),
    ({"R": 9, "skip_last": -1}, "search.adaptive.skip_last", "integer >= 0"),
    ({"R": 9, "skip_last": 3}, "search.adaptive.skip_last", "at most s_max=2"),
    ({"R": 9, "shards": 0}, "schedule.shards", "integer >= 1"),
])
def test_arguments_are_validated(kwargs, field, words):
    with pytest.raises(SpecError) as err:
        hyperband_plan(**kwargs)
    assert err.value.field == field and words in err.value.rule and err.value.fix


def test_successive_halving():
    sh = successive_halving(27, 1, 3)
    assert isinstance(sh, Bracket) and sh.s == 3
    assert [(g.n_i, g.r_i, g.keep) for g in sh.rungs] == [(27, 1, 9), (9, 3, 3), (3, 9, 1), (1, 27, 0)]
    assert sh.total_resource_iterations == 108 and sh.incremental_resource_iterations == 81
    two = successive_halving(20, 2, 2, rungs=2, shards=5)
    assert [(g.n_i, g.r_i, g.hops_i, g.new_hops, g.keep) for g in two.rungs] == [
        (20, 2, 10, 10, 10), (10, 4, 20, 10, 0)]
    assert two.total_hops == 20 * 10 + 10 * 10


def test_successive_halving_validation_and_partial_iterations():
    with pytest.raises(SpecError, match="at most 4"):
        successive_halving(27, 1, 3, rungs=5)
    for args, field in [((0, 1), "n"), ((9, 0), "r"), ((9, 1.5), "r"), ((9, 1, 1), "eta"), ((9, 1, 3, 0), "rungs")]:
        with pytest.raises(SpecError) as err:
            successive_halving(*args)
        assert err.value.field == f"search.adaptive.{field}"
    with pytest.raises(SpecError, match="not a whole number of iterations") as err:
        successive_halving(9, Fraction(1, 2), 3, shards=2)
    assert err.value.field == "search.adaptive.r" and "whole number of iterations for r" in err.value.fix
    assert [g.hops_i for g in successive_halving(9, Fraction(2, 1), 3, shards=2).rungs] == [4, 12, 36]


def test_estimate_wall_seconds():
    plan = hyperband_plan(81, 3, shards=4)
    # 6324 model-hops on 4 slots = 1581 hop-times of 2 s; the longest chain is 81*4 = 324 hops.
    assert estimate_wall_seconds(plan, seconds_per_hop=2.0) == 3162.0
    assert estimate_wall_seconds(plan, seconds_per_hop=2.0, slots_per_shard=2) == 1581.0
    assert estimate_wall_seconds(plan, shards=2, seconds_per_hop=1.0) == 1581.0  # 3162 hops / 2 slots
    # Few configurations: the chain of 12 hops of the survivor dominates 20 model-hops / 16 slots.
    small = successive_halving(3, 1, 3, rungs=2, shards=4)
    assert estimate_wall_seconds(small, seconds_per_hop=1.5, slots_per_shard=4) == 18.0
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(SpecError, match="seconds_per_hop"):
            estimate_wall_seconds(plan, seconds_per_hop=bad)
    with pytest.raises(SpecError, match="slots_per_shard"):
        estimate_wall_seconds(plan, seconds_per_hop=1.0, slots_per_shard=0)


def test_format_plan_shows_every_rung_and_the_totals():
    text = format_plan(hyperband_plan(81, 3), shards=4, seconds_per_hop=2.0)
    rows = [line.split() for line in text.splitlines()]
    table = [r for r in rows if len(r) == 6 and r[0].isdigit()]
    assert table[0] == ["4", "0", "81", "1", "4", "27"]
    assert table[5] == ["3", "0", "34", "3", "12", "11"]
    assert table[-1] == ["0", "0", "5", "81", "324", "-"]
    assert len(table) == 15
    assert "R=81" in text and "eta=3" in text and "rounding=paper" in text
    assert "total configurations: 143" in text
    assert "1581 iterations = 6324 model-hops" in text and "1902 iterations" in text
    assert "at least 3,162 s (52m 42s)" in text and "lower bound" in text
    assert "estimated" not in format_plan(hyperband_plan(81, 3), shards=4)


def test_format_plan_shows_successive_halving():
    sh = format_plan(successive_halving(9, 1, 3), shards=2)
    assert "Successive halving: n=9" in sh and "total configurations: 9" in sh


def test_to_dict_is_json_and_exact():
    plan = successive_halving(3, Fraction(2), 3, shards=3)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["total_configurations"] == 3 and data["total_hops"] == 3 * 6 + 1 * 12
    assert data["incremental_resource_iterations"] == 10 and data["total_resource_iterations"] == 12
    assert data["rungs"][0] == {"s": 1, "i": 0, "n_i": 3, "r_i": 2, "hops_i": 6, "new_hops": 6, "keep": 1}
    assert json.loads(json.dumps(successive_halving(3, Fraction(2), 3).to_dict()))["r"] == 2
    assert "allow_partial_iterations" not in hyperband_plan(9).to_dict()
    assert isinstance(hyperband_plan(9), HyperbandPlan)
    assert hyperband_plan(9) == hyperband_plan(9)  # same inputs, same plan
