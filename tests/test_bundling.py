"""How configurations are bundled: hand-computable counts, balanced costs, determinism, the plan record."""

from __future__ import annotations

import pytest

from mop_airflow.records import bundle_name
from mop_airflow.planning.bundling import (BUILD_SECONDS, CHAINS_PER_SLOT, TASK_INSTANCE_BUDGET, bundle_class,
                                  chain_count, deal, deal_configs, hop_cost, make_bundles, model_key)
from mop_airflow.errors import SpecError
from mop_airflow.records import Plan
from mop_airflow.planning.schedule import deal_classes
from mop_airflow.planning.plan import make_plan
from mop_airflow.planning.resolve import resolve_run
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


@pytest.mark.parametrize("n, shards, slots, hops, cost, expected", [
    (8, 4, 1, 12, 3.2, 4),           # the demo: cheap hops, so one chain per slot (2 configurations each)
    (8, 4, 1, 12, 1000.0, 8),        # long hops: two chains per slot, one configuration each
    (3, 4, 1, 12, 1000.0, 3),        # fewer configurations than slots: one chain each
    (256, 4, 2, 4, 1.0, 8),          # 256 cheap configurations on 8 slots: 8 chains of 32
    (256, 4, 2, 4, 1e6, 16),         # at most two chains per slot
    (256, 16, 1, 160, 1e6, 16),      # 16 shards x 10 iterations: the task-instance budget keeps one per class
    (256, 4, 1, 10, 40.0, 5),        # 40 s per hop: 5 chains carry 8 s (4 x the fixed cost) each
])
def test_auto_chain_count(n, shards, slots, hops, cost, expected):
    assert chain_count(n, shards=shards, slots=slots, hops=hops, cost_per_hop=cost) == expected


def test_fixed_bundle_size_and_the_budget():
    assert chain_count(10, shards=4, slots=1, hops=8, cost_per_hop=0.0, bundle_size=1) == 10
    assert chain_count(10, shards=4, slots=1, hops=8, cost_per_hop=0.0, bundle_size=3) == 4
    assert chain_count(0, shards=4, slots=1, hops=8, cost_per_hop=0.0) == 0
    # never more task instances than the budget, unless one chain per offset class already needs more
    many = chain_count(1000, shards=8, slots=4, hops=40, cost_per_hop=1e9)
    assert many == TASK_INSTANCE_BUDGET // 40 and many < CHAINS_PER_SLOT * 8 * 4


def test_bundles_balance_cost_and_keep_model_keys_together():
    configs = {f"c{i}": _config(f"c{i}", model="m:a" if i % 2 else "m:b", batch=32 if i < 4 else 128)
               for i in range(8)}
    costs = {cid: hop_cost(c, 4000) for cid, c in configs.items()}
    keys = {cid: model_key(c) for cid, c in configs.items()}
    bundles = bundle_class(sorted(configs), 2, costs, keys)
    totals = [sum(costs[c] for c in b) for b in bundles]
    assert sorted(c for b in bundles for c in b) == sorted(configs)
    assert max(totals) - min(totals) <= max(costs.values()) - min(costs.values())
    for bundle in bundles:  # same keys next to each other inside a bundle
        seen = [keys[c] for c in bundle]
        assert seen == sorted(seen)
    assert bundle_class(sorted(configs), 2, costs, keys) == bundles  # deterministic


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


def test_make_bundles_splits_each_class():
    classes = [[f"c{o}{i}" for i in range(5)] for o in range(4)]
    configs = {cid: _config(cid) for cls in classes for cid in cls}
    one = make_bundles(classes, configs, rows=4000, shards=4, slots=1, hops=12, bundle_size=1)
    assert [len(b) for b in one] == [5, 5, 5, 5] and all(len(x) == 1 for b in one for x in b)
    two = make_bundles(classes, configs, rows=4000, shards=4, slots=1, hops=12, bundle_size=2)
    assert [[len(x) for x in b] for b in two] == [[2, 2, 1]] * 4
    auto = make_bundles(classes, configs, rows=4000, shards=4, slots=1, hops=12)
    assert [len(b) for b in auto] == [1, 1, 1, 1]  # 20 cheap hops: one chain per slot
    for per_class, cls in zip(auto, classes):
        assert sorted(c for b in per_class for c in b) == sorted(cls)


def test_bundle_names_stay_readable():
    assert bundle_name(3, ["c001-aaaaaa", "c002-bbbbbb"]) == "b3: c001-aaaaaa, c002-bbbbbb"
    long = bundle_name(1, [f"c{i:03d}-abcdef" for i in range(64)])
    assert len(long) <= 200 and long.endswith("more") and long.startswith("b1: c000-abcdef, c001-abcdef")


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


