"""The hop body and the rung decision run without Airflow: resolve a run, shard, plan, hop, rank."""

from __future__ import annotations

import numpy as np
import pytest

from mop_airflow.data.shard import shard_dataset
from mop_airflow.errors import SpecError, TrainingError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import Assignment, HopRecord
from mop_airflow.planning.plan import make_plan
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.planning.blocks import decide_next_block, first_block
from mop_airflow.results.runs import rungs_of_blocks
from mop_airflow.store import Store
from mop_airflow.training.model_hop import record_failure, run_hop

from .toys import TOY_MODEL, toy_spec


@pytest.fixture
def run_setup(tmp_path, toy_data):
    spec = toy_spec(tmp_path, *toy_data)
    run = resolve_run(spec, {"schedule": {"seed": 5}}, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", 2, run.schedule.seed)
    return run, layout, manifest


def test_resolve_applies_the_conf_once_and_rejects_a_missing_builder_module():
    from tests.test_spec import spec_dict

    run = resolve_run(spec_dict(), {"schedule": {"seed": 9}}, dag_id="d", run_id="r")
    assert run.schedule.seed == 9 and len(run.configs) == 2
    with pytest.raises(SpecError, match=r"conf.schedul=\{'seed': 9\}: is not a spec section. Fix: override only"):
        resolve_run(spec_dict(), {"schedul": {"seed": 9}}, dag_id="d", run_id="r")
    bad = spec_dict()
    bad["search"]["space"]["params"]["model"] = ["no_such_module_here:build"]
    with pytest.raises(Exception, match=r"search.space.params.model.*not importable"):
        resolve_run(bad, None, dag_id="d", run_id="r")


def test_a_configuration_chain_hops_and_resumes_its_optimizer(run_setup):
    run, layout, manifest = run_setup
    cid = run.configs[0]["config_id"]
    cache = run.store.local_cache
    record0, out0 = run_hop(layout, run, manifest, Assignment(cid, -1, None), t=0, shard=1, cache_dir=cache)
    assert (out0.t, out0.checkpoint) == (0, layout.checkpoint_uri(cid, 0))
    assert record0.status == "ok" and record0.val_metrics is None  # not the iteration's last hop
    record1, out1 = run_hop(layout, run, manifest, out0, t=1, shard=0, cache_dir=cache)
    assert set(record1.val_metrics) == {"val_loss", "val_accuracy"}  # the end of iteration 0
    stored = HopRecord.read(layout.store, layout.hop_record_uri(cid, 1))
    assert stored == record1 and stored.bytes_read["checkpoint"] == record0.checkpoint_bytes
    # the optimizer's step counter carried across the hop: steps of hop 0 + steps of hop 1
    import io

    with np.load(io.BytesIO(layout.store.read_bytes(out1.checkpoint))) as state:
        assert int(state["optimizer/00000"]) == record0.train_metrics["steps"] + record1.train_metrics["steps"]
    assert record1.train_metrics["steps"] == -(-manifest.shards[0].rows // 8)
    with pytest.raises(TrainingError, match="arrives from hop 1 but this is hop 3"):
        run_hop(layout, run, manifest, out1, t=3, shard=1, cache_dir=cache)


def test_a_shard_larger_than_the_stream_threshold_is_streamed(run_setup, monkeypatch):
    from mop_airflow.training import hop as hop_module
    from mop_airflow.training import model_hop

    run, layout, manifest = run_setup
    calls = []
    real = hop_module.train_streamed

    def spy(*args, **kwargs):
        calls.append(kwargs["window_rows"])
        return real(*args, **kwargs)

    monkeypatch.setattr(hop_module, "train_streamed", spy)
    monkeypatch.setattr(model_hop, "STREAM_ABOVE_BATCHES", 0)  # every shard is "large"
    cid = run.configs[0]["config_id"]
    record, _ = run_hop(layout, run, manifest, Assignment(cid, -1, None), t=0, shard=0,
                        cache_dir=run.store.local_cache)
    assert len(calls) == 1 and calls[0] >= 8  # at least one batch per window
    assert record.status == "ok" and record.train_metrics["samples"] == manifest.shards[0].rows
    assert record.train_metrics["steps"] == -(-manifest.shards[0].rows // 8)


def test_a_rung_decision_promotes_the_best_and_records_the_failure(run_setup, tmp_path):
    run, layout, manifest = run_setup
    spec = dict(run.spec)
    spec["search"] = {**spec["search"], "space": {"method": "random", "params": {"model": [TOY_MODEL],
                      "learning_rate": [1e-2, 3e-2, 1e-1], "batch_size": [8]}, "num_samples": None, "seed": 0},
                      "adaptive": {"method": "successive_halving", "n": 3, "r": 1, "eta": 3}}
    adaptive_run = resolve_run(spec, None, dag_id="d", run_id="hb")
    layout = RunLayout(layout.store, "d", "hb")
    plan = make_plan(adaptive_run)
    start = first_block(layout, adaptive_run, plan)
    classes = start.lineup  # per offset class, in the order its slots take it
    members = [c for per in classes for c in per]
    assert sorted(members) == sorted(c["config_id"] for c in adaptive_run.configs) == sorted(start.training)
    failing, *trained = sorted(members)
    for cid in trained:  # one iteration = hops 0 and 1; the class decides which shard comes first
        offset = next(o for o, per in enumerate(classes) if cid in per)
        assignment = Assignment(cid, -1, None)
        for t in range(2):
            _, assignment = run_hop(layout, adaptive_run, manifest, assignment, t=t, shard=(offset + t) % 2,
                                    rung_end=t == 1, cache_dir=adaptive_run.store.local_cache)
    record_failure(layout, Assignment(failing, -1, None), t=0, shard=0, shards=2, error=TrainingError("boom"))
    after = decide_next_block(layout, adaptive_run, plan, 0)
    (decision,) = rungs_of_blocks([start, after], plan, adaptive_run)
    metrics = {r["config_id"]: r["metric"] for r in decision.results if r["status"] == "ok"}
    assert len(metrics) == 2  # the two trained configurations were ranked; ties go to the lower id
    assert decision.promoted == [min(metrics, key=lambda c: (-metrics[c], c))]
    reasons = {e["config_id"]: e["reason"] for e in decision.pruned}
    assert reasons[failing] == "failed: TrainingError: boom"
    assert list(after.training) == decision.promoted and [j["kind"] for j in after.jobs] == ["promote"]
    assert after.length(2) == 4  # on from iteration 1 to rung 1's end at 3


def test_a_corrupt_checkpoint_is_an_error_naming_it_never_a_silent_restart(run_setup):
    run, layout, manifest = run_setup
    cid = run.configs[0]["config_id"]
    cache = run.store.local_cache
    record0, out0 = run_hop(layout, run, manifest, Assignment(cid, -1, None), t=0, shard=1, cache_dir=cache)
    import hashlib

    assert out0.checkpoint_sha256 == record0.checkpoint_sha256 == hashlib.sha256(
        layout.store.read_bytes(out0.checkpoint)).hexdigest()
    path = layout.store.local_path(out0.checkpoint)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF  # one flipped bit in the middle of the weights
    open(path, "wb").write(bytes(data))
    with pytest.raises(TrainingError, match=rf"checkpoint {out0.checkpoint} is corrupt: .* clear {cid}'s hop 0"):
        run_hop(layout, run, manifest, out0, t=1, shard=0, cache_dir=cache)
    assert not layout.store.exists(layout.checkpoint_uri(cid, 1))  # nothing trained on top of it


def test_a_checkpoint_of_another_configuration_is_refused_before_it_is_restored(run_setup):
    """Two configurations of one builder have the same shapes: only the checkpoint's meta tells them apart."""
    run, layout, manifest = run_setup
    mine, other = (c["config_id"] for c in run.configs[:2])
    cache = run.store.local_cache
    _, theirs = run_hop(layout, run, manifest, Assignment(other, -1, None), t=0, shard=1, cache_dir=cache)
    swapped = Assignment(mine, 0, theirs.checkpoint, checkpoint_sha256=theirs.checkpoint_sha256)
    with pytest.raises(TrainingError, match=rf"{theirs.checkpoint}: checkpoint holds the state of {other} after "
                                            rf"hop 0, not of {mine} after hop 0. Fix: clear the hop"):
        run_hop(layout, run, manifest, swapped, t=1, shard=0, cache_dir=cache)
    assert not layout.store.exists(layout.checkpoint_uri(mine, 1))


@pytest.mark.parametrize("t, keep, best, previous, stale", [
    (0, 2, None, None, []),
    (1, 2, 1, None, []),
    (2, 2, 1, 1, [0]),
    (3, 2, 1, 1, []),          # hop 1 falls out of the last two but is the best: kept
    (4, 2, 3, 1, [1, 2]),      # hop 3 beat it: the former best goes with the one falling out
    (5, 2, 3, 3, []),          # hop 3 falls out of the last two but is the best: kept
    (6, 3, 5, 3, [3]),
    (6, None, 5, 3, []),       # keep every checkpoint
])
def test_stale_checkpoints_keep_the_last_k_and_the_best(t, keep, best, previous, stale):
    from mop_airflow.training.model_hop import stale_checkpoints

    assert stale_checkpoints(t, keep, best, previous) == stale


def test_a_configuration_keeps_its_last_two_checkpoints_and_its_best(run_setup):
    run, layout, manifest = run_setup
    cid = run.configs[0]["config_id"]
    assert run.store.keep_checkpoints == 2  # the default
    kept = lambda: sorted(int(u.rsplit("/t", 1)[1][:3]) for u in layout.store.glob(f"{layout.run_uri}/checkpoints/{cid}/*"))  # noqa: E731
    out, best = Assignment(cid, -1, None), None
    metrics = {}
    for t in range(4):  # 2 iterations x 2 shards: hops 1 and 3 evaluate
        record, out = run_hop(layout, run, manifest, out, t=t, shard=(t + 1) % 2, cache_dir=run.store.local_cache)
        if record.val_metrics:
            metrics[t] = record.val_metrics["val_accuracy"]
        best = max(metrics, key=lambda k: (metrics[k], -k)) if metrics else None  # the first of equals
        assert (out.best_t, record.best_t) == (best, best)
        assert kept() == sorted({t - 1, t} - {-1} | ({best} if best is not None else set()))
    # every kept checkpoint restores: the best one too, after the last two moved on
    assert layout.store.exists(layout.checkpoint_uri(cid, best))
