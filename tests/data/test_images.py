"""Folders of image files as a source: class folders and labels files, listed, validated and sharded."""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mop_airflow.data.cache import cached_shard, load_shard
from mop_airflow.data.shard import collect_shards, plan_sharding, scatter_slice, shard_dataset
from mop_airflow.data.source import iter_batches, list_source
from mop_airflow.data.validate import DataChecks, validate_source
from mop_airflow.errors import DataValidationError, SpecError
from mop_airflow.config import DataSpec
from tests.conftest import make_bucket

from .tables import tree

CLASSES = ("cat", "dog", "eel")


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Great Expectations must not scaffold anything in the working directory


def image_bytes(index: int, *, size=(4, 5), mode="RGB", fmt="PNG") -> bytes:
    """An image whose first pixel's red (or grey) value is ``index``, so a test can tell which file it was."""
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = np.full((*size, channels), 200, dtype=np.uint8)
    pixels[0, 0, 0] = index
    buffer = io.BytesIO()
    Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode).save(buffer, format=fmt)
    return buffer.getvalue()


def class_folders(root, per_class=8, *, classes=CLASSES, suffix="png", fmt="PNG", **image) -> dict[str, int]:
    """``root/<class>/<i>.<suffix>``; returns each file's relative path -> its index (its first pixel)."""
    index, written = 0, {}
    for name in classes:
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            rel = f"{name}/{i:03d}.{suffix}"
            with open(os.path.join(root, rel), "wb") as handle:
                handle.write(image_bytes(index, fmt=fmt, **image))
            written[rel] = index
            index += 1
    return written


def images_spec(source, shape=(4, 5, 3), **overrides) -> DataSpec:
    values = {"source": str(source), "label": "label", "validation": 0.25,
              "features": {"image": {"shape": list(shape), "decode": "image"}}}
    return DataSpec(**{**values, **overrides})


def first_pixels(store, entry, manifest, cache) -> list[int]:
    x, _ = load_shard(cached_shard(store, entry, str(cache)), manifest)
    return [int(v) for v in x[:, 0, 0, 0]]


# -- class folders -------------------------------------------------------------------------------
def test_class_folders_are_listed_without_opening_a_file(tmp_path):
    written = class_folders(tmp_path / "train")
    (tmp_path / "train" / "cat" / "000.png").write_bytes(b"not an image at all")  # listing must not notice
    (tmp_path / "train" / "notes.txt").write_text("not an image: ignored, as Keras does")
    listing = list_source(str(tmp_path / "train"))
    assert listing.format == "images" and listing.total_rows == 24 == len(written)
    assert [f.uri.rsplit("train/", 1)[1] for f in listing.files] == sorted(written)
    assert all(f.rows == 1 and f.bytes > 0 and f.version for f in listing.files)
    assert listing.columns == ["image", "path", "label"]
    assert listing.images == {"layout": "folders", "classes": {"cat": 8, "dog": 8, "eel": 8}, "problems": []}


def test_rows_are_the_files_bytes_label_and_relative_path(tmp_path):
    written = class_folders(tmp_path / "train", per_class=3)
    listing = list_source(str(tmp_path / "train"))
    batches = list(iter_batches(listing, None, batch_rows=4))
    assert [b.file_index for b in batches] == [0, 4, 8] and [b.table.num_rows for b in batches] == [4, 4, 1]
    table = pa.concat_tables(b.table for b in batches)
    assert table.column_names == ["image", "path", "label"]
    assert table["path"].to_pylist() == sorted(written)
    assert table["label"].to_pylist() == [p.split("/")[0] for p in sorted(written)]
    assert table["image"][4].as_py() == (tmp_path / "train" / sorted(written)[4]).read_bytes()


def test_class_folders_shard_with_classes_found_sorted(tmp_path, store):
    written = class_folders(tmp_path / "train")
    data = images_spec(tmp_path / "train")
    summary = validate_source(data, shards=2, max_batch_size=4)
    assert summary["classes"] == list(CLASSES) and summary["class_counts"] == {c: 8 for c in CLASSES}
    manifest = shard_dataset(data, store, "dag", 2, 0)
    assert manifest.classes == list(CLASSES) and manifest.validation.rows == 6 and manifest.total_rows == 18
    seen = []
    for entry in [*manifest.shards, manifest.validation]:
        x, y = load_shard(cached_shard(store, entry, str(tmp_path / "cache")), manifest)
        assert x.shape[1:] == (4, 5, 3) and x.dtype == np.float32 and np.all(x[:, 1:, :, :] == 200)
        for index, label in zip(x[:, 0, 0, 0].astype(int), y):
            name = next(p for p, i in written.items() if i == index)
            assert CLASSES[label] == name.split("/")[0]  # each image kept its folder's class
            seen.append(index)
    assert sorted(seen) == list(range(24))


def test_declared_classes_order_the_labels(tmp_path, store):
    class_folders(tmp_path / "train", per_class=4)
    manifest = shard_dataset(images_spec(tmp_path / "train", classes=("eel", "dog", "cat")), store, "dag", 2, 0)
    assert manifest.classes == ["eel", "dog", "cat"]
    x, y = load_shard(cached_shard(store, manifest.shards[0], str(tmp_path / "c")), manifest)
    assert all(("eel", "dog", "cat")[label] == CLASSES[int(v) // 4] for v, label in zip(x[:, 0, 0, 0], y))


def test_a_separate_validation_folder_is_the_hold_out(tmp_path, store):
    class_folders(tmp_path / "train", per_class=4)
    class_folders(tmp_path / "valid", per_class=2, classes=("cat", "dog"))
    data = images_spec(tmp_path / "train", validation=str(tmp_path / "valid"))
    assert validate_source(data, shards=2, max_batch_size=2)["validation_rows"] == 4
    manifest = shard_dataset(data, store, "dag", 2, 0)
    assert manifest.classes == list(CLASSES) and manifest.total_rows == 12 and manifest.validation.rows == 4
    assert sorted(first_pixels(store, manifest.validation, manifest, tmp_path / "c")) == [0, 1, 2, 3]
    class_folders(tmp_path / "valid", per_class=1, classes=("fox",))  # a class the training folders lack
    with pytest.raises(DataValidationError, match=r"label column 'label': 1 value is not among the training labels "
                                                  r"\['cat', 'dog', 'eel'\] \(values 'fox'\)"):
        validate_source(data, shards=2, max_batch_size=2)


def test_a_glob_of_jpeg_files_with_shuffle_files(tmp_path, store):
    class_folders(tmp_path / "train", per_class=6, suffix="jpg", fmt="JPEG")
    (tmp_path / "train" / "dog" / "extra.png").write_bytes(image_bytes(99))  # the glob leaves it out
    data = images_spec(f"{tmp_path}/train/*/*.jpg", shuffle="files")
    assert list_source(data.source).total_rows == 18
    manifest = shard_dataset(data, store, "dag", 3, 0)
    assert manifest.total_rows + manifest.validation.rows == 18
    assert sorted(e.rows for e in manifest.shards) == [4, 4, 5]  # files dealt one by one, balanced


@pytest.mark.parametrize("separate_validation", [False, True])
def test_the_plan_is_written_file_by_file_and_reads_back_whole(tmp_path, store, separate_validation):
    from mop_airflow.data.shard import write_plan
    from mop_airflow.records import ShardingPlan

    class_folders(tmp_path / "train", per_class=3)
    class_folders(tmp_path / "valid", per_class=2)
    data = images_spec(tmp_path / "train", validation=str(tmp_path / "valid") if separate_validation else 0.25)
    plan = plan_sharding(data, store, "dag", 2, 0)
    write_plan(plan, store, store.uri("plan.json"))
    assert ShardingPlan.read(store, store.uri("plan.json")) == plan
    assert len(plan.listing.files) == 9 and (plan.held is not None) == separate_validation


def test_resize_and_color_mode_decode_as_declared(tmp_path, store):
    root = tmp_path / "train"
    for name, size, mode in (("a", (9, 7), "L"), ("b", (3, 3), "RGB"), ("c", (4, 5), "RGBA")):
        os.makedirs(root / name)
        for i in range(4):
            (root / name / f"{i}.png").write_bytes(image_bytes(10 * i, size=size, mode=mode))
    data = images_spec(root, validation=0.5, features={"image": {"shape": [4, 5, 3], "decode": "image",
                                                                 "resize": [4, 5], "interpolation": "nearest",
                                                                 "color_mode": "rgb"}})
    validate_source(data, shards=1, max_batch_size=2)
    manifest = shard_dataset(data, store, "dag", 1, 0)
    x, y = load_shard(cached_shard(store, manifest.shards[0], str(tmp_path / "c")), manifest)
    assert x.shape == (6, 4, 5, 3)
    grey = x[y == 0]
    assert np.all(grey[:, :, :, 0] == grey[:, :, :, 2])  # grey converted to RGB: equal channels
    assert manifest.inputs[0]["resize"] == [4, 5] and manifest.inputs[0]["color_mode"] == "rgb"


# -- a labels file -----------------------------------------------------------------------------
def labelled_folder(root, rows=12, *, name="labels.csv", file_column="file") -> dict[str, int]:
    os.makedirs(root / "img", exist_ok=True)
    files = {f"img/{i:02d}.png": i for i in range(rows)}
    for rel, index in files.items():
        (root / rel).write_bytes(image_bytes(index))
    table = pa.table({file_column: list(files), "age": [float(i) * 1.5 for i in range(rows)],
                      "weight": [float(i) for i in range(rows)]})
    if name.endswith(".csv"):
        import pyarrow.csv as pa_csv

        pa_csv.write_csv(table, str(root / name))
    else:
        pq.write_table(table, str(root / name))
    return files


@pytest.mark.parametrize("labels", ["labels.csv", {"path": "meta.parquet", "file_column": "filename"}])
def test_a_labels_file_gives_a_regression_target_and_an_extra_feature(tmp_path, store, labels):
    path = labels if isinstance(labels, str) else labels["path"]
    labelled_folder(tmp_path / "data", name=path, file_column="file" if isinstance(labels, str) else "filename")
    data = images_spec(tmp_path / "data", labels=labels, label="age", task="regression",
                       features={"image": {"shape": [4, 5, 3], "decode": "image"}, "meta": {"columns": ["weight"]}})
    listing = list_source(data.source, labels=data.labels)
    assert listing.columns == ["image", "path", "age", "weight"] and listing.total_rows == 12  # the labels file is no image
    validate_source(data, shards=2, max_batch_size=2)
    manifest = shard_dataset(data, store, "dag", 2, 0)
    for entry in [*manifest.shards, manifest.validation]:
        x, y = load_shard(cached_shard(store, entry, str(tmp_path / "c")), manifest)
        index = x["image"][:, 0, 0, 0]
        np.testing.assert_allclose(y, index * 1.5)  # each image got its own row's target...
        np.testing.assert_allclose(x["meta"][:, 0], index)  # ...and feature


def test_a_changed_labels_file_reshards(tmp_path, store):
    labelled_folder(tmp_path / "data")
    data = images_spec(tmp_path / "data", labels="labels.csv", label="age", task="regression")
    first = plan_sharding(data, store, "dag", 2, 0)
    os.utime(tmp_path / "data" / "labels.csv", (1, 1))
    assert plan_sharding(data, store, "dag", 2, 0).fingerprint != first.fingerprint


# -- bad input: the file, the rule and the fix, all in one error, nothing written ----------------------------
def _undecodable(root):
    (root / "dog" / "002.png").write_bytes(b"\x89PNG\r\n\x1a\n but no image")
    return {}, ["column 'image': 1 image(s) cannot be decoded: not an image, or truncated (file dog/002.png)"]


def _truncated(root):
    whole = image_bytes(1, size=(40, 40), fmt="JPEG")
    (root / "cat" / "001.png").write_bytes(whole[:len(whole) // 2])
    return {}, ["1 image(s) cannot be decoded: not an image, or truncated (file cat/001.png)"]


def _wrong_size(root):
    (root / "eel" / "003.png").write_bytes(image_bytes(1, size=(6, 5)))
    return {}, ["column 'image': 1 image(s) are not 4x5 (height x width) as declared in shape [4, 5, 3] "
                "(file eel/003.png; sizes such as 6x5)", "add \"resize\": [4, 5]"]


def _wrong_channels(root):
    (root / "cat" / "004.png").write_bytes(image_bytes(1, mode="L"))
    return {}, ["column 'image': 1 image(s) have 1 channel(s), not the 3 declared in shape [4, 5, 3] "
                "(file cat/004.png)", "add \"color_mode\": \"rgb\""]


def _outside(root):
    (root / "stray.png").write_bytes(image_bytes(1))
    return {}, ["data.source", "1 image file(s) sit outside any class folder (stray.png)",
                "move each into its class folder"]


def _empty_folder(root):
    os.makedirs(root / "fox")
    return {}, ["class folder(s) fox hold no image file", "add their images or remove the folders"]


def _undeclared_folder(root):
    return {"classes": ("cat", "dog")}, ["class folder 'eel' holds 5 image(s), but data.classes ['cat', 'dog'] "
                                         "does not list it; add 'eel' to data.classes"]


@pytest.mark.parametrize(("mutate", "expected"), [
    (_undecodable, None), (_truncated, None), (_wrong_size, None), (_wrong_channels, None), (_outside, None),
    (_empty_folder, None), (_undeclared_folder, None)],
    ids=["undecodable", "truncated", "wrong-size", "wrong-channels", "outside-a-class-folder", "empty-class-folder",
         "folder-not-declared"])
def test_bad_class_folders_name_the_file_and_write_nothing(tmp_path, store, store_dir, mutate, expected):
    root = tmp_path / "train"
    class_folders(root, per_class=5)
    overrides, expected = mutate(root)
    data = images_spec(root, **overrides)
    with pytest.raises(DataValidationError) as caught:
        validate_source(data, shards=2, max_batch_size=2)
    (failure,) = caught.value.failures
    for fragment in expected:
        assert fragment in failure, failure
    # the DAG's path: every scatter task writes nothing and the shard task says the same
    assert dag_path_failures(data, store) == caught.value.failures
    assert tree(store_dir) == []


def dag_path_failures(data, store) -> list[str]:
    plan = plan_sharding(data, store, "dag", 2, 0)
    checks = lambda: DataChecks.plan(data, plan.listing, plan.held, shards=2, max_batch_size=2)  # noqa: E731
    results = [scatter_slice(plan, data, store, k, checks()) for k in range(len(plan.slices))]
    assert not any(r.wrote for r in results)
    with pytest.raises(DataValidationError) as scattered:
        collect_shards(plan, data, store, results, checks())
    return scattered.value.failures


def _row_without_file(root):
    os.remove(root / "img" / "03.png")
    return ["labels file labels.csv: 1 row(s) name an image file the source does not have (row 3 ('img/03.png'), "
            "rows counted from 0)", "add the files, fix the paths or remove the rows"]


def _file_without_row(root):
    (root / "img" / "new.png").write_bytes(image_bytes(1))
    return ["1 image file(s) have no row in the labels file labels.csv (img/new.png); add a row for each"]


@pytest.mark.parametrize("mutate", [_row_without_file, _file_without_row], ids=["row-without-file", "file-without-row"])
def test_a_labels_file_that_does_not_match_the_files_names_them(tmp_path, store, store_dir, mutate):
    labelled_folder(tmp_path / "data")
    expected = mutate(tmp_path / "data")
    data = images_spec(tmp_path / "data", labels="labels.csv", label="age", task="regression")
    with pytest.raises(DataValidationError) as caught:
        validate_source(data, shards=2, max_batch_size=2)
    (failure,) = caught.value.failures
    for fragment in expected:
        assert fragment in failure, failure
    assert dag_path_failures(data, store) == caught.value.failures
    assert tree(store_dir) == []


def test_every_finding_of_many_slices_is_merged_into_one_error(tmp_path, store, store_dir):
    root = tmp_path / "train"
    class_folders(root, per_class=5)
    for mutate in (_undecodable, _wrong_size, _wrong_channels, _outside, _empty_folder):
        mutate(root)
    data = images_spec(root, slice_mb=1e-6)  # a scatter task per file
    failures = dag_path_failures(data, store)
    assert len(failures) == 5
    for fragment in ("sit outside any class folder (stray.png)", "class folder(s) fox hold no image",
                     "cannot be decoded: not an image, or truncated (file dog/002.png)",
                     "are not 4x5 (height x width)", "have 1 channel(s)"):
        assert sum(fragment in f for f in failures) == 1, (fragment, failures)
    assert tree(store_dir) == []


def test_a_missing_labels_file_or_column_is_named(tmp_path):
    labelled_folder(tmp_path / "data")
    with pytest.raises(DataValidationError, match=r"mixes image files and tables \(e.g. .*labels.csv\); .* if that "
                                                  r"table is the labels file, name it with data.labels"):
        list_source(str(tmp_path / "data"), labels={"path": "nope.csv", "file_column": "file"})
    os.rename(tmp_path / "data" / "labels.csv", tmp_path / "labels.csv")
    with pytest.raises(DataValidationError, match=r"labels file .*nope.csv does not exist; put it beside the images"):
        list_source(str(tmp_path / "data"), labels={"path": "nope.csv", "file_column": "file"})
    data = images_spec(tmp_path / "data", labels={"path": str(tmp_path / "labels.csv"), "file_column": "name"},
                       label="age", task="regression")
    with pytest.raises(DataValidationError, match=r"labels file labels.csv has no column 'name' \(it has 'file', "
                                                  r"'age', 'weight'\); name the column of image paths"):
        validate_source(data, shards=2, max_batch_size=2)


def test_a_labels_file_beside_tables_is_refused(tmp_path):
    pq.write_table(pa.table({"x0": [1.0], "label": [0]}), str(tmp_path / "part.parquet"))
    with pytest.raises(DataValidationError, match=r"data.labels='labels.csv' names a labels file for a folder of "
                                                  r"images, but .* holds tables; remove data.labels"):
        list_source(str(tmp_path), labels={"path": "labels.csv", "file_column": "file"})


# -- S3 ------------------------------------------------------------------------------------------
def test_class_folders_and_a_labels_file_on_an_s3_prefix(s3_endpoint, tmp_path, store):
    import s3fs

    make_bucket(s3_endpoint, "mop-images")
    options = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": s3_endpoint}}
    fs = s3fs.S3FileSystem(**options)
    class_folders(tmp_path / "train", per_class=4)
    labelled_folder(tmp_path / "labelled")
    fs.put(str(tmp_path / "train"), "mop-images/train", recursive=True)
    fs.put(str(tmp_path / "labelled"), "mop-images/labelled", recursive=True)

    data = images_spec("s3://mop-images/train/", storage_options=options)
    listing = list_source(data.source, options)
    assert listing.total_rows == 12 and listing.files[0].uri == "s3://mop-images/train/cat/000.png"
    assert all(f.version for f in listing.files)  # the ETag, from the listing itself
    manifest = shard_dataset(data, store, "dag", 2, 0)
    assert manifest.classes == list(CLASSES)
    assert sorted(i for e in [*manifest.shards, manifest.validation]
                  for i in first_pixels(store, e, manifest, tmp_path / "c")) == list(range(12))

    labelled = images_spec("s3://mop-images/labelled", storage_options=options, labels="labels.csv", label="age",
                           task="regression")
    assert validate_source(labelled, shards=2, max_batch_size=2)["rows"] == 12
    manifest = shard_dataset(labelled, store, "dag", 2, 0)
    x, y = load_shard(cached_shard(store, manifest.shards[0], str(tmp_path / "c2")), manifest)
    np.testing.assert_allclose(y, x[:, 0, 0, 0] * 1.5)


# -- the spec ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("image", "field", "rule"), [
    ({"resize": [4, 4]}, "data.features.image.resize", "must match the height and width of shape [4, 5, 3]"),
    ({"resize": [4]}, "data.features.image.resize", "must be [height, width] in pixels"),
    ({"interpolation": "bilinear"}, "data.features.image.interpolation", "only applies with resize"),
    ({"resize": [4, 5], "interpolation": "lanczos5"}, "data.features.image.interpolation", "must be one of"),
    ({"color_mode": "grayscale"}, "data.features.image.color_mode", "gives 1 channel(s), but shape [4, 5, 3]"),
    ({"color_mode": "cmyk"}, "data.features.image.color_mode", "must be one of grayscale, rgb, rgba"),
])
def test_image_options_are_checked_at_parse_time(image, field, rule):
    with pytest.raises(SpecError) as caught:
        images_spec("/data/train/", features={"image": {"shape": [4, 5, 3], "decode": "image", **image}})
    assert caught.value.field == field and rule in str(caught.value)


@pytest.mark.parametrize("labels", [{"path": "labels.txt"}, {"path": "l.csv", "column": "f"}, 3])
def test_a_labels_file_must_be_csv_or_parquet(labels):
    with pytest.raises(SpecError, match="data.labels"):
        images_spec("/data/train/", labels=labels)
