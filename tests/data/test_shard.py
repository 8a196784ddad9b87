"""Sharding: disjoint, balanced, checksummed, reused for the same input and seed."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import uuid

import numpy as np
import pyarrow.parquet as pq
import pytest

from mop_airflow.data.shard import shard_dataset
from mop_airflow.config import DataSpec
from mop_airflow.store import Store

from .tables import make_columns, tree, write_parquet


def spec(source, **overrides) -> DataSpec:
    values = {"source": str(source), "label": "label", "features": "x*", "classes": (0, 1, 2)}
    return DataSpec(**{**values, **overrides})


def row_ids(store: Store, entry) -> list[int]:
    table = pq.read_table(store.local_path(entry.uri))
    return [int(v) for v in table["x0"].to_pylist()]


@pytest.fixture
def source(tmp_path):
    return write_parquet(tmp_path / "train.parquet", make_columns(103, features=4))


def test_shards_are_balanced_disjoint_and_cover_every_row(store, store_dir, source):
    manifest = shard_dataset(spec(source, validation=0.2), store, "mnist_dag", 4, 7)
    sizes = [entry.rows for entry in manifest.shards]
    assert sizes == [21, 21, 20, 20]  # 103 - round(20.6) = 82 rows over 4 shards
    assert manifest.total_rows == sum(sizes) == 82
    assert manifest.validation.rows == 21

    ids = [row_ids(store, entry) for entry in manifest.shards]
    held_out = row_ids(store, manifest.validation)
    every = [i for shard in ids for i in shard] + held_out
    assert sorted(every) == list(range(103))  # each row exactly once: no shard/shard or shard/validation overlap
    # each shard is a random sample of rows from the whole file, not a cut of it (rows keep file order)
    assert all(shard == sorted(shard) and shard[-1] - shard[0] > 60 for shard in ids)

    location = f"mnist_dag/shards/{manifest.fingerprint}"
    assert len(manifest.fingerprint) == 16
    # one slice: its part s is shard s, and part 4 the validation set
    assert tree(store_dir) == [f"{location}/{name}" for name in (
        "manifest.json", *[f"parts/slice-00000/part-{s:05d}.parquet" for s in range(5)])]
    assert store.read_json(store.uri(location, "manifest.json")) == manifest.to_dict()


def test_manifest_describes_the_files(store, source):
    manifest = shard_dataset(spec(source), store, "dag", 3, 0)
    assert manifest.features == ["x0", "x1", "x2", "x3"]
    assert (manifest.label, manifest.classes, manifest.seed) == ("label", [0, 1, 2], 0)
    assert manifest.schema == {"x0": "float", "x1": "float", "x2": "float", "x3": "float", "label": "int64"}
    assert manifest.reused is False and manifest.source == source
    for entry in [*manifest.shards, manifest.validation]:
        payload = open(store.local_path(entry.uri), "rb").read()
        assert entry.sha256 == hashlib.sha256(payload).hexdigest()
        assert entry.bytes == len(payload)
        assert pq.read_metadata(store.local_path(entry.uri)).num_rows == entry.rows
    assert [entry.index for entry in manifest.shards] == [0, 1, 2]


def test_same_input_and_seed_reuses_the_shards_without_rewriting(store, store_dir, source):
    first = shard_dataset(spec(source), store, "dag", 4, 1)
    mtimes = {path: os.stat(store_dir / path).st_mtime_ns for path in tree(store_dir)}
    written = store.bytes_written

    again = shard_dataset(spec(source), Store(store.root), "dag", 4, 1)
    assert again.reused is True
    assert dataclasses.replace(again, reused=False) == first
    assert {path: os.stat(store_dir / path).st_mtime_ns for path in tree(store_dir)} == mtimes
    assert store.bytes_written == written


def test_seed_shards_and_split_change_the_fingerprint(store, source):
    base = shard_dataset(spec(source), store, "dag", 4, 1).fingerprint
    assert shard_dataset(spec(source), store, "dag", 4, 2).fingerprint != base
    assert shard_dataset(spec(source), store, "dag", 3, 1).fingerprint != base
    assert shard_dataset(spec(source, validation=0.3), store, "dag", 4, 1).fingerprint != base
    assert shard_dataset(spec(source, features=("x0", "x1")), store, "dag", 4, 1).fingerprint != base


def test_same_seed_gives_identical_shards_in_a_new_store(tmp_path, source):
    one = shard_dataset(spec(source), Store(f"file://{tmp_path}/a"), "dag", 4, 5)
    two = shard_dataset(spec(source), Store(f"file://{tmp_path}/b"), "dag", 4, 5)
    assert [e.sha256 for e in one.shards] == [e.sha256 for e in two.shards]


def test_a_missing_shard_means_resharding(store, source):
    first = shard_dataset(spec(source), store, "dag", 4, 1)
    os.unlink(store.local_path(first.shards[2].uri))
    again = shard_dataset(spec(source), store, "dag", 4, 1)
    assert again.reused is False
    assert os.path.exists(store.local_path(first.shards[2].uri))


def test_a_crash_before_the_manifest_leaves_no_manifest(store, store_dir, source, monkeypatch):
    real_open_write = store.open_write

    @contextlib.contextmanager
    def fail_on_validation(uri):
        with real_open_write(uri) as handle:
            if uri.endswith("part-00002.parquet"):  # the validation part of a 2-shard run
                handle.write = lambda data: (_ for _ in ()).throw(OSError("disk full"))
            yield handle

    monkeypatch.setattr(store, "open_write", fail_on_validation)
    with pytest.raises(OSError, match="disk full"):
        shard_dataset(spec(source), store, "dag", 2, 0)
    assert tree(store_dir) == []  # no manifest, and no half-written shard either


def test_separate_validation_file(tmp_path, store):
    source = write_parquet(tmp_path / "train.parquet", make_columns(40))
    columns = make_columns(9)
    columns["label"] = columns["label"].astype(np.int32)  # cast to the shards' label type
    valid = write_parquet(tmp_path / "valid.parquet", columns)
    manifest = shard_dataset(spec(source, validation=valid), store, "dag", 3, 0)
    assert [e.rows for e in manifest.shards] == [14, 13, 13]  # nothing held out of the source
    assert sorted(i for e in manifest.shards for i in row_ids(store, e)) == list(range(40))
    assert manifest.validation.rows == 9
    validation = pq.read_table(store.local_path(manifest.validation.uri))
    assert str(validation.schema.field("label").type) == "int64"


def test_csv_source(tmp_path, store):
    source = tmp_path / "train.csv"
    source.write_text("x0,x1,label\n" + "".join(f"{i},{i * 0.5},{i % 3}\n" for i in range(30)))
    manifest = shard_dataset(spec(source), store, "dag", 2, 0)
    assert [e.rows for e in manifest.shards] == [12, 12]  # 30 - 6 held out
    assert manifest.schema == {"x0": "float", "x1": "float", "label": "int64"}


def test_memory_store(source):
    store = Store("memory://mop-tests")
    dag_id = f"dag_{uuid.uuid4().hex}"  # the memory filesystem is shared by the whole process
    manifest = shard_dataset(spec(source), store, dag_id, 2, 0)
    assert all(store.exists(e.uri) for e in manifest.shards)
    assert shard_dataset(spec(source), store, dag_id, 2, 0).reused is True
