"""MNIST-1D written offline to Parquet, once per (num_samples, seed)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq

from mop_airflow.data.validate import validate_source
from mop_airflow.examples.mnist1d_data import write_mnist1d
from mop_airflow.config import DataSpec


def test_writes_train_and_test_splits(tmp_path):
    out = write_mnist1d(str(tmp_path), num_samples=200, seed=3)
    assert out["train"] == str(tmp_path / "mnist1d_train.parquet")
    assert out["test"] == str(tmp_path / "mnist1d_test.parquet")
    assert out["rows"] == {"train": 160, "test": 40}  # the package's 80/20 split
    train = pq.read_table(out["train"])
    assert train.column_names == [f"x{i}" for i in range(40)] + ["label"]
    assert {str(train.schema.field(f"x{i}").type) for i in range(40)} == {"float"}
    assert str(train.schema.field("label").type) == "int64"
    assert set(train["label"].to_pylist()) <= set(range(10))
    assert pq.read_metadata(out["test"]).num_rows == 40


def test_is_idempotent_and_regenerates_for_other_parameters(tmp_path):
    first = write_mnist1d(str(tmp_path), num_samples=200, seed=3)
    mtime = os.stat(first["train"]).st_mtime_ns
    assert write_mnist1d(str(tmp_path), num_samples=200, seed=3) == first
    assert os.stat(first["train"]).st_mtime_ns == mtime

    other = write_mnist1d(str(tmp_path), num_samples=300, seed=3)
    assert other["rows"] == {"train": 240, "test": 60}
    assert pq.read_metadata(other["train"]).num_rows == 240


def test_leaves_the_global_random_state_alone(tmp_path):
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    write_mnist1d(str(tmp_path), num_samples=100, seed=1)
    assert np.random.rand() == expected


def test_passes_validation(tmp_path):
    out = write_mnist1d(str(tmp_path), num_samples=200, seed=3)
    data = DataSpec(source=out["train"], label="label", features="x*", classes=tuple(range(10)),
                    validation=out["test"])
    summary = validate_source(data, shards=4, max_batch_size=32)
    assert (summary["rows"], summary["validation_rows"], len(summary["features"])) == (160, 40, 40)
    assert sum(summary["class_counts"].values()) == 160
