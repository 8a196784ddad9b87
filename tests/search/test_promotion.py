"""Rung promotion: ranking direction, deterministic ties, failures never promoted."""

import copy

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.search.promotion import promote, rank_rung


def ok(cid, metric):
    return {"config_id": cid, "metric": metric, "status": "ok"}


def ids(results):
    return [r["config_id"] for r in results]


def test_min_ranks_smallest_first_and_ties_go_to_the_lower_config_id():
    results = [ok("c003", 0.5), ok("c001", 0.5), ok("c002", 0.2), ok("c000", 0.9)]
    assert ids(rank_rung(results, direction="min")) == ["c002", "c001", "c003", "c000"]
    promoted, pruned = promote(results, keep=2, direction="min")
    assert promoted == ["c002", "c001"]
    assert pruned == [{"config_id": "c003", "reason": "ranked below the top 2", "metric": 0.5},
                      {"config_id": "c000", "reason": "ranked below the top 2", "metric": 0.9}]


def test_max_ranks_largest_first_and_ties_still_go_to_the_lower_config_id():
    results = [ok("c001", 0.8), ok("c004", 0.9), ok("c002", 0.9), ok("c003", 0.1)]
    assert ids(rank_rung(results, direction="max")) == ["c002", "c004", "c001", "c003"]
    assert promote(results, keep=1, direction="max")[0] == ["c002"]


def test_failed_and_diverged_go_last_and_are_never_promoted():
    results = [
        {"config_id": "c000", "metric": None, "status": "failed", "error": "OOM on shard 2"},
        {"config_id": "c001", "metric": 0.1, "status": "diverged"},  # a metric does not rescue it
        ok("c002", 0.7),
        ok("c003", float("nan")),
        ok("c004", float("inf")),
        ok("c005", None),
        ok("c006", 0.4),
        {"config_id": "c007", "metric": None, "status": "failed"},
    ]
    ranked = rank_rung(results, direction="min")
    assert ids(ranked) == ["c006", "c002", "c000", "c001", "c003", "c004", "c005", "c007"]
    promoted, pruned = promote(results, keep=5, direction="min")  # keep exceeds the 2 rankable ones
    assert promoted == ["c006", "c002"]
    reasons = {p["config_id"]: p["reason"] for p in pruned}
    assert reasons == {"c000": "failed: OOM on shard 2", "c001": "diverged", "c003": "diverged",
                       "c004": "diverged", "c005": "failed: no metric reported",
                       "c007": "failed: no error message recorded"}
    assert [p["config_id"] for p in pruned] == ["c000", "c001", "c003", "c004", "c005", "c007"]
    assert pruned[1]["metric"] == 0.1


def test_max_direction_puts_non_finite_last_not_first():
    results = [ok("c000", float("inf")), ok("c001", 0.3), ok("c002", float("-inf"))]
    assert ids(rank_rung(results, direction="max")) == ["c001", "c000", "c002"]
    assert promote(results, keep=3, direction="max")[0] == ["c001"]


def test_keep_zero_and_every_result_accounted_for():
    results = [ok(f"c{k:03d}", k / 10) for k in range(6)]
    promoted, pruned = promote(results, keep=0, direction="min")
    assert promoted == [] and len(pruned) == 6
    promoted, pruned = promote(results, keep=2, direction="max")
    assert promoted == ["c005", "c004"]
    assert sorted(promoted + [p["config_id"] for p in pruned]) == ids(results)


def test_inputs_are_not_modified_and_integers_rank():
    results = [ok("c001", 2), ok("c000", 1.5)]
    before = copy.deepcopy(results)
    assert promote(results, keep=1, direction="min") == (["c000"], [
        {"config_id": "c001", "reason": "ranked below the top 1", "metric": 2}])
    assert results == before
    assert rank_rung([], direction="min") == [] and promote([], keep=3, direction="max") == ([], [])


@pytest.mark.parametrize("results,kwargs,field,words", [
    ([ok("c0", 1.0)], {"direction": "desc"}, "search.direction", "'min' or 'max'"),
    ([ok("c0", 1.0)], {"direction": "min", "keep": -1}, "keep", "integer >= 0"),
    ([ok("c0", 1.0)], {"direction": "min", "keep": True}, "keep", "integer >= 0"),
    ([ok("c0", 1.0), ok("c0", 2.0)], {"direction": "min"}, "rung results[1].config_id", "more than once"),
    ([{"config_id": "c0", "metric": 1.0, "status": "done"}], {"direction": "min"}, "rung results[0].status",
     "must be one of"),
    ([ok("c0", "0.5")], {"direction": "min"}, "rung results[0].metric", "number or None"),
    ([ok("", 0.5)], {"direction": "min"}, "rung results[0].config_id", "non-empty string"),
    (["c0"], {"direction": "min"}, "rung results[0]", "must be a dict"),
    ("c0", {"direction": "min"}, "rung results", "list of result dicts"),
])
def test_bad_input_is_named(results, kwargs, field, words):
    with pytest.raises(SpecError) as err:
        promote(results, **{"keep": 1, **kwargs})
    assert err.value.field == field and words in err.value.rule and err.value.fix
