"""ASHA's decisions (Li et al. 2020, Algorithm 2, promotion variant) on hand-computable cases."""

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.search.asha import Completion, asha_plan, next_jobs

PLAN = asha_plan({"n": 9, "r": 1, "R": 9, "eta": 3})  # rungs at 1, 3 and 9 iterations
IDS = [f"c{i}" for i in range(9)]


def done(cid, rung, metric, status="ok"):
    return Completion(cid, rung, metric, status)


def test_the_rungs_are_r_times_powers_of_eta_up_to_R():
    assert PLAN.rungs == (1, 3, 9)
    assert asha_plan({"n": 64, "r": 1, "R": 27, "eta": 3}).rungs == (1, 3, 9, 27)
    assert asha_plan({"n": 8, "r": 2, "R": 8, "eta": 2}).rungs == (2, 4, 8)
    assert asha_plan({"n": 3, "R": 1}).rungs == (1,)  # r defaults to 1, eta to 3: one rung, no promotion
    # 9 configurations at 1 iteration, 3 promoted to 3 (2 more each), 1 to 9 (6 more): 9 + 6 + 6
    assert PLAN.halving_iterations() == 21


def test_with_nothing_completed_every_free_slot_starts_a_configuration_in_draw_order():
    jobs = next_jobs(PLAN, [], [], [], IDS, 4, direction="min")
    assert [(j.config_id, j.rung, j.kind) for j in jobs] == [("c0", 0, "start"), ("c1", 0, "start"),
                                                              ("c2", 0, "start"), ("c3", 0, "start")]


def test_the_best_third_of_a_rung_is_promoted_before_anything_new_starts():
    completions = [done("c0", 0, 0.5), done("c1", 0, 0.3), done("c2", 0, 0.4)]
    jobs = next_jobs(PLAN, completions, [], IDS[:4], IDS, 2, direction="min")
    # floor(3 / 3) = 1: c1 (lowest loss) goes to rung 1; then nothing else is promotable: c4 starts
    assert [(j.config_id, j.rung, j.kind) for j in jobs] == [("c1", 1, "promote"), ("c4", 0, "start")]
    assert (jobs[0].metric, jobs[0].rank, jobs[0].of) == (0.3, 1, 3)


def test_a_configuration_is_promoted_from_a_rung_once_and_a_later_better_one_overtakes_it():
    completions = [done("c0", 0, 0.5), done("c1", 0, 0.3), done("c2", 0, 0.4),
                   done("c3", 0, 0.1), done("c4", 0, 0.2), done("c5", 0, 0.9)]
    # top floor(6 / 3) = 2 are c3 and c4; c1 was promoted already when it led three completions
    jobs = next_jobs(PLAN, completions, [("c1", 0)], IDS[:6], IDS, 3, direction="min")
    assert [(j.config_id, j.rung) for j in jobs] == [("c3", 1), ("c4", 1), ("c6", 0)]


def test_the_highest_rung_is_served_first_and_direction_max_ranks_accuracy():
    completions = [done(c, 0, m) for c, m in zip(IDS[:6], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])]
    completions += [done("c5", 1, 0.7), done("c4", 1, 0.8), done("c3", 1, 0.65)]
    jobs = next_jobs(PLAN, completions, [("c5", 0), ("c4", 0)], IDS[:6], IDS, 2, direction="max")
    # rung 1 first: floor(3/3) = 1, c4 (0.8) to rung 2; then rung 0's top 2 (c5, c4) are both taken
    assert [(j.config_id, j.rung, j.kind) for j in jobs] == [("c4", 2, "promote"), ("c6", 0, "start")]


def test_failed_and_diverged_configurations_are_never_promoted():
    completions = [done("c0", 0, None, "failed"), done("c1", 0, float("nan")), done("c2", 0, 0.4)]
    jobs = next_jobs(PLAN, completions, [], IDS[:3], IDS, 1, direction="min")
    assert [(j.config_id, j.kind) for j in jobs] == [("c2", "promote")]  # the only rankable one leads
    jobs = next_jobs(PLAN, [done("c0", 0, None, "failed"), done("c1", 0, None, "failed"),
                            done("c2", 0, None, "diverged")], [], IDS[:3], IDS, 1, direction="min")
    assert [(j.config_id, j.kind) for j in jobs] == [("c3", "start")]


def test_no_job_once_n_have_started_and_nothing_is_promotable():
    assert next_jobs(PLAN, [], [], IDS, IDS, 3, direction="min") == []


def test_the_same_completions_in_the_same_order_give_the_same_jobs_and_ties_go_to_the_lower_id():
    completions = [done("c2", 0, 0.3), done("c0", 0, 0.3), done("c1", 0, 0.5)]
    first = next_jobs(PLAN, completions, [], IDS[:3], IDS, 2, direction="min")
    assert first == next_jobs(PLAN, list(completions), [], IDS[:3], IDS, 2, direction="min")
    assert first[0].config_id == "c0"


@pytest.mark.parametrize("options, field, words, fix", [
    ({"n": 8, "r": 1, "R": 10, "eta": 3}, "search.adaptive.R", "is not a rung", "R=9 or R=27"),
    ({"n": 8, "r": 4, "R": 2, "eta": 3}, "search.adaptive.r", "at most R=2", "lower r"),
    ({"n": 8, "r": 1, "R": 9, "eta": 1}, "search.adaptive.eta", "whole number >= 2", "eta=3"),
    ({"n": 0, "r": 1, "R": 9, "eta": 3}, "search.adaptive.n", "whole number >= 1", "n=64"),
    ({"n": 8, "R": 9, "etta": 3}, "search.adaptive.etta", "not an option of asha", "did you mean 'eta'?"),
    ({"r": 1, "R": 9}, "search.adaptive.n", "is required", "n (configurations"),
    ({"n": 8, "r": 1.5, "R": 9}, "search.adaptive.r", "whole number", "r=1"),
])
def test_bad_options_name_the_field_the_rule_and_the_fix(options, field, words, fix):
    with pytest.raises(SpecError) as raised:
        asha_plan(options)
    assert raised.value.field == field and words in raised.value.rule and fix in raised.value.fix


# A budget of 40 iterations on 4 slots: 4 configurations at once, one per slot, for 10 blocks (0-9).
BUDGETED = asha_plan({"n": 27, "r": 1, "R": 9, "eta": 3, "budget": 40})
MANY = [f"c{i}" for i in range(27)]
RUNG0 = [done(f"c{i}", 0, 0.1 * (i + 1)) for i in range(9)]  # c0 best; floor(9/3): c0, c1, c2 go on
RUNG1 = RUNG0 + [done("c0", 1, 0.05), done("c1", 1, 0.15), done("c2", 1, 0.25)]  # c0 may go to rung 2
UP = [("c0", 0), ("c1", 0), ("c2", 0)]


def budgeted(block, completions=RUNG1, promoted=UP, plan=BUDGETED):
    return [(j.config_id, j.kind, j.rung) for j in next_jobs(plan, completions, promoted, MANY[:9], MANY, 1,
                                                             direction="min", block=block, slots=4)]


def test_a_budget_trains_one_configuration_per_slot_for_the_blocks_it_lasts():
    assert (BUDGETED.capacity(4), BUDGETED.deadline(4)) == (4, 10)
    assert (PLAN.capacity(4), PLAN.deadline(4)) == (8, None)  # no budget: two per slot, no deadline
    assert BUDGETED.to_dict()["budget"] == 40 and "budget" not in PLAN.to_dict()


def test_under_a_budget_no_leg_begins_that_would_end_after_its_last_block():
    # c0's leg to rung 2 is 6 iterations: begun in block 4 it trains blocks 4-9, the budget's last
    assert budgeted(4) == [("c0", "promote", 2)]
    # from block 5 on it would end after that: a new configuration (one iteration) starts instead
    assert budgeted(5) == [("c9", "start", 0)] and budgeted(9) == [("c9", "start", 0)]
    assert budgeted(10) == []  # not even a start fits: the search ends
    # a leg from rung 0 to rung 1 is 2 iterations: it fits up to block 8
    assert budgeted(8, RUNG0, []) == [("c0", "promote", 1)]
    assert budgeted(9, RUNG0, []) == [("c9", "start", 0)]
    # the same records without a budget promote at any block
    unbounded = asha_plan({"n": 27, "r": 1, "R": 9, "eta": 3})
    assert budgeted(500, plan=unbounded) == [("c0", "promote", 2)]


@pytest.mark.parametrize("budget, words", [(8, "whole number >= 9"), ("lots", "whole number"), (True, "whole number")])
def test_a_budget_below_R_or_not_a_whole_number_is_refused(budget, words):
    with pytest.raises(SpecError) as raised:
        asha_plan({"n": 8, "r": 1, "R": 9, "eta": 3, "budget": budget})
    assert raised.value.field == "search.adaptive.budget" and words in raised.value.rule
    assert "at least R" in raised.value.fix


def test_a_budget_too_small_to_reach_R_on_the_specs_slots_is_refused_when_the_spec_is_read():
    from mop_airflow.config import MopSpec
    from tests.test_end_to_end import MLP, tiny_spec

    spec = tiny_spec("/d.parquet", "file:///s", shards=4, slots_per_shard=2)  # 8 slots: 8 at once
    spec["search"]["space"] = {"method": "random", "seed": 1, "params": {
        "model": [MLP], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 1e-2}}}
    spec["search"]["adaptive"] = {"method": "asha", "n": 16, "r": 1, "R": 9, "eta": 3, "budget": 71}
    with pytest.raises(SpecError) as raised:
        MopSpec.from_dict(spec)
    error = raised.value
    assert (error.field, error.value) == ("search.adaptive.budget", 71)
    assert "lasts 8 block(s) of one iteration on 4 shard(s) x 2 slot(s)" in error.rule and "R=9" in error.rule
    assert "raise budget to at least R x slots = 72, or lower R" == error.fix
    spec["search"]["adaptive"]["budget"] = 72
    assert MopSpec.from_dict(spec).adaptive_plan().deadline(8) == 9
