"""Tensor and image columns, several inputs, regression targets: validated, sharded and read on the worker."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mop_airflow.data.cache import load_shard
from mop_airflow.data.shard import collect_shards, plan_sharding, scatter_slice, shard_dataset
from mop_airflow.data.validate import DataChecks, validate_source
from mop_airflow.errors import DataValidationError, SpecError
from mop_airflow.config import DataSpec, MopSpec

from .tables import tree


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8).squeeze(-1) if pixels.shape[-1] == 1 else pixels.astype(np.uint8)) \
        .save(buffer, format="PNG")
    return buffer.getvalue()


def image_table(rows: int, *, size=(8, 8, 1), seed=0) -> dict:
    """``pixels`` a fixed-size list tensor, ``photo`` the same pixels as PNG, ``label`` = row % 3, ``row`` the row."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(rows, *size))
    return {
        "row": np.arange(rows, dtype=np.float64),
        "pixels": pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1).astype(np.float32)), int(np.prod(size))),
        "photo": [png(image) for image in images],
        "label": np.arange(rows) % 3,
        "_images": images,
    }


def write(path, columns: dict) -> str:
    pq.write_table(pa.table({k: v for k, v in columns.items() if not k.startswith("_")}), str(path))
    return str(path)


def spec(source, **overrides) -> DataSpec:
    values = {"source": str(source), "label": "label", "classes": (0, 1, 2),
              "features": {"pixels": {"shape": [8, 8, 1]}}}
    return DataSpec(**{**values, **overrides})


def test_tensor_and_image_columns_round_trip_through_shards(tmp_path, store):
    columns = image_table(60)
    source = write(tmp_path / "images.parquet", columns)
    data = spec(source, features={"pixels": {"shape": [8, 8, 1]}, "photo": {"shape": [8, 8, 1], "decode": "image"},
                                  "meta": {"columns": ["row"]}})
    summary = validate_source(data, shards=2, max_batch_size=4)
    assert [i["name"] for i in summary["inputs"]] == ["pixels", "photo", "meta"]
    manifest = shard_dataset(data, store, "dag", 2, 0)
    # images stay encoded; a tensor is packed into fixed-size binary rows of its values (float32 here)
    assert manifest.schema["photo"] == "binary" and manifest.schema["pixels"] == "fixed_size_binary[256]"
    assert [i.get("stored") for i in manifest.inputs] == ["float32", None, None]
    x, y = load_shard(store.local_path(manifest.shards[0].uri), manifest)
    assert set(x) == {"pixels", "photo", "meta"}
    assert x["pixels"].shape == (manifest.shards[0].rows, 8, 8, 1) and x["pixels"].dtype == np.float32
    rows = x["meta"][:, 0].astype(int)
    # decoded PNG == the tensor == the generated pixels, row for row
    assert np.array_equal(x["photo"], x["pixels"]) and np.array_equal(x["pixels"], columns["_images"][rows])
    assert np.array_equal(y, rows % 3)


def test_a_struct_of_bytes_and_path_is_decoded(tmp_path, store):
    columns = image_table(30, size=(4, 5, 3))
    columns["photo"] = [{"bytes": b, "path": f"img/{i}.png"} for i, b in enumerate(columns["photo"])]
    source = write(tmp_path / "export.parquet", columns)
    data = spec(source, features={"photo": {"shape": [4, 5, 3], "decode": "image", "dtype": "uint8"}})
    manifest = shard_dataset(data, store, "dag", 1, 0)
    x, _ = load_shard(store.local_path(manifest.validation.uri), manifest)
    assert x.shape == (manifest.validation.rows, 4, 5, 3) and x.dtype == np.uint8


def test_one_tensor_input_is_the_builder_input_shape(tmp_path, store):
    from mop_airflow.training.builder import data_hparams

    assert data_hparams({"pixels": (8, 8, 1)}, 3, "classification") == {
        "input_shapes": {"pixels": (8, 8, 1)}, "input_shape": (8, 8, 1), "input_dim": 64, "task": "classification",
        "num_classes": 3, "num_outputs": 3}
    assert data_hparams({"a": (4,), "b": (2, 2)}, 0, "regression") == {
        "input_shapes": {"a": (4,), "b": (2, 2)}, "task": "regression", "num_outputs": 1}


def _wrong_length(columns):
    values = [list(range(64))] * 20
    values[4], values[9] = list(range(63)), list(range(70))
    columns["pixels"] = pa.array(values, type=pa.list_(pa.float32()))
    return {}


def _nan_in_tensor(columns):
    flat = np.zeros((20, 64), dtype=np.float32)
    flat[2, 5] = np.nan
    flat[11, 0] = np.inf
    columns["pixels"] = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), 64)
    return {}


def _undecodable(columns):
    columns["photo"][3] = b"\x89PNG but not really"
    return {"features": {"photo": {"shape": [8, 8, 1], "decode": "image"}}}


def _wrong_image_size(columns):
    columns["photo"][6] = png(np.zeros((10, 8, 1)))
    return {"features": {"photo": {"shape": [8, 8, 1], "decode": "image"}}}


def _text_target(columns):
    columns["label"] = np.array([f"{v}.5" for v in range(20)])
    return {"task": "regression", "classes": ()}


def _not_a_list(columns):
    return {"features": {"row": {"shape": [1]}}}


@pytest.mark.parametrize(("mutate", "expected"), [
    (_wrong_length, ["column 'pixels': 2 row(s) hold a tensor of the wrong length (rows 4, 9, counted from 0",
                     "shape [8, 8, 1] needs 64 values"]),
    (_nan_in_tensor, ["column 'pixels': 2 row(s) hold NaN, inf or null values inside the tensor (rows 2, 11,"]),
    (_undecodable, ["column 'photo': 1 image(s) cannot be decoded: not an image, or truncated (row 3, counted from 0)"]),
    (_wrong_image_size, ["column 'photo': 1 image(s) are not 8x8 (height x width) as declared", "row 6,",
                         "sizes such as 10x8"]),
    (_text_target, ["label column 'label': type string is not numeric, but data.task is 'regression'"]),
    (_not_a_list, ["column 'row': type double is not a list of numbers, but input 'row' declares shape [1]"]),
], ids=["tensor-length", "nan-in-tensor", "undecodable-image", "image-size", "text-regression-target", "not-a-list"])
def test_bad_tensors_images_and_targets_name_column_rows_and_rule(tmp_path, store, store_dir, mutate, expected):
    columns = image_table(20)
    overrides = mutate(columns)
    source = write(tmp_path / "bad.parquet", columns)
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(source, **overrides), shards=2, max_batch_size=4)
    (failure,) = caught.value.failures
    for fragment in expected:
        assert fragment in failure, failure
    # the DAG's path: the scatter task finds the same, writes nothing, and the shard task says it
    data = spec(source, **overrides)
    plan = plan_sharding(data, store, "dag", 2, 0)
    checks = lambda: DataChecks.plan(data, plan.listing, plan.held, shards=2, max_batch_size=4)  # noqa: E731
    results = [scatter_slice(plan, data, store, k, checks()) for k in range(len(plan.slices))]
    assert not any(r.wrote for r in results)
    with pytest.raises(DataValidationError) as scattered:
        collect_shards(plan, data, store, results, checks())
    assert scattered.value.failures == caught.value.failures
    assert tree(store_dir) == []


def test_regression_target_is_sharded_as_floats(tmp_path, store):
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    source = write(tmp_path / "diabetes.parquet", {**{f"x{i}": x[:, i] for i in range(x.shape[1])}, "target": y})
    data = DataSpec(source=source, label="target", features="x*", task="regression")
    summary = validate_source(data, shards=2, max_batch_size=16)
    assert summary["task"] == "regression" and summary["classes"] == [] and summary["class_counts"] == {}
    manifest = shard_dataset(data, store, "dag", 2, 0)
    assert (manifest.task, manifest.classes) == ("regression", [])
    xs, ys = load_shard(store.local_path(manifest.shards[0].uri), manifest)
    assert xs.shape == (manifest.shards[0].rows, 10) and ys.dtype == np.float32 and ys.min() >= 25


@pytest.mark.parametrize(("data", "field"), [
    ({"features": {"img": {"shape": [0, 3]}}}, "data.features.img.shape"),
    ({"features": {"img": {"shape": [8, 8], "decode": "image"}}}, "data.features.img.shape"),
    ({"features": {"img": {"shape": [8], "decode": "jpeg"}}}, "data.features.img.decode"),
    ({"features": {"img": {"shape": [8], "colour": 1}}}, "data.features.img.colour"),
    ({"features": {"img": {"columns": "x*", "shape": [2]}}}, "data.features.img"),
    ({"task": "regression", "classes": [0, 1]}, "data.classes"),
    ({"task": "ranking"}, "data.task"),
    ({"shuffle": "blocks"}, "data.shuffle"),
    ({"batch_mb": 0}, "data.batch_mb"),
    ({"source": "/data/train.xlsx"}, "data.source"),
], ids=["zero-dim", "image-not-3d", "unknown-decode", "unknown-key", "columns-and-shape", "regression-classes",
        "unknown-task", "unknown-shuffle", "batch-mb", "wrong-format"])
def test_new_data_fields_are_checked_at_parse_time(data, field):
    values = {"source": "/data/train/", "label": "y", "features": "x*", **data}
    with pytest.raises(SpecError) as caught:
        DataSpec(**values)
    assert caught.value.field == field


def test_a_classification_loss_on_a_regression_target_is_refused():
    space = {"method": "grid", "params": {"model": "m:f", "learning_rate": [0.1]}}
    with pytest.raises(SpecError, match="classification loss but data.task is 'regression'"):
        MopSpec.from_dict({"data": {"source": "/d/", "label": "y", "features": "x*", "task": "regression"},
                           "search": {"space": space, "metric": "val_loss"}})
    MopSpec.from_dict({"data": {"source": "/d/", "label": "y", "features": "x*", "task": "regression"},
                       "search": {"space": {**space, "params": {**space["params"], "loss": "mse",
                                                                "metrics": ["mae"]}}, "metric": "val_mae"}})


def test_a_separate_validation_source_with_another_tensor_type_is_packed_like_the_shards(tmp_path, store):
    rng = np.random.default_rng(3)
    train = rng.integers(0, 256, (40, 64)).astype(np.uint8)
    held = rng.integers(0, 256, (12, 64)).astype(np.float64)
    source = write(tmp_path / "train.parquet", {"pixels": pa.FixedSizeListArray.from_arrays(pa.array(train.reshape(-1)), 64),
                                                "label": np.arange(40) % 3})
    valid = write(tmp_path / "valid.parquet", {"pixels": pa.array(held.tolist(), type=pa.list_(pa.float64())),
                                               "label": np.arange(12) % 3})
    manifest = shard_dataset(spec(source, validation=valid), store, "dag", 2, 0)
    assert manifest.inputs[0]["stored"] == "uint8" and manifest.schema["pixels"] == "fixed_size_binary[64]"
    x, y = load_shard(store.local_path(manifest.validation.uri), manifest)
    assert np.array_equal(x.reshape(12, 64), held) and x.dtype == np.float32 and list(y) == list(np.arange(12) % 3)
    shards = [load_shard(store.local_path(e.uri), manifest)[0].reshape(-1, 64) for e in manifest.shards]
    assert sorted(map(bytes, np.concatenate(shards).astype(np.uint8))) == sorted(map(bytes, train))
