"""A shard slot's model cache helps: the configurations that share a model key are dealt to one slot,
the cache is bounded by bytes, and a device out of memory empties it and trains the hop again
before any configuration is blamed."""

from __future__ import annotations

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.records import Assignment, HopRecord
from mop_airflow.training import session as session_module
from mop_airflow.training.session import TaskSession, cache_bytes, model_bytes, out_of_memory
from mop_airflow.planning.placement import block_hops, deal_slots
from mop_airflow.slots.driver import run_slot

from .test_shard_loop import _hops, _setup
from .toys import TOY_MODEL


def test_configurations_that_share_a_model_key_go_to_one_slot_and_the_slots_stay_balanced():
    keys = {"a1": "A", "b1": "B", "a2": "A", "b2": "B", "a3": "A", "c1": "C", "b3": "B", "c2": "C"}
    classes = [["a1", "b1", "a2", "b2"], ["a3", "c1", "b3", "c2"]]
    dealt = deal_slots(classes, 2, keys.__getitem__)
    assert dealt == {"a1": 0, "a2": 0, "b1": 1, "b2": 1, "a3": 0, "b3": 1, "c1": 0, "c2": 1}
    # each class puts as many configurations on each slot as i mod slots did
    for members in classes:
        assert sorted(dealt[c] for c in members) == [0, 0, 1, 1]
    assert deal_slots(classes, 2, keys.__getitem__) == dealt  # deterministic
    # one key only: balanced all the same
    assert sorted(deal_slots([["x", "y", "z"]], 2, lambda c: "K").values()) == [0, 0, 1]
    # block_hops deals so, and without a key as before (configuration i on slot i mod slots)
    starts = [[Assignment(c, -1, None) for c in members] for members in classes]
    hops = block_hops(starts, shards=2, slots=2, start=0, end=2, key=keys.__getitem__)
    assert {h.config_id: h.slot for h in hops} == dealt
    plain = block_hops(starts, shards=2, slots=2, start=0, end=2)
    assert [h.slot for h in plain if h.step == 0] == [0, 1, 0, 1, 0, 1, 0, 1]


def test_the_cache_is_bounded_by_bytes(toy_data, tmp_path, monkeypatch):
    run, layout, manifest = _setup(tmp_path, toy_data, "store")
    configs = [dict(c, hparams={**c.get("hparams", {}), "units": units}) for c, units in
               zip(run.configs[:3], (4, 5, 6))]  # three model keys
    sizes = [model_bytes(TaskSession(run, manifest, "x").model(c, seed=1, fresh=True)[0]) for c in configs]
    session = TaskSession(run, manifest, run.store.local_cache, max_models=32, max_bytes=sizes[1] + sizes[2])
    for config in configs:
        session.model(config, seed=1, fresh=True)
    assert session.held == 2  # the oldest let go: the three did not fit
    _, reused = session.model(configs[0], seed=1, fresh=False)
    assert not reused


def test_the_default_cache_bound(monkeypatch):
    assert cache_bytes(environ={"MOP_MODEL_CACHE_BYTES": "1000"}) == 1000
    with pytest.raises(SpecError, match="MOP_MODEL_CACHE_BYTES='1G': must be a number of bytes"):
        cache_bytes(environ={"MOP_MODEL_CACHE_BYTES": "1G"})
    monkeypatch.setattr(session_module, "_device_memory", lambda: None)
    host = cache_bytes(environ={})
    assert 0 < host <= 1 << 30 and cache_bytes(2, environ={}) == host // 2
    monkeypatch.setattr(session_module, "_device_memory", lambda: 80 << 30)
    assert cache_bytes(4, environ={}) == (80 << 30) // 16  # a quarter of the device, shared by 4 slots


class ResourceExhaustedError(Exception):
    """Named as TensorFlow's: what a device out of memory raises."""


def test_a_device_out_of_memory_empties_the_cache_and_trains_the_hop_again(toy_data, tmp_path, monkeypatch):
    from mop_airflow.slots import train_actions  # where the shard loop calls train_hop

    run, layout, manifest = _setup(tmp_path, toy_data, "store", models=(TOY_MODEL, "tests.training.toys:remember_hparams"))
    hops = _hops(run)
    session = TaskSession(run, manifest, run.store.local_cache, max_models=32)
    train_hop, raised = train_actions.train_hop, []

    def tight_device(*args, session, **kwargs):
        if session.held >= 2 and not raised:  # the models kept fill the device once
            raised.append(session.held)
            raise ResourceExhaustedError("OOM when allocating tensor")
        return train_hop(*args, session=session, **kwargs)

    monkeypatch.setattr(train_actions, "train_hop", tight_device)
    result = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops,
                      cache_dir=run.store.local_cache, session=session)
    assert raised == [2] and session.emptied == 1
    assert not result.failed and len(result.trained) == len(hops)  # nobody blamed

    # a configuration that runs out of memory with nothing kept is blamed, once
    run2, layout2, manifest2 = _setup(tmp_path, toy_data, "store2")
    calls = []

    def always(*args, session, **kwargs):
        calls.append(session.held)
        raise MemoryError("out of memory")

    monkeypatch.setattr(train_actions, "train_hop", always)
    hops2 = _hops(run2)
    result = run_slot(layout2, run2, manifest2, hops2[:1], block="b0", shard=0, slot=0, mine=hops2[:1],
                      cache_dir=run2.store.local_cache, session=TaskSession(run2, manifest2, "x", max_models=32))
    assert calls == [0] and [r.config_id for r in result.failed] == [hops2[0].config_id]
    record = HopRecord.read(layout2.store, layout2.hop_record_uri(hops2[0].config_id, 0))
    assert record.status == "failed" and record.error.startswith("out of memory")


def test_what_counts_as_out_of_memory():
    assert out_of_memory(MemoryError()) and out_of_memory(ResourceExhaustedError("x"))
    assert out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate"))
    assert not out_of_memory(ValueError("units=200 is too wide"))
