"""Configurations fused into one compiled step on Keras's JAX backend: which fuse, and that each member
learns what it learns alone (to float rounding) and the same bits every time.

The training runs in a process of its own on JAX's CPU backend (KERAS_BACKEND is fixed when Keras is
imported), as tests/training/test_jax_backend.py does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mop_airflow.config.spec import ScheduleSpec
from mop_airflow.errors import SpecError
from mop_airflow.planning.fusing import AUTO_LIMIT, fuse_groups, fuse_key, fuse_limit
from mop_airflow.training.fused import varied_scalars

REPO = Path(__file__).resolve().parents[2]
CNN = "mop_airflow.examples.mnist1d_models:cnn"
MLP = "mop_airflow.examples.mnist1d_models:mlp"


def config(cid: str, model: str = MLP, optimizer: str = "adam", batch_size: int = 32, **params: float) -> dict:
    return {"config_id": cid, "model": model, "hparams": {}, "optimizer": optimizer,
            "optimizer_params": {"learning_rate": 1e-3, **params}, "loss": "sparse_categorical_crossentropy",
            "metrics": ["accuracy"], "batch_size": batch_size, "epochs_per_hop": 1}


def test_configurations_that_differ_in_learning_rate_and_weight_decay_fuse_in_even_groups():
    same = [config(f"a{i}", optimizer="adamw", learning_rate=10 ** -(1 + i / 4), weight_decay=0.004 * (1 + i % 2))
            for i in range(10)]
    others = [config("cnn", CNN), config("batch64", batch_size=64), config("other", optimizer="adamw",
                                                                           learning_rate=0.5)]
    groups = fuse_groups([same[0], *others, *same[1:]], 8, "jax")
    # 10 of one key under a limit of 8: 5 and 5, in the order of their first member
    assert groups == [[f"a{i}" for i in range(5)], [f"a{i}" for i in range(5, 10)], ["cnn"], ["batch64"], ["other"]]
    assert fuse_groups(same, "auto", "jax") == groups[:2] and AUTO_LIMIT == 8
    assert fuse_groups(same[:3], 2, "jax") == [["a0"], ["a1", "a2"]]
    assert varied_scalars(same[:2]) == {"weight_decay": [0.004, 0.008]}
    assert varied_scalars([same[0], same[2]]) == {}  # one weight decay: the traced float is the step's own


@pytest.mark.parametrize("setting", ["off", False, 1])
def test_off_or_a_limit_of_one_trains_every_configuration_alone(setting):
    assert fuse_groups([config("a"), config("b", learning_rate=0.1)], setting, "jax") == [["a"], ["b"]]


def test_nothing_fuses_on_another_backend():
    assert fuse_groups([config("a"), config("b", learning_rate=0.1)], 8, "tensorflow") == [["a"], ["b"]]


@pytest.mark.parametrize("change", [
    {"model": CNN}, {"batch_size": 64}, {"epochs_per_hop": 2}, {"loss": "categorical_crossentropy"},
    {"metrics": []}, {"hparams": {"units": [64]}}, {"optimizer": "sgd"},
    {"optimizer_params": {"learning_rate": 1e-3, "beta_1": 0.8}},   # folded into Python floats
    {"optimizer_params": {"learning_rate": 1e-3, "weight_decay": 0.01}},  # a decay where the other has none
])
def test_what_changes_the_program_keeps_configurations_apart(change):
    assert fuse_key({**config("b"), **change}) != fuse_key(config("a"))
    assert fuse_groups([config("a"), {**config("b"), **change}], 8, "jax") == [["a"], ["b"]]


def test_sgd_momentum_values_stay_apart_and_an_averaging_optimizer_trains_alone():
    momenta = [config("m1", optimizer="sgd", momentum=0.9), config("m2", optimizer="sgd", momentum=0.0)]
    assert fuse_groups(momenta, 8, "jax") == [["m1"], ["m2"]]  # SGD branches on momentum == 0
    ema = [config("e1", use_ema=True), config("e2", use_ema=True, learning_rate=0.1)]
    assert fuse_key(ema[0]) is None and fuse_groups(ema, 8, "jax") == [["e1"], ["e2"]]


@pytest.mark.parametrize("value", [0, -2, True, "on", 2.5, None, [4]])
def test_a_bad_fuse_setting_names_the_field_the_rule_and_the_fix(value):
    expected = (f'schedule.fuse={value!r}: must be an integer >= 1, "auto" or "off". Fix: leave schedule.fuse out '
                '("off": every configuration trains alone), set the most configurations one compiled step may '
                'train together such as 8, or "auto"')
    for refuse in (lambda: ScheduleSpec(fuse=value), lambda: fuse_limit(value)):
        with pytest.raises(SpecError) as info:
            refuse()
        assert str(info.value) == expected


@pytest.mark.parametrize("value, limit", [("off", 1), (False, 1), ("auto", AUTO_LIMIT), (1, 1), (16, 16)])
def test_a_fuse_setting_is_kept_in_the_schedule_and_gives_its_limit(value, limit):
    assert ScheduleSpec(fuse=value).fuse == value and fuse_limit(value) == limit
    assert ScheduleSpec().fuse == "off"


FUSED = r"""
import io, json, sys
import numpy as np
from mop_airflow.data.shard import shard_dataset
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.records import Assignment
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.planning.fusing import fuse_groups
from mop_airflow.training.fused import train_fused_hop
from mop_airflow.training.model_hop import run_hop, state_after
from mop_airflow.training.session import TaskSession, WARM_MODELS

spec = json.loads(sys.argv[1])

def arrays(store, uri):
    with np.load(io.BytesIO(store.read_bytes(uri))) as archive:
        return {k: archive[k].tolist() for k in archive.files if k.startswith(("model/", "optimizer/"))}

out = {}
for run_id in ("alone", "fused", "fused_again"):
    run = resolve_run(spec, None, dag_id="d", run_id=run_id)
    layout = RunLayout(Store(run.store.root), "d", run_id)
    manifest = shard_dataset(run.data, layout.store, "d", 2, run.schedule.seed)
    session = TaskSession(run, manifest, run.store.cache_dir, max_models=WARM_MODELS)
    states = {c["config_id"]: Assignment(c["config_id"], -1, None) for c in run.configs}
    groups = fuse_groups(run.configs, "off" if run_id == "alone" else 4, "jax")
    records = {}
    for t, shard in ((0, 0), (1, 1)):  # the second hop restores every member from its checkpoint
        for group in groups:
            if run_id == "alone":
                trained = [run_hop(layout, run, manifest, states[group[0]], t=t, shard=shard,
                                   cache_dir=run.store.cache_dir, session=session)[0]]
            else:
                trained = [hop.commit() for hop in train_fused_hop(
                    layout, run, manifest, [states[c] for c in group], t=t, shard=shard,
                    cache_dir=run.store.cache_dir, session=session)]
            for record in trained:
                states[record.config_id] = state_after(record)
                records[f"{record.config_id}/{t}"] = {
                    "train": record.train_metrics, "val": record.val_metrics, "sha256": record.checkpoint_sha256,
                    "state": arrays(layout.store, record.checkpoint)}
    out[run_id] = {"groups": groups, "records": records}
out["tensorflow"] = "tensorflow" in sys.modules
print(json.dumps(out))
"""


def digits_data(folder: Path) -> dict:
    """scikit-learn's digits written to ``folder/digits.parquet`` (64 features in [0, 1]), as a spec's data section."""
    from sklearn.datasets import load_digits

    import pyarrow as pa
    import pyarrow.parquet as pq

    x, y = load_digits(return_X_y=True)
    pq.write_table(pa.table({**{f"f{i:02d}": (x[:, i] / 16).astype("float32") for i in range(64)}, "y": y}),
                   folder / "digits.parquet")
    return {"source": str(folder / "digits.parquet"), "label": "y", "features": "f*", "classes": list(range(10)),
            "validation": 0.2}


def run_jax(script: str, spec: dict) -> dict:
    """``script`` run with ``spec`` on JAX's CPU backend in a process of its own; the JSON its last line prints."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], env=env, capture_output=True, text=True,
                          cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fused_runs(tmp_path_factory):
    """Four configurations of the demo's CNN (dropout 0.25, AdamW: learning rates 1e-3 and 3e-3 x weight
    decays 0.004 and 0.04, each its own seed) on scikit-learn's digits in 2 shards, 2 hops: alone, then
    fused as one group, twice."""
    pytest.importorskip("jax")
    folder = tmp_path_factory.mktemp("fused")
    spec = {"data": digits_data(folder),
            "search": {"space": {"method": "grid", "params": {
                "model": [CNN], "optimizer": "adamw", "learning_rate": [1e-3, 3e-3],
                "optimizer_params": {"weight_decay": [0.004, 0.04]}, "batch_size": [32],
                "hparams": {"dropout": [0.25]}}}},
            "schedule": {"shards": 2, "iterations": 1, "seed": 3},
            "store": {"root": f"file://{folder / 'store'}", "cache_dir": str(folder / "cache")}}
    return run_jax(FUSED, spec)


# Measured on the 2-core machine (2026-11-27), these four configurations: after two hops the largest
# difference between a member fused and alone was 4.6e-7 in a weight or optimizer moment of the CNN (2.2e-7
# for the MLP), 1.2e-7 in a metric: float rounding of the batched products and sums. At a learning rate of
# 1e-2 Adam amplified it in weights whose gradients are about 0 (up to a few thousandths after two hops).
ATOL = 1e-5
# Over the four hops of the slot test, Adam compounds that rounding: a member's train loss at its fourth
# hop was 6.1e-5 from alone's (0.23469 against 0.23475; 2026-11-27, a loaded 2-core machine), and its
# checkpoint differs by as much. The loop's own claims there (groups, records, order) are exact.
HOPS_RTOL = 1e-3


def test_a_fused_member_learns_what_it_learns_alone_to_float_rounding(fused_runs):
    alone, fused = fused_runs["alone"], fused_runs["fused"]
    assert len(fused["groups"]) == 1 and len(fused["groups"][0]) == 4 and len(alone["groups"]) == 4
    assert set(fused["records"]) == set(alone["records"]) and len(alone["records"]) == 8
    for key, expected in alone["records"].items():
        got = fused["records"][key]
        assert got["train"]["steps"] == expected["train"]["steps"] == 23  # 718 rows in batches of 32
        assert got["train"]["samples"] == expected["train"]["samples"]
        for name in ("loss", "accuracy"):
            assert got["train"][name] == pytest.approx(expected["train"][name], abs=ATOL), (key, name)
        assert (got["val"] is None) == (expected["val"] is None) == key.endswith("/0")  # evaluated at hop 1
        for name, value in (expected["val"] or {}).items():
            assert got["val"][name] == pytest.approx(value, abs=ATOL), (key, name)
        assert set(got["state"]) == set(expected["state"])  # the same checkpoint format, variable by variable
        for name, value in expected["state"].items():
            np.testing.assert_allclose(got["state"][name], value, rtol=0, atol=ATOL, err_msg=f"{key} {name}")
        assert got["state"]["optimizer/00000"] == expected["state"]["optimizer/00000"]  # the step counter
    # the members kept their own learning rates (an optimizer variable) and seeds: no two states agree
    weights = {key: np.asarray(r["state"]["model/00000"]).tobytes() for key, r in fused["records"].items()}
    assert len(set(weights.values())) == 8


def test_a_fused_group_trains_to_the_same_bits_every_time_without_tensorflow(fused_runs):
    fused, again = fused_runs["fused"], fused_runs["fused_again"]
    assert {k: r["sha256"] for k, r in fused["records"].items()} == \
        {k: r["sha256"] for k, r in again["records"].items()}
    assert not fused_runs["tensorflow"]


def test_fused_groups_are_dealt_whole_into_classes_and_slots_and_groups_of_one_as_before():
    from mop_airflow.planning.lineup import deal_groups
    from mop_airflow.planning.schedule import deal_classes
    from mop_airflow.planning.placement import deal_fused_slots

    ids = [f"c{i}" for i in range(11)]
    for shards in (1, 2, 3, 4):  # configurations alone: the seeded deal of a search without schedule.fuse
        assert deal_groups([[c] for c in ids], shards=shards, seed=5) == [
            list(c) for c in deal_classes(ids, shards=shards, seed=5)]
        assert deal_fused_slots([ids], shards, lambda cids: [[c] for c in cids]) == {
            c: i % shards for i, c in enumerate(ids)}
    classes = deal_groups([["a", "b", "c"], ["d"], ["e", "f"], ["g", "h"]], shards=2, seed=1)
    assert sorted(map(len, classes)) == [4, 4]
    for group in (["a", "b", "c"], ["e", "f"], ["g", "h"]):
        assert sum(set(group) <= set(members) for members in classes) == 1
    # two slots: each group whole on the slot holding the fewest configurations of the block so far
    pairs = {"a": "ab", "b": "ab", "c": "c", "d": "de", "e": "de"}
    groups = lambda cids: [[c for c in cids if pairs[c] == p] for p in dict.fromkeys(pairs[c] for c in cids)]
    assert deal_fused_slots([["a", "b", "c"], ["d", "e"]], 2, groups) == {"a": 0, "b": 0, "c": 1, "d": 1, "e": 1}


def test_fused_partners_come_from_the_plan_per_shard_slot_and_hop():
    from types import SimpleNamespace

    from mop_airflow.planning.fusing import groups_of
    from mop_airflow.planning.placement import BlockHop, fused_partners

    configs = [config(f"a{i}", learning_rate=10 ** -(1 + i)) for i in range(5)] + [config("b64", batch_size=64)]
    run = SimpleNamespace(configs=configs, schedule=SimpleNamespace(fuse=2))
    hop = lambda cid, slot: BlockHop(cid, offset=0, step=0, shard=0, slot=slot, hop=0)  # noqa: E731
    places = [hop(cid, 0) for cid in ["a0", "a1", "a2", "b64"]] + [hop("a3", 1), hop("a4", 1)]
    partners = fused_partners(places, lambda cids: groups_of(run, cids))
    # a limit of 2: a0..a2 of one key on one slot cut 1 + 2; b64 alone; a3, a4 on the other slot together
    assert partners == {("a1", 0): {"a1", "a2"}, ("a2", 0): {"a1", "a2"}, ("a3", 0): {"a3", "a4"},
                        ("a4", 0): {"a3", "a4"}}


SLOTS = r"""
import glob, json, sys
from mop_airflow.data.shard import shard_dataset
from mop_airflow.planning.fusing import grouping
from mop_airflow.planning.plan import make_plan
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.planning.schedule import shard_at
from mop_airflow.records import Assignment, HopRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.training.model_hop import run_hop
from mop_airflow.planning.placement import block_hops
from mop_airflow.slots.driver import run_slot
from mop_airflow.training.session import TaskSession, WARM_MODELS

spec = json.loads(sys.argv[1])
p, hops = spec["schedule"]["shards"], spec["schedule"]["shards"] * spec["schedule"]["iterations"]
out = {}
for run_id in ("fused", "fused_again", "alone"):
    run = resolve_run(spec, None, dag_id="d", run_id=run_id)
    layout = RunLayout(Store(run.store.root), "d", run_id)
    manifest = shard_dataset(run.data, layout.store, "d", p, run.schedule.seed)
    classes = make_plan(run).classes
    if run_id == "alone":  # the reference: each configuration by itself on the shards its class visits
        for o, members in enumerate(classes):
            for cid in members:
                state = Assignment(cid, -1, None)
                for t in range(hops):
                    _, state = run_hop(layout, run, manifest, state, t=t, shard=shard_at(o, t, p),
                                       cache_dir=run.store.cache_dir)
    else:
        blocks = block_hops([[Assignment(c, -1, None) for c in m] for m in classes], shards=p, slots=2, start=0, end=hops,
                            fuse=grouping(run))
        run_slot(layout, run, manifest, blocks, block="b", shard=0, slot=0, cache_dir=run.store.cache_dir,
                 mine=blocks, session=TaskSession(run, manifest, run.store.cache_dir, max_models=WARM_MODELS))
    records = [HopRecord.read(layout.store, uri) for uri in layout.store.glob(layout.hops_glob)]
    out[run_id] = {"classes": classes, "batch": {c["config_id"]: c["batch_size"] for c in run.configs}, "records": {f"{r.config_id}/{r.t}": {
        "train": r.train_metrics, "val": r.val_metrics, "sha256": r.checkpoint_sha256, "fused": r.fused,
        "shard": r.shard} for r in records}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def slot_runs(tmp_path_factory):
    """Eight configurations of the demo's MLP on scikit-learn's digits, 2 shards x 2 slots, 2 iterations,
    ``schedule.fuse`` 4: two fuse keys (batch sizes 32 and 64) of four learning rates each, trained by
    the shard loop twice, and each configuration alone on the same shards as the reference."""
    pytest.importorskip("jax")
    folder = tmp_path_factory.mktemp("slots")
    spec = {"data": digits_data(folder),
            "search": {"space": {"method": "grid", "params": {
                "model": [MLP], "optimizer": "adam", "learning_rate": [1e-3, 2e-3, 3e-3, 5e-3],
                "batch_size": [32, 64]}}},
            "schedule": {"shards": 2, "iterations": 2, "seed": 3, "fuse": 4},
            "store": {"root": f"file://{folder / 'store'}", "cache_dir": str(folder / "cache")}}
    return run_jax(SLOTS, spec)


def test_the_shard_slots_train_each_fused_group_as_one_and_record_each_member_as_alone(slot_runs):
    fused, alone = slot_runs["fused"], slot_runs["alone"]
    # each fuse key's four configurations dealt whole into one offset class
    assert sorted(sorted(fused["batch"][c] for c in members) for members in fused["classes"]) == [[32] * 4, [64] * 4]
    assert set(fused["records"]) == set(alone["records"]) and len(alone["records"]) == 8 * 4
    assert {r["fused"] for r in fused["records"].values()} == {4} and {r["fused"] for r in alone["records"].values()} == {1}
    for key, expected in alone["records"].items():
        got = fused["records"][key]
        assert got["shard"] == expected["shard"]
        assert got["train"]["steps"] == expected["train"]["steps"]
        for name in ("loss", "accuracy"):
            assert got["train"][name] == pytest.approx(expected["train"][name], rel=HOPS_RTOL, abs=ATOL), (key, name)
        assert (got["val"] is None) == (expected["val"] is None)
        for name, value in (expected["val"] or {}).items():
            assert got["val"][name] == pytest.approx(value, rel=HOPS_RTOL, abs=ATOL), (key, name)
    assert {k: r["sha256"] for k, r in fused["records"].items()} == {
        k: r["sha256"] for k, r in slot_runs["fused_again"]["records"].items()}
