"""Which configurations share an offset class and in which order a class is taken: costs, model keys,
determinism; bundle_size refused."""

from __future__ import annotations

import pytest

from mop_airflow.planning.lineup import BUILD_SECONDS, deal, deal_configs, hop_cost, line_up, model_key
from mop_airflow.errors import SpecError
from mop_airflow.planning.schedule import deal_classes
from mop_airflow.config import ScheduleSpec


def _config(cid, model="m:a", lr=0.01, batch=32, **extra):
    return {"config_id": cid, "model": model, "hparams": extra.pop("hparams", {}), "optimizer": "adam",
            "optimizer_params": {"learning_rate": lr}, "loss": "sparse_categorical_crossentropy",
            "metrics": ["accuracy"], "batch_size": batch, "epochs_per_hop": 1, **extra}


def test_hop_cost_counts_steps_and_rows():
    # 4000 rows at batch 32: 125 steps of 4 ms and 4000 rows of 20 us
    assert hop_cost(_config("a"), 4000) == pytest.approx(125 * 0.004 + 4000 * 2e-5)
    assert hop_cost(_config("a", batch=128), 4000) < hop_cost(_config("a"), 4000)
    assert hop_cost({**_config("a"), "epochs_per_hop": 3}, 4000) == pytest.approx(3 * hop_cost(_config("a"), 4000))


def _demo_grid():
    """The demo grid's 8 configurations: MLP and CNN x 2 learning rates x batch 32, 128."""
    configs = [_config(f"c{i}", model=model, lr=lr, batch=batch)
               for i, (model, lr, batch) in enumerate((m, lr, b) for m in ("ex:mlp", "ex:cnn")
                                                      for lr in (3e-3, 1e-2) for b in (32, 128))]
    return {c["config_id"]: c for c in configs}


def test_short_hops_deal_each_model_s_configurations_into_the_same_classes():
    configs = _demo_grid()
    classes = deal_configs(list(configs), configs, rows=4000, shards=4, seed=42)
    assert sorted(len(c) for c in classes) == [2, 2, 2, 2]  # the seeded deal's sizes
    assert sorted(c for cls in classes for c in cls) == sorted(configs)
    # one model per class (4 models to build per round of hops instead of up to 8), and each class
    # holds one configuration of each batch size: the costs stay balanced
    for cls in classes:
        assert len({configs[c]["model"] for c in cls}) == 1
        assert sorted(configs[c]["batch_size"] for c in cls) == [32, 128]
    assert classes == deal_configs(list(configs), configs, rows=4000, shards=4, seed=42)  # deterministic


def test_the_seeded_deal_stays_when_grouping_by_model_would_unbalance_the_classes():
    # two models: one with 3 costly configurations, one with 3 cheap ones, on 3 shards. Grouped
    # classes would each hold one model but the costliest class would cost 2 x 10 + a build.
    costs = {"a1": 10.0, "a2": 10.0, "a3": 10.0, "b1": 0.1, "b2": 0.1, "b3": 0.1}
    keys = {c: c[0] for c in costs}
    ids = sorted(costs)
    dealt = deal(ids, costs, keys, shards=3, seed=0)
    assert dealt == [list(c) for c in deal_classes(ids, shards=3, seed=0)]
    # the same configurations, all of one model and one cost: nothing to gain, the seeded deal
    same = {c: 1.0 for c in ids}
    assert deal(ids, same, {c: "m" for c in ids}, shards=3, seed=5) == [list(c) for c in deal_classes(ids, shards=3,
                                                                                                     seed=5)]
    # builds that cost more than the hops: one model per class
    cheap = {c: BUILD_SECONDS / 100 for c in ids}
    assert sorted(map(sorted, deal(ids, cheap, keys, shards=2, seed=0))) == [["a1", "a2", "a3"], ["b1", "b2", "b3"]]


def test_the_learning_rate_is_not_part_of_the_model_key():
    assert model_key(_config("a", lr=0.1)) == model_key(_config("b", lr=0.001, batch=8))
    assert model_key(_config("a")) != model_key(_config("a", hparams={"units": 8}))
    assert model_key(_config("a")) != model_key({**_config("a"), "optimizer": "sgd"})
    assert model_key(_config("a")) != model_key({**_config("a"), "optimizer_params": {"learning_rate": 0.1,
                                                                                      "clipnorm": 1.0}})


def test_each_class_is_lined_up_by_model_then_longest_first():
    classes = [["a", "b", "c", "d"], [], ["e"]]
    configs = {"a": _config("a", model="m:b"), "b": _config("b", model="m:a", batch=8),
               "c": _config("c", model="m:b", batch=8), "d": _config("d", model="m:a"), "e": _config("e")}
    lined = line_up(classes, configs, rows=4000)
    # m:a before m:b (by key), and inside a model the smaller batch (more steps: the longer hop) first
    assert lined == [["b", "d", "c", "a"], [], ["e"]]
    assert line_up(classes, configs, rows=4000) == lined  # deterministic


@pytest.mark.parametrize("value", [0, -1, "many", 1.5, True])
def test_schedule_rejects_a_bad_thread_count(value):
    with pytest.raises(SpecError, match=r"schedule.threads_per_hop=.*Fix:"):
        ScheduleSpec(threads_per_hop=value)


@pytest.mark.parametrize("value", [1, 2, "auto"])
def test_bundle_size_is_refused_saying_it_no_longer_exists_and_what_replaced_it(value):
    from mop_airflow.config import MopSpec
    from tests.test_spec import spec_dict

    spec = spec_dict()
    spec["schedule"] = {**spec.get("schedule", {}), "bundle_size": value}
    with pytest.raises(SpecError) as err:
        MopSpec.from_dict(spec)
    assert err.value.field == "schedule.bundle_size" and err.value.value == value
    assert err.value.rule.startswith("no longer exists: a block is one train task per shard slot")
    assert err.value.fix == "remove schedule.bundle_size"




def test_records_written_with_bundles_read_their_order_as_the_lineup():
    """A plan or block decision written while each offset class was listed as bundles (a search that
    began before the upgrade) reads as the same order, so its later blocks train as planned."""
    from mop_airflow.records import BlockDecision, Plan

    old = {"shards": 2, "iterations": 1, "seed": 0, "priority": "remaining", "model_hops_total": 6,
           "classes": [["a", "b"], ["c"]], "bundles": [[["b"], ["a"]], [["c"]]], "bundle_size": 1, "chains": {}}
    plan = Plan.from_dict(old)
    assert plan.lineup == plan.class_lineup() == [["b", "a"], ["c"]]
    assert Plan.from_dict({**old, "bundles": []}).class_lineup() == [["a", "b"], ["c"]]  # before bundling: the deal
    assert Plan.from_dict(plan.to_dict()) == plan  # written again, it keeps the lineup
    decision = BlockDecision.from_dict({"block": 1, "capacity": 2, "bundles": [[["a", "b"]], []]})
    assert decision.lineup == [["a", "b"], []]
