"""A bundle's hop trains its configurations in turn, reusing compiled models, with the very results
each configuration gets in a task of its own; failures stay with their configuration, and a
retried bundle hop trains only what is not committed yet."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mop_airflow.data.shard import shard_dataset
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import Assignment, BundleAssignment, HopRecord
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.store import Store
from mop_airflow.training.bundle_hop import run_bundle_hop
from mop_airflow.training.model_hop import run_hop

from .toys import TOY_MODEL, toy_spec

SHARDS = 2
HOPS = 4  # 2 iterations


def _setup(tmp_path, toy_data, name, models=(TOY_MODEL,)):
    spec = toy_spec(tmp_path, *toy_data, store=name, cache=f"{name}-cache", models=models, batch_sizes=(8, 16),
                    shards=SHARDS)
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", SHARDS, run.schedule.seed)
    return run, layout, manifest


def _arrays(layout, uri):
    with np.load(io.BytesIO(layout.store.read_bytes(uri)), allow_pickle=False) as archive:
        return {k: archive[k] for k in archive.files if k != "meta"}


def _alone(run, layout, manifest):
    """Every configuration in a task of its own per hop (bundle_size 1): no session shared."""
    out = {}
    for config in run.configs:
        cid, assignment = config["config_id"], Assignment(config["config_id"], -1, None)
        for t in range(HOPS):
            record, assignment = run_hop(layout, run, manifest, assignment, t=t, shard=(t + 1) % SHARDS,
                                         cache_dir=run.store.local_cache)
        out[cid] = record
    return out


def _bundled(run, layout, manifest, ids=None, **kwargs):
    ids = ids or [c["config_id"] for c in run.configs]
    bundle = BundleAssignment.start(0, [Assignment(cid, -1, None) for cid in ids])
    hops = []
    for t in range(HOPS):
        done = run_bundle_hop(layout, run, manifest, bundle, t=t, shard=(t + 1) % SHARDS,
                              cache_dir=run.store.local_cache, **kwargs)
        hops.append(done)
        bundle = done.out
    return hops


def test_a_bundle_hop_gives_each_configuration_the_weights_of_a_fresh_model(tmp_path, toy_data):
    run_a, layout_a, manifest_a = _setup(tmp_path, toy_data, "alone")
    run_b, layout_b, manifest_b = _setup(tmp_path, toy_data, "bundled")
    alone = _alone(run_a, layout_a, manifest_a)
    hops = _bundled(run_b, layout_b, manifest_b)
    # one model key (same builder, hparams, optimizer; only the learning rate and batch size differ):
    # each hop's task builds it once, and the bundle's other configurations reuse it
    for done in hops:
        assert [r.model_reused for r in done.records] == [False, True, True, True]
    assert [a.config_id for a in hops[-1].out.assignments] == [c["config_id"] for c in run_b.configs]
    for record in hops[-1].records:
        mine = alone[record.config_id]
        assert record.bundle == 0 and record.threads >= 1
        assert record.train_metrics["loss"] == mine.train_metrics["loss"]
        assert record.val_metrics == mine.val_metrics
        ours, theirs = _arrays(layout_b, record.checkpoint), _arrays(layout_a, mine.checkpoint)
        assert ours.keys() == theirs.keys() and len(ours) > 10
        for key in ours:  # weights, BatchNorm statistics, dropout seed state, step, learning rate, moments
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    # the learning rates stayed each configuration's own
    rates = {r.config_id: float(_arrays(layout_b, r.checkpoint)["optimizer/00001"]) for r in hops[-1].records}
    assert sorted(rates.values()) == pytest.approx([1e-2, 1e-2, 3e-2, 3e-2])


def test_a_failing_configuration_leaves_its_bundle_and_the_rest_goes_on(tmp_path, toy_data):
    run, layout, manifest = _setup(tmp_path, toy_data, "store", models=(TOY_MODEL, "tests.training.toys:raises"))
    hops = _bundled(run, layout, manifest)
    failing = {c["config_id"] for c in run.configs if c["model"].endswith(":raises")}
    assert len(failing) == 4 and len(run.configs) == 8
    assert {r.config_id for r in hops[0].failed} == failing
    assert all(r.status == "failed" and "KeyError" in r.error for r in hops[0].failed)
    assert [a.config_id for a in hops[-1].out.assignments] == [c for c in hops[0].out.config_ids]
    assert set(hops[-1].out.config_ids) == {c["config_id"] for c in run.configs} - failing
    assert hops[-1].out.name == "b0: " + ", ".join(hops[-1].out.config_ids)  # the name Airflow shows
    for cid in failing:  # its record says why; no later hop of it exists
        assert HopRecord.read(layout.store, layout.hop_record_uri(cid, 0)).status == "failed"
        assert not layout.store.exists(layout.hop_record_uri(cid, 1))


def test_fail_fast_errors_end_the_task(tmp_path, toy_data):
    run, layout, manifest = _setup(tmp_path, toy_data, "store", models=("tests.training.toys:raises",))
    with pytest.raises(Exception, match="builder"):
        _bundled(run, layout, manifest, fatal=lambda exc: True)


def test_a_retried_bundle_hop_trains_only_what_is_not_committed(tmp_path, toy_data):
    run_a, layout_a, manifest_a = _setup(tmp_path, toy_data, "undisturbed")
    undisturbed = _bundled(run_a, layout_a, manifest_a)
    run, layout, manifest = _setup(tmp_path, toy_data, "retried")
    ids = [c["config_id"] for c in run.configs]
    # the first try of hop 0 committed the first two configurations, then the worker died
    first_try = run_bundle_hop(layout, run, manifest, BundleAssignment.start(0, [Assignment(c, -1, None) for c in ids[:2]]),
                               t=0, shard=1, cache_dir=run.store.local_cache)
    assert len(first_try.records) == 2
    committed_at = {cid: HopRecord.read(layout.store, layout.hop_record_uri(cid, 0)).saved_at for cid in ids[:2]}
    retried = _bundled(run, layout, manifest)
    assert retried[0].skipped == ids[:2]
    assert {r.config_id for r in retried[0].records} == set(ids)
    for cid in ids[:2]:  # not written again
        assert HopRecord.read(layout.store, layout.hop_record_uri(cid, 0)).saved_at == committed_at[cid]
    final = {r.config_id: r for r in retried[-1].records}
    for record in undisturbed[-1].records:
        assert final[record.config_id].val_metrics == record.val_metrics
        assert final[record.config_id].checkpoint_sha256 == record.checkpoint_sha256
