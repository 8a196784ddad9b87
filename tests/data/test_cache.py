"""The worker-side shard cache and the shard reader."""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pyarrow as pa
import pytest

from mop_airflow.data.cache import cached_shard, load_shard, load_xy
from mop_airflow.data.inputs import SCALAR_INPUT, InputSpec
from mop_airflow.data.shard import shard_dataset
from mop_airflow.errors import DataValidationError, StoreError
from mop_airflow.config import DataSpec
from mop_airflow.store import Store

from .tables import make_columns, tree, write_parquet


def scalar_inputs(columns: list[str]) -> list[InputSpec]:
    return [InputSpec(SCALAR_INPUT, "columns", tuple(columns), (len(columns),))]


@pytest.fixture
def manifest(tmp_path, store):
    source = write_parquet(tmp_path / "train.parquet", make_columns(60))
    data = DataSpec(source=source, label="label", features="x*", classes=(0, 1, 2))
    return shard_dataset(data, store, "dag", 2, 0)


def test_first_call_copies_second_call_reads_nothing(tmp_path, store, manifest):
    entry = manifest.shards[1]
    cache_dir = str(tmp_path / "cache")
    worker = Store(store.root)  # a worker process has its own store and counters

    path = cached_shard(worker, entry, cache_dir)
    assert path == os.path.join(cache_dir, f"{entry.sha256}.parquet")
    assert worker.bytes_read == entry.bytes == os.path.getsize(path)

    assert cached_shard(worker, entry, cache_dir) == path
    assert worker.bytes_read == entry.bytes
    assert tree(cache_dir) == [os.path.basename(path)]  # no temp files left behind


def test_a_truncated_cache_file_is_copied_again(tmp_path, store, manifest):
    entry = manifest.validation
    path = cached_shard(store, entry, str(tmp_path / "cache"))
    with open(path, "r+b") as handle:
        handle.truncate(10)
    store.bytes_read = 0
    assert cached_shard(store, entry, str(tmp_path / "cache")) == path
    assert store.bytes_read == entry.bytes == os.path.getsize(path)


def test_checksum_mismatch_raises_and_caches_nothing(tmp_path, store, manifest):
    entry = dataclasses.replace(manifest.shards[0], sha256="0" * 64)
    with pytest.raises(StoreError, match=r"is corrupt: its sha256 is [0-9a-f]{64}, the manifest says 0{64}"):
        cached_shard(store, entry, str(tmp_path / "cache"))
    assert tree(tmp_path / "cache") == []


def test_load_xy_maps_labels_to_class_indices(tmp_path):
    path = write_parquet(tmp_path / "shard.parquet", {
        "a": np.array([1, 2, 3], dtype=np.int64),
        "b": np.array([0.5, 1.5, 2.5], dtype=np.float64),
        "label": np.array([7, 3, 7]),
    })
    x, y = load_xy(path, scalar_inputs(["b", "a"]), "label", [3, 7])
    assert x.dtype == np.float32 and x.shape == (3, 2)
    np.testing.assert_array_equal(x, [[0.5, 1], [1.5, 2], [2.5, 3]])
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [1, 0, 1])


def test_load_xy_string_labels_and_unknown_labels(tmp_path):
    path = write_parquet(tmp_path / "shard.parquet", {"x": pa.array([0.0, 1.0, 2.0], pa.float32()),
                                                      "label": ["cat", "dog", "cow"]})
    _, y = load_xy(path, scalar_inputs(["x"]), "label", ["dog", "cat", "cow"])
    np.testing.assert_array_equal(y, [1, 0, 2])
    with pytest.raises(DataValidationError, match=r"1 values are not in classes \['dog', 'cat'\] \(e.g. \['cow'\]\)"):
        load_xy(path, scalar_inputs(["x"]), "label", ["dog", "cat"])


def test_load_xy_from_a_cached_shard(tmp_path, store, manifest):
    path = cached_shard(store, manifest.shards[0], str(tmp_path / "cache"))
    x, y = load_shard(path, manifest)
    assert x.shape == (manifest.shards[0].rows, 3)
    # make_columns labels row i with class i % 3, and x0 holds i
    np.testing.assert_array_equal(y, x[:, 0].astype(np.int64) % 3)


def _cache_file(folder, name, size, used):
    path = folder / f"{name}.parquet"
    path.write_bytes(b"\0" * size)
    os.utime(path, (used, used))
    return path


def test_the_cache_evicts_least_recently_used_shards_over_its_bound_but_never_one_in_use(tmp_path):
    from mop_airflow.data.cache import IN_USE_SECONDS, cache_bytes, evict

    now = 1_000_000.0
    old = now - IN_USE_SECONDS - 100
    a = _cache_file(tmp_path, "a", 400, old - 30)  # least recently used
    b = _cache_file(tmp_path, "b", 400, old - 20)
    c = _cache_file(tmp_path, "c", 400, old - 10)
    d = _cache_file(tmp_path, "d", 400, now - 5)  # in use right now
    (tmp_path / "e.parquet.part-123").write_bytes(b"\0" * 999)  # a copy in flight: not counted, never deleted
    assert cache_bytes(str(tmp_path)) == 1600
    assert evict(str(tmp_path), 900, now=now) == [str(a), str(b)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.parquet", "d.parquet", "e.parquet.part-123"]
    # over the bound with only files in use left: they stay
    _cache_file(tmp_path, "f", 400, now - 1)
    assert evict(str(tmp_path), 100, now=now) == [str(c)]
    assert sorted(p.name for p in tmp_path.glob("*.parquet")) == ["d.parquet", "f.parquet"]
    assert d.exists()


def test_a_new_shard_copied_into_a_full_cache_evicts_the_stale_one(tmp_path, store, manifest):
    from mop_airflow.data.cache import IN_USE_SECONDS

    cache = tmp_path / "cache"
    first = cached_shard(store, manifest.shards[0], str(cache))
    stale = time.time() - IN_USE_SECONDS - 60
    os.utime(first, (stale, stale))  # last used long ago, by a run that is over
    second = cached_shard(store, manifest.shards[1], str(cache), max_bytes=manifest.shards[1].bytes + 10)
    assert not os.path.exists(first) and os.path.exists(second)
    # a hit marks the file used: it is now the most recent
    assert cached_shard(store, manifest.shards[1], str(cache), max_bytes=1) == second
    assert os.path.getmtime(second) > stale + IN_USE_SECONDS


def test_only_numeric_rows_about_their_stored_size_are_cached_decoded():
    from mop_airflow.data.decoded import decodes
    from mop_airflow.records import ShardEntry

    floats = [InputSpec("x", "columns", ("a", "b"), (2,))]
    entry = ShardEntry(uri="s", rows=1000, sha256="0" * 64, bytes=12_000)  # 12 stored bytes a row
    assert decodes(floats, entry)  # 2 x float32 + the target: 12 bytes a row
    assert not decodes([InputSpec("img", "image", ("img",), (32, 32, 3))], entry)  # JPEG bytes decode to far more
    small_ints = [InputSpec("t", "tensor", ("t",), (64,), stored="uint8")]  # 64 bytes stored, 256 decoded
    assert not decodes(small_ints, ShardEntry(uri="s", rows=1000, sha256="0" * 64, bytes=70_000))
    assert not decodes(floats, ShardEntry(uri="s", rows=0, sha256="0" * 64, bytes=100))


def test_the_cache_evicts_a_decoded_shard_by_its_arrays_bytes(tmp_path, store, manifest):
    from mop_airflow.data.cache import IN_USE_SECONDS, cache_bytes, evict
    from mop_airflow.data.decoded import folder_bytes

    cache = str(tmp_path / "cache")
    decoded = cached_shard(store, manifest.shards[0], cache, manifest=manifest)
    assert cache_bytes(cache) == folder_bytes(decoded) > manifest.shards[0].rows * 16
    stale = time.time() - IN_USE_SECONDS - 60
    os.utime(decoded, (stale, stale))
    assert evict(cache, 0) == [decoded] and not os.path.exists(decoded)


def _cache_in_a_child(root, entry, cache, manifest, out):
    worker = Store(root)
    out.put((cached_shard(worker, entry, cache, manifest=manifest), worker.bytes_read))


def test_a_second_process_waits_for_the_one_caching_a_shard_and_reads_nothing(tmp_path, store, manifest):
    """Shard pools of one machine stage at once and all cache the validation set: one copies it."""
    import multiprocessing

    from mop_airflow.data.cache import _decode_verified, _one_maker, _recipe
    from mop_airflow.data.decoded import decoded_path

    entry, cache = manifest.validation, str(tmp_path / "cache")
    path = decoded_path(cache, entry, _recipe(manifest))
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    with _one_maker(path):
        child = context.Process(target=_cache_in_a_child, args=(store.root, entry, cache, manifest, out))
        child.start()
        time.sleep(1.0)
        assert child.is_alive() and out.empty()  # waiting for this process
        _decode_verified(store, entry, manifest, path)
    made, read = out.get(timeout=30)
    child.join(timeout=30)
    assert child.exitcode == 0 and made == path and read == 0
    assert tree(cache) == [os.path.relpath(p, cache) for p in sorted(
        os.path.join(path, name) for name in os.listdir(path))]  # no lock or temp file left
