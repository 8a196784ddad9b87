"""A retried slot never trains a committed hop again nor writes its record again, even when the hop's
checkpoint was cleaned up since (``store.keep_checkpoints``) and the hop that took it on was trained by
a slot whose markers the retry does not list (the next shard's). A lost Celery worker's retry took such
a hop for "not committed", trained it again from its initial weights, overwrote its record, and then
wanted a checkpoint the store no longer had."""

from __future__ import annotations

import threading

import pytest

from mop_airflow.data.shard import shard_dataset
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.planning.schedule import deal_classes
from mop_airflow.records import Assignment, HopRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.training.model_hop import Where
from mop_airflow.slots.driver import block_hops, run_slot

from .toys import toy_spec

pytestmark = pytest.mark.integration

SHARDS, ITERATIONS = 3, 2


@pytest.mark.parametrize("try_number", [1, 2])
def test_a_retried_slot_skips_hops_whose_checkpoints_were_cleaned_up_since(toy_data, tmp_path, try_number):
    spec = toy_spec(tmp_path, *toy_data, shards=SHARDS, iterations=ITERATIONS)
    assert spec["store"].get("keep_checkpoints", 2) == 2  # hop t deletes hop t-2's checkpoint
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", SHARDS, run.schedule.seed)
    ids = [c["config_id"] for c in run.configs]
    classes = [[Assignment(cid, -1, None) for cid in members]
               for members in deal_classes(ids, shards=SHARDS, seed=run.schedule.seed)]
    hops = block_hops(classes, shards=SHARDS, slots=1, start=0, end=SHARDS * ITERATIONS)
    errors = []

    def slot(shard):
        try:
            run_slot(layout, run, manifest, hops, block="b0", shard=shard, slot=0, cache_dir=run.store.local_cache,
                     wait_seconds=120)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=slot, args=(s,)) for s in range(SHARDS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert errors == []
    before = {(h.config_id, h.hop): HopRecord.read(layout.store, layout.hop_record_uri(h.config_id, h.hop))
              for h in hops}
    mine = [h for h in hops if h.shard == 0]
    cleaned = [h for h in mine if not layout.store.exists(before[h.config_id, h.hop].checkpoint)]
    assert cleaned, "no checkpoint of shard 0's hops was cleaned up: the test proves nothing"

    # shard 0's slot runs again (a retry after its worker was lost, or the same try run again)
    again = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, cache_dir=run.store.local_cache,
                     wait_seconds=10, where=Where(task_id="train_shard_0", try_number=try_number))
    assert again.trained == [] and again.failed == [] and again.untrained == {}
    assert sorted(again.committed) == sorted(h.label for h in mine)
    for key, record in before.items():
        assert HopRecord.read(layout.store, layout.hop_record_uri(*key)) == record  # not one written again
