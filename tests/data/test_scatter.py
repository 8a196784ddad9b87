"""Scatter/gather sharding: slices of files validated and scattered separately, gathered per shard."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pyarrow.parquet as pq
import pytest

from mop_airflow.data.cache import cached_shard
from mop_airflow.data.shard import collect_shards, make_slices, plan_sharding, scatter_slice, shard_dataset
from mop_airflow.data.validate import DataChecks
from mop_airflow.errors import DataValidationError, StoreError
from mop_airflow.records import SliceResult
from mop_airflow.store import Store

from .tables import tree
from .test_sources import spec, write_parts

SIZES = [40, 25, 60, 33, 52, 30]  # 240 rows in 6 files


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Great Expectations must not scaffold anything in the working directory


def gathered_ids(store, entry, cache_dir) -> list[int]:
    return [int(v) for v in pq.read_table(cached_shard(store, entry, str(cache_dir)))["x0"].to_pylist()]


def scatter_all(data, store, shards=3, seed=4):
    plan = plan_sharding(data, store, "dag", shards, seed)
    # fresh checks per slice, as each scatter task plans its own
    results = [scatter_slice(plan, data, store, k, DataChecks.plan(data, plan.listing, plan.held, shards=shards,
                                                                    max_batch_size=4))
               for k in range(len(plan.slices))]
    return plan, results


def test_slices_are_runs_of_whole_files_by_size(tmp_path):
    write_parts(tmp_path / "data", SIZES)
    from mop_airflow.data.source import list_source

    listing = list_source(str(tmp_path / "data"))
    one = make_slices(listing, None, slice_mb=1024)
    assert [(s.start, s.end, s.rows) for s in one] == [(0, 6, 240)]
    each = make_slices(listing, None, slice_mb=1e-6)
    assert [(s.start, s.end) for s in each] == [(i, i + 1) for i in range(6)] and [s.rows for s in each] == SIZES
    pairs = make_slices(listing, None, slice_mb=(listing.files[0].bytes + listing.files[1].bytes) / 1e6)
    assert [(s.start, s.end) for s in pairs] == [(0, 2), (2, 4), (4, 6)]
    assert sum(s.bytes for s in pairs) == listing.total_bytes


@pytest.mark.parametrize("shuffle", ["rows", "files"])
def test_many_slices_give_the_same_shards_as_one(tmp_path, shuffle):
    """Rows are placed by their global row number: slicing changes which task writes, not where rows go."""
    write_parts(tmp_path / "data", SIZES)
    one_store, many_store = Store(f"file://{tmp_path}/one"), Store(f"file://{tmp_path}/many")
    one = shard_dataset(spec(tmp_path / "data", shuffle=shuffle), one_store, "dag", 3, 4)
    many = shard_dataset(spec(tmp_path / "data", shuffle=shuffle, slice_mb=1e-6), many_store, "dag", 3, 4)
    assert one.fingerprint == many.fingerprint  # slicing is how, not what
    assert [e.rows for e in one.shards] == [e.rows for e in many.shards]
    for a, b in zip([*one.shards, one.validation], [*many.shards, many.validation]):
        assert not a.parts
        ids = gathered_ids(many_store, b, tmp_path / "cache")
        assert ids == gathered_ids(one_store, a, tmp_path / "cache1")  # same rows, same order
        assert b.rows == len(ids) and b.bytes == sum(p.bytes for p in b.files)
    if shuffle == "rows":
        assert all(len(e.parts) > 1 for e in many.shards)  # each shard samples rows of every slice
    every = sorted(i for e in [*many.shards, many.validation] for i in gathered_ids(many_store, e, tmp_path / "c"))
    assert every == list(range(240))


def test_slices_scattered_by_separate_processes_at_once(tmp_path):
    """Scatter tasks share nothing but the store: run them in parallel processes, collect in a third."""
    write_parts(tmp_path / "data", SIZES)
    store = Store(f"file://{tmp_path}/store")
    data = spec(tmp_path / "data", slice_mb=1e-6)
    plan = plan_sharding(data, store, "dag", 2, 0)
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        dicts = pool.starmap(_scatter_in_child, [(plan.to_dict(), data.source, store.root, k)
                                                 for k in range(len(plan.slices))])
    manifest = collect_shards(plan, data, store, [SliceResult.from_dict(d) for d in dicts])
    reference = shard_dataset(spec(tmp_path / "data"), Store(f"file://{tmp_path}/ref"), "dag", 2, 0)
    for a, b in zip(reference.shards, manifest.shards):
        assert gathered_ids(store, b, tmp_path / "c") == gathered_ids(Store(f"file://{tmp_path}/ref"), a,
                                                                      tmp_path / "c2")


def _scatter_in_child(plan: dict, source: str, root: str, index: int) -> dict:
    from mop_airflow.records import ShardingPlan

    return scatter_slice(ShardingPlan.from_dict(plan), spec(source, slice_mb=1e-6), Store(root), index).to_dict()


def test_failures_of_every_slice_merge_into_one_error_and_nothing_stays(tmp_path):
    paths = write_parts(tmp_path / "data", SIZES)
    for path, column, rows, value in ((paths[1], "x1", [3, 7], np.nan), (paths[4], "x2", [0], np.inf)):
        table = pq.read_table(path).to_pydict()
        for r in rows:
            table[column][r] = value
        import pyarrow as pa

        pq.write_table(pa.table(table), path)
    store = Store(f"file://{tmp_path}/store")
    data = spec(tmp_path / "data", slice_mb=1e-6)
    plan, results = scatter_all(data, store)
    assert [r.wrote for r in results] == [True, False, True, True, False, True]  # bad slices stop writing
    checks = DataChecks.plan(data, plan.listing, plan.held, shards=3, max_batch_size=4)
    with pytest.raises(DataValidationError) as err:
        collect_shards(plan, data, store, results, checks)
    assert len(err.value.failures) == 2
    assert "column 'x1': 2 values are null or NaN (rows part-001.parquet:3, part-001.parquet:7" in str(err.value)
    assert "column 'x2': 1 value is +/-inf (row part-004.parquet:0" in str(err.value)
    assert tree(tmp_path / "store") == []  # the good slices' parts are deleted too


def test_findings_merge_across_slices_by_column_and_rule(tmp_path):
    paths = write_parts(tmp_path / "data", SIZES)
    import pyarrow as pa

    for path in paths[2:5]:
        table = pq.read_table(path).to_pydict()
        table["x1"][1] = np.nan
        pq.write_table(pa.table(table), path)
    store = Store(f"file://{tmp_path}/store")
    data = spec(tmp_path / "data", slice_mb=1e-6)
    plan, results = scatter_all(data, store)
    checks = DataChecks.plan(data, plan.listing, plan.held, shards=3, max_batch_size=4)
    with pytest.raises(DataValidationError) as err:
        collect_shards(plan, data, store, results, checks)
    assert err.value.failures == [
        "column 'x1': 3 values are null or NaN (rows part-002.parquet:1, part-003.parquet:1, part-004.parquet:1, "
        "counted from 0 in each file); remove or impute them"]


def test_valid_slices_collect_into_a_manifest_with_the_classes_found(tmp_path):
    write_parts(tmp_path / "data", SIZES)
    store = Store(f"file://{tmp_path}/store")
    data = spec(tmp_path / "data", slice_mb=1e-6, classes=())
    plan, results = scatter_all(data, store)
    checks = DataChecks.plan(data, plan.listing, plan.held, shards=3, max_batch_size=4)
    manifest = collect_shards(plan, data, store, results, checks)
    assert manifest.classes == [0, 1, 2] and manifest.total_rows == 240 - manifest.validation.rows
    assert store.exists(f"{plan.folder}/manifest.json")
    again = plan_sharding(data, store, "dag", 3, 4)
    assert again.reused
    rerun = [scatter_slice(again, data, store, k, DataChecks.plan(data, again.listing, None, shards=3,
                                                                   max_batch_size=4))
             for k in range(len(again.slices))]
    assert not any(r.wrote for r in rerun)  # validated again, nothing rewritten
    assert collect_shards(again, data, store, rerun).reused


def test_a_corrupt_part_is_named_when_gathered(tmp_path):
    write_parts(tmp_path / "data", SIZES)
    store = Store(f"file://{tmp_path}/store")
    manifest = shard_dataset(spec(tmp_path / "data", slice_mb=1e-6), store, "dag", 2, 0)
    part = manifest.shards[1].parts[2]
    with open(store.local_path(part.uri), "r+b") as handle:
        handle.seek(10)
        handle.write(b"\0\0\0\0")
    with pytest.raises(StoreError, match=f"shard {part.uri} is corrupt"):
        cached_shard(store, manifest.shards[1], str(tmp_path / "cache"))
    assert list((tmp_path / "cache").iterdir()) == []  # no partial gathered file left behind


def test_separate_validation_source_is_its_own_slices(tmp_path):
    write_parts(tmp_path / "data", SIZES[:3])
    write_parts(tmp_path / "valid", [10, 12], start=1000)
    store = Store(f"file://{tmp_path}/store")
    data = spec(tmp_path / "data", validation=str(tmp_path / "valid"), slice_mb=1e-6)
    plan = plan_sharding(data, store, "dag", 2, 0)
    assert [(s.role, s.start, s.end) for s in plan.slices] == [
        ("source", 0, 1), ("source", 1, 2), ("source", 2, 3), ("validation", 0, 1), ("validation", 1, 2)]
    manifest = shard_dataset(data, store, "dag", 2, 0)
    assert sorted(gathered_ids(store, manifest.validation, tmp_path / "c")) == list(range(1000, 1022))
    assert sum(e.rows for e in manifest.shards) == sum(SIZES[:3])


def test_an_s3_prefix_is_scattered_and_gathered(tmp_path, s3_endpoint):
    from tests.conftest import make_bucket

    make_bucket(s3_endpoint, "mop-scatter")
    options = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": s3_endpoint}}
    local = write_parts(tmp_path / "data", SIZES)
    store = Store("s3://mop-scatter/store", options)
    for path in local:
        store.put_file(path, f"s3://mop-scatter/data/{path.rsplit('/', 1)[-1]}")
    data = spec("s3://mop-scatter/data/", slice_mb=1e-6, storage_options=options)
    manifest = shard_dataset(data, store, "dag", 2, 0)
    assert all(p.uri.startswith("s3://mop-scatter/store/dag/shards/") for e in manifest.shards for p in e.files)
    every = sorted(i for e in [*manifest.shards, manifest.validation]
                   for i in gathered_ids(store, e, tmp_path / "cache"))
    assert every == list(range(240))


def test_shards_deleted_after_listing_are_an_error_not_an_empty_manifest(tmp_path):
    write_parts(tmp_path / "data", SIZES)
    store = Store(f"file://{tmp_path}/store")
    data = spec(tmp_path / "data")
    shard_dataset(data, store, "dag", 2, 0)
    plan = plan_sharding(data, store, "dag", 2, 0)
    assert plan.reused
    results = [scatter_slice(plan, data, store, k) for k in range(len(plan.slices))]
    store.delete_tree(plan.folder)
    with pytest.raises(StoreError, match="were complete when the run listed its data but are not now"):
        collect_shards(plan, data, store, results)


def test_a_reused_sharding_takes_the_same_checks_findings_without_reading_the_files(tmp_path, monkeypatch):
    import mop_airflow.data.shard as shard_module

    write_parts(tmp_path / "data", SIZES)
    store = Store(f"file://{tmp_path}/store")
    data = spec(tmp_path / "data", slice_mb=1e-6, classes=())
    plan, results = scatter_all(data, store)
    first = DataChecks.plan(data, plan.listing, plan.held, shards=3, max_batch_size=4)
    collect_shards(plan, data, store, results, first)

    again = plan_sharding(data, store, "dag", 3, 4)
    reads = []
    real = shard_module.iter_batches
    monkeypatch.setattr(shard_module, "iter_batches", lambda *a, **k: reads.append(1) or real(*a, **k))
    rerun = [scatter_slice(again, data, store, k, DataChecks.plan(data, again.listing, None, shards=3,
                                                                   max_batch_size=4))
             for k in range(len(again.slices))]
    assert reads == [] and not any(r.wrote for r in rerun)
    assert [r.findings for r in rerun] == [r.findings for r in results]
    checks = DataChecks.plan(data, again.listing, None, shards=3, max_batch_size=4)
    assert collect_shards(again, data, store, rerun, checks).reused
    assert checks.conclude() == first.conclude()  # the same summary, classes found included

    # other checks (a larger batch needs more rows per shard) read the files again
    other = [scatter_slice(again, data, store, k, DataChecks.plan(data, again.listing, None, shards=3,
                                                                   max_batch_size=8))
             for k in range(len(again.slices))]
    assert len(reads) == len(again.slices) and not any(r.wrote for r in other)


def test_a_shard_of_many_parts_is_cached_decoded_as_its_gathered_file_reads(tmp_path):
    """Decoding the parts straight into arrays gives the gathered file's rows, targets and row groups,
    so a hop's batches do not depend on which cache it reads."""
    from mop_airflow.data.cache import load_shard
    from mop_airflow.data.decoded import DecodedShard, is_decoded
    from mop_airflow.training.stream import stream_batches

    write_parts(tmp_path / "data", SIZES)
    store = Store(f"file://{tmp_path}/store")
    manifest = shard_dataset(spec(tmp_path / "data", slice_mb=1e-6), store, "dag", 3, 4)
    for entry in [*manifest.shards, manifest.validation]:
        parquet = cached_shard(store, entry, str(tmp_path / "parquet"))
        store.bytes_read = 0
        decoded = cached_shard(store, entry, str(tmp_path / "decoded"), manifest=manifest)
        assert is_decoded(decoded) and store.bytes_read == entry.bytes  # each part read once
        x, y = load_shard(parquet, manifest)
        xd, yd = load_shard(decoded, manifest)
        np.testing.assert_array_equal(xd, x)
        np.testing.assert_array_equal(yd, y)
        assert xd.dtype == x.dtype == np.float32 and yd.dtype == y.dtype
        file = pq.ParquetFile(parquet)
        assert DecodedShard.open(decoded).group_rows == [file.metadata.row_group(i).num_rows
                                                         for i in range(file.num_row_groups)]
        seeds = dict(seed=3, iteration=1, shard=entry.index or 0, epoch=0)
        from_parquet = list(stream_batches(parquet, lambda t: load_shard_table(t, manifest), batch_size=7,
                                           window_rows=20, **seeds))
        from_arrays = list(stream_batches(decoded, None, batch_size=7, window_rows=20, **seeds))
        assert len(from_parquet) == len(from_arrays) > 1
        for (xa, ya), (xb, yb) in zip(from_parquet, from_arrays):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
        store.bytes_read = 0
        assert cached_shard(store, entry, str(tmp_path / "decoded"), manifest=manifest) == decoded
        assert store.bytes_read == 0  # a hit reads nothing
    assert sorted(p.suffix for p in (tmp_path / "decoded").iterdir()) == [".arrays"] * 4  # no Parquet, no temp


def test_a_corrupt_part_leaves_no_decoded_shard(tmp_path):
    write_parts(tmp_path / "data", SIZES)
    store = Store(f"file://{tmp_path}/store")
    manifest = shard_dataset(spec(tmp_path / "data", slice_mb=1e-6), store, "dag", 3, 4)
    entry = manifest.shards[1]
    with open(store.local_path(entry.parts[1].uri), "r+b") as handle:
        handle.seek(20)
        handle.write(b"\xff\xff")
    with pytest.raises(StoreError, match=r"is corrupt: its sha256 is [0-9a-f]{64}, the manifest says"):
        cached_shard(store, entry, str(tmp_path / "cache"), manifest=manifest)
    assert tree(tmp_path / "cache") == []


def load_shard_table(table, manifest):
    from mop_airflow.data.cache import load_table

    return load_table(table, manifest)
