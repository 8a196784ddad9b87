"""The worker-side shard cache and the shard reader."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pyarrow as pa
import pytest

from mop_airflow.data.cache import cached_shard, load_shard, load_xy
from mop_airflow.data.inputs import SCALAR_INPUT, InputSpec
from mop_airflow.data.shard import shard_dataset
from mop_airflow.errors import DataValidationError, StoreError
from mop_airflow.spec import DataSpec
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
