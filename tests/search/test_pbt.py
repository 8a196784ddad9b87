"""Population-based training's options and decisions (mop_airflow.search.pbt): pure, no Airflow."""

import random

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.search.jobs import Completion
from mop_airflow.search.pbt import explore, mutations, pbt_decision, pbt_plan

SPACE = {"model": ["m:mlp"], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 0.1},
         "batch_size": [16, 32, 64], "hparams": {"dropout": [0.0, 0.2], "units": [32]}}
LR = {"distribution": "log_uniform", "low": 1e-4, "high": 0.1}


def plan(**options):
    return pbt_plan({"population": 8, "iterations": 6, "interval": 2, "mutations": {"learning_rate": LR}, **options},
                    SPACE)


def config(cid, lr=0.01, batch=32, dropout=0.2):
    return {"config_id": cid, "model": "m:mlp", "hparams": {"dropout": dropout, "units": 32}, "optimizer": "adam",
            "optimizer_params": {"learning_rate": lr}, "loss": "sparse_categorical_crossentropy",
            "metrics": ["accuracy"], "batch_size": batch, "epochs_per_hop": 1}


def test_the_plan_takes_ray_tunes_defaults_and_ranks_at_every_interval():
    p = plan()
    assert (p.quantile, p.resample_probability, p.perturbation_factors) == (0.25, 0.25, (1.2, 0.8))
    assert p.boundaries == [2, 4] and [p.segment_end(k) for k in range(3)] == [2, 4, 6]
    assert p.in_quantile() == 2  # ceil(8 x 0.25)
    assert pbt_plan({"population": 3, "iterations": 4, "interval": 1, "quantile": 0.5,
                     "mutations": {"learning_rate": LR}}).in_quantile() == 1  # ceil(1.5) = 2 > 3/2: floor(3/2)
    assert p.halving_iterations() == 48 and p.to_dict()["method"] == "pbt"


@pytest.mark.parametrize("options, field, rule", [
    ({"population": 1}, "search.adaptive.population", ">= 2"),
    ({"interval": 6}, "search.adaptive.interval", "below iterations=6"),
    ({"quantile": 0.6}, "search.adaptive.quantile", "<= 0.5"),
    ({"quantile": 0}, "search.adaptive.quantile", "> 0"),
    ({"resample_probability": 1.5}, "search.adaptive.resample_probability", "<= 1.0"),
    ({"perturbation_factors": [1.2, -1]}, "search.adaptive.perturbation_factors", "numbers > 0"),
    ({"perturbaton_factors": [1.2]}, "search.adaptive.perturbaton_factors", "not an option of pbt"),
    ({"mutations": {}}, "search.adaptive.mutations", "non-empty mapping"),
    ({"mutations": {"hparams.units": [32, 64], "model": ["m:cnn"]}}, "search.adaptive.mutations.model",
     "cannot be mutated"),
    ({"mutations": {"optimizer": ["sgd"]}}, "search.adaptive.mutations.optimizer", "cannot be mutated"),
    ({"mutations": {"hparams.width": [1, 2]}}, "search.adaptive.mutations.hparams.width", "not in the search space"),
    ({"mutations": {"momentum": [0.9]}}, "search.adaptive.mutations.momentum", "not a field a mutation can change"),
    ({"mutations": {"batch_size": [16, 0.5]}}, "search.adaptive.mutations.batch_size", "whole number"),
    ({"mutations": {"batch_size": {"distribution": "uniform", "low": 16, "high": 64}}},
     "search.adaptive.mutations.batch_size", "whole number"),
    ({"mutations": {"learning_rate": {"distribution": "uniform", "low": -1, "high": 1}}},
     "search.adaptive.mutations.learning_rate", "> 0"),
    ({"mutations": {"learning_rate": {"distribution": "log_uniform", "low": 1e-4, "hi": 1}}},
     "search.adaptive.mutations.learning_rate.hi", "not an option of log_uniform"),
])
def test_bad_options_are_refused_with_the_field_the_value_the_rule_and_a_fix(options, field, rule):
    with pytest.raises(SpecError) as caught:
        plan(**options)
    assert caught.value.field == field and rule in str(caught.value) and "Fix" in str(caught.value), str(caught.value)


def test_exploring_perturbs_by_the_factors_or_moves_to_a_list_neighbour_and_stays_in_range():
    p = plan(mutations={"learning_rate": LR, "batch_size": [16, 32, 64]}, resample_probability=0.0)
    seen_lr, seen_batch = set(), set()
    for k in range(40):
        child, changes = explore(config("a", lr=0.01), p, random.Random(k))
        seen_lr.add(round(child["optimizer_params"]["learning_rate"], 6))
        seen_batch.add(child["batch_size"])
        assert "config_id" not in child and set(changes) <= {"learning_rate", "batch_size"}
    assert seen_lr == {0.012, 0.008} and seen_batch == {16, 64}
    top, _ = explore(config("a", lr=0.1), plan(resample_probability=0.0, perturbation_factors=[1.2]), random.Random(0))
    assert top["optimizer_params"]["learning_rate"] == 0.1  # clipped into the range, not 0.12
    drawn = {explore(config("a"), plan(resample_probability=1.0), random.Random(k))[0]["optimizer_params"]
             ["learning_rate"] for k in range(20)}
    assert len(drawn) == 20 and all(1e-4 <= lr <= 0.1 for lr in drawn)  # resampled from the distribution


def completions(metrics, segment=0):
    return [Completion(cid, segment, value, "ok" if value is not None else "failed") for cid, value in metrics.items()]


def test_the_bottom_quantile_copies_the_top_and_every_copy_says_who_when_and_what_changed():
    p = plan()
    members = [f"c{k}" for k in range(8)]
    configs = {cid: config(cid) for cid in members}
    done = completions({cid: 0.5 + 0.05 * k for k, cid in enumerate(members)})  # c7 best, c0 worst
    names = iter(f"n{k}" for k in range(10))
    jobs, copies, born = pbt_decision(p, members, done, configs, segment=0, seed=3, direction="max",
                                      new_id=lambda c: next(names))
    assert {c.replaced for c in copies} == {"c0", "c1"} and {c.parent for c in copies} <= {"c6", "c7"}
    assert [c.member for c in copies] == [0, 1] and all(c.iteration == 2 and c.of == 8 for c in copies)
    assert [c["config_id"] for c in born] == ["n0", "n1"] and [c.config_id for c in copies] == ["n0", "n1"]
    for copy, child in zip(copies, born):
        parent_lr = configs[copy.parent]["optimizer_params"]["learning_rate"]
        assert copy.changes["learning_rate"][0] == parent_lr
        assert child["optimizer_params"]["learning_rate"] == copy.changes["learning_rate"][1] != parent_lr
    kinds = {j.config_id: (j.kind, j.iterations) for j in jobs}
    assert kinds == {**{cid: ("continue", 4) for cid in members[2:]}, "n0": ("exploit", 4), "n1": ("exploit", 4)}
    again = pbt_decision(p, members, done, configs, segment=0, seed=3, direction="max",
                         new_id=lambda c, names=iter(["n0", "n1"]): next(names))
    assert again[1] == copies  # the same records, the same copies
    assert pbt_decision(p, members, done, configs, segment=2, seed=3, direction="max", new_id=str) == ([], [], [])


def test_a_failed_member_is_replaced_even_beyond_the_quantile_and_minimising_ranks_the_other_way():
    p = plan()
    members = [f"c{k}" for k in range(8)]
    configs = {cid: config(cid) for cid in members}
    losses = {cid: 0.1 * (k + 1) for k, cid in enumerate(members)}
    losses["c3"] = None  # failed
    names = iter(f"n{k}" for k in range(10))
    _, copies, _ = pbt_decision(p, members, completions(losses), configs, segment=0, seed=0, direction="min",
                                new_id=lambda c: next(names))
    assert sorted(c.replaced for c in copies) == ["c3", "c6", "c7"]  # the two worst losses and the failure
    assert {c.parent for c in copies} <= {"c0", "c1"}


def test_mutations_of_the_space_hparams_parse_and_refuse_what_is_missing():
    parsed = mutations({"hparams.dropout": [0.0, 0.1, 0.2], "learning_rate": LR}, SPACE)
    assert parsed["hparams.dropout"] == [0.0, 0.1, 0.2] and parsed["learning_rate"].name == "log_uniform"
    with pytest.raises(SpecError, match="did you mean"):
        pbt_plan({"population": 4, "iterations": 4, "interval": 2, "mutation": {}}, SPACE)
