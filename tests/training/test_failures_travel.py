"""A configuration that diverges mid-search is settled along its chain: every slot that waited for one
of its hops learns it will never come, the block ends with every slot done, and every other
configuration trains to the bits it trains to where nothing diverges, at 4 x 1 and 3 x 2 shards x
slots (and 8 x 1 on the real scheduler, tests/test_slots_at_user_shapes.py). With two shards the slot that drops a failed configuration's hops was the only other slot; at
four, the slot two shards on waited for a hop nobody would train, and the block failed or hung."""

from __future__ import annotations

import pytest

from mop_airflow.data.shard import shard_dataset
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.planning.schedule import deal_classes
from mop_airflow.records import Assignment, HopRecord, SlotStatus
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.planning.placement import block_hops
from mop_airflow.slots.driver import run_slot

from . import toys
from .slot_processes import slot_context
from .toys import TOY_MODEL, toy_spec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAN = "tests.training.toys:nan_after_steps"


def _block(tmp_path, toy_data, name, shards, iterations):
    spec = toy_spec(tmp_path, *toy_data, store=name, cache=f"{name}-cache", models=(TOY_MODEL, NAN),
                    batch_sizes=(8, 16), shards=shards, iterations=iterations)
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", shards, run.schedule.seed)
    ids = [c["config_id"] for c in run.configs]
    classes = [[Assignment(cid, -1, None) for cid in members]
               for members in deal_classes(ids, shards=shards, seed=run.schedule.seed)]
    return run, layout, manifest, classes


def _records(run, layout, hops):
    return {(c["config_id"], t): HopRecord.read(layout.store, layout.hop_record_uri(c["config_id"], t))
            for c in run.configs for t in range(hops) if layout.store.exists(layout.hop_record_uri(c["config_id"], t))}


def _slot_process(folder, toy_data, name, shards, slots, iterations, shard, slot):
    """One shard slot's task, in a process of its own (forked as a worker forks its tasks:
    :mod:`.slot_processes`; slots in threads of one process would share Keras's global seed while they build)."""
    run, layout, manifest, classes = _block(folder, toy_data, name, shards, iterations)
    hops = block_hops(classes, shards=shards, slots=slots, start=0, end=shards * iterations)
    run_slot(layout, run, manifest, hops, block="b0", shard=shard, slot=slot, cache_dir=run.store.local_cache,
             wait_seconds=120, yield_seconds=120)


# 8 x 1 runs on the real scheduler only (tests/test_slots_at_user_shapes.py, with these checks): 8 processes
# importing Keras at once here took 238 s of a whole run on 2 cores, the shape's real-scheduler test 95 s
@pytest.mark.parametrize("shards,slots,iterations", [(4, 1, 2), (3, 2, 3)])
def test_a_configuration_diverging_mid_search_never_holds_up_the_block(toy_data, tmp_path, monkeypatch, shards,
                                                                         slots, iterations):
    hops_each = shards * iterations
    # where nothing diverges: the same grid, the same configurations, trained by one process
    monkeypatch.setattr(toys, "NAN_AT_STEP", 10 ** 9)
    run, layout, manifest, classes = _block(tmp_path, toy_data, "clean", shards, iterations)
    hops = block_hops(classes, shards=shards, slots=slots, start=0, end=hops_each)
    run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops, cache_dir=run.store.local_cache)
    clean = _records(run, layout, hops_each)
    assert len(clean) == len(run.configs) * hops_each
    monkeypatch.undo()

    context = slot_context()
    procs = [context.Process(target=_slot_process, args=(tmp_path, toy_data, "diverging", shards, slots, iterations,
                                                          s, k)) for s in range(shards) for k in range(slots)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    alive = [proc for proc in procs if proc.is_alive()]
    for proc in alive:
        proc.kill()
    assert not alive, "a slot still waits"
    assert [proc.exitcode for proc in procs] == [0] * len(procs)
    run, layout, manifest, classes = _block(tmp_path, toy_data, "diverging", shards, iterations)
    assert all(SlotStatus.read(layout.store, layout.slot_status_uri("b0", s, k)).state == "done"
               for s in range(shards) for k in range(slots))

    records = _records(run, layout, hops_each)
    diverging = {c["config_id"] for c in run.configs if c["model"] == NAN}
    assert len(diverging) == 4
    for cid in diverging:
        mine = sorted((t, r) for (c, t), r in records.items() if c == cid)
        trained = [r for _, r in mine if r.status == "ok"]
        first = next(r for _, r in mine if r.status != "ok")
        # it diverged where its 13th step fell (batch 8 or 16), mid-search, and no hop after it trained
        assert first.status == "diverged" and first.dropped_after is None and "loss=nan" in first.error
        assert 0 < first.t < hops_each and len(trained) == first.t
        later = [r for t, r in mine if t > first.t]
        assert later and all(r.dropped_after == first.t and r.error == first.error for r in later)
    # every other configuration: each hop trained once, to the bits of the run where nothing diverges
    for (cid, t), record in clean.items():
        if cid not in diverging:
            assert records[cid, t].status == "ok" and records[cid, t].checkpoint_sha256 == record.checkpoint_sha256
            assert records[cid, t].try_number == 1
    # each hop recorded once: one marker each, over every slot's folder
    marked = [name.split(".", 2)[2] for s in range(shards) for k in range(slots)
              for name in layout.store.names_after(layout.slot_commits_uri("b0", s, k))]
    assert len(marked) == len(set(marked))
