"""Sources of many files (folders, globs, hive partitions, CSV, S3 prefixes), streamed and sharded in place."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mop_airflow.data.permutation import permuted_positions, split_of
from mop_airflow.data.shard import deal_files, shard_dataset
from mop_airflow.data.source import list_source
from mop_airflow.data.validate import validate_source
from mop_airflow.errors import DataValidationError
from mop_airflow.config import DataSpec
from mop_airflow.store import Store
from tests.conftest import make_bucket

from .tables import make_columns, tree


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Great Expectations must not scaffold anything in the working directory


def spec(source, **overrides) -> DataSpec:
    values = {"source": str(source), "label": "label", "features": "x*", "classes": (0, 1, 2)}
    return DataSpec(**{**values, **overrides})


def write_parts(folder, sizes, *, name="part-{i:03d}.parquet", start=0) -> list[str]:
    """Files whose x0 numbers the rows across all files, so tests can tell which rows went where."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i, rows in enumerate(sizes):
        columns = make_columns(rows, seed=i)
        columns["x0"] = np.arange(start, start + rows, dtype=np.float64)
        start += rows
        path = os.path.join(folder, name.format(i=i))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table(columns), path)
        paths.append(path)
    return paths


def row_ids(store, entry) -> list[int]:
    return [int(v) for v in pq.read_table(store.local_path(entry.uri))["x0"].to_pylist()]


# -- the permutation behind row-level shuffling -------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
@pytest.mark.parametrize("seed", [0, 11])
def test_permuted_positions_is_a_bijection_on_range_n(n, seed):
    positions = permuted_positions(np.arange(n), n, seed)
    assert sorted(positions.tolist()) == list(range(n))
    # evaluated in any chunks, in any order, the same positions
    chunks = np.array_split(np.random.default_rng(1).permutation(n), 5)
    again = np.empty(n, dtype=np.int64)
    for chunk in chunks:
        again[chunk] = permuted_positions(chunk, n, seed)
    assert np.array_equal(again, positions)


def test_permutation_depends_on_the_seed_and_looks_random():
    a, b = permuted_positions(np.arange(1000), 1000, 1), permuted_positions(np.arange(1000), 1000, 2)
    assert not np.array_equal(a, b)
    # rows 0..99 land all over the range, not in one block
    assert np.ptp(a[:100]) > 800 and abs(float(np.corrcoef(np.arange(1000), a)[0, 1])) < 0.1


@pytest.mark.parametrize(("total", "parts"), [(10, 3), (82, 4), (5, 5), (3, 5), (100, 1)])
def test_split_of_matches_numpy_array_split(total, parts):
    expected = np.concatenate([np.full(len(chunk), k) for k, chunk in enumerate(np.array_split(np.arange(total), parts))])
    assert np.array_equal(split_of(np.arange(total), total, parts), expected)


# -- listing --------------------------------------------------------------------------------------
def test_a_folder_a_glob_and_one_file_list_their_files(tmp_path):
    paths = write_parts(tmp_path / "data", [30, 20, 25])
    (tmp_path / "data" / "_SUCCESS").write_text("")
    (tmp_path / "data" / "notes.txt").write_text("not data")
    folder = list_source(str(tmp_path / "data"))
    assert [f.uri for f in folder.files] == ["file://" + p for p in paths]
    assert [f.rows for f in folder.files] == [30, 20, 25] and folder.total_rows == 75
    assert folder.format == "parquet" and folder.columns == ["x0", "x1", "x2", "label"]
    assert all(f.bytes == os.path.getsize(p) and f.version for f, p in zip(folder.files, paths))
    assert [f.rows for f in list_source(str(tmp_path / "data" / "part-00[02].parquet")).files] == [30, 25]
    assert list_source(paths[1]).total_rows == 20


def test_hive_partitions_become_columns(tmp_path):
    write_parts(tmp_path / "data" / "year=2024", [10])
    write_parts(tmp_path / "data" / "year=2025", [12], start=10)
    listing = list_source(str(tmp_path / "data"))
    assert listing.partitions == ["year"] and "year" in listing.columns
    manifest = shard_dataset(spec(tmp_path / "data", features=("x0", "year"), validation=0.25),
                             Store(f"file://{tmp_path}/store"), "dag", 2, 0)
    table = pa.concat_tables(pq.read_table(Store(f"file://{tmp_path}/store").local_path(e.uri))
                             for e in [*manifest.shards, manifest.validation])
    years = dict(zip(table["x0"].to_pylist(), table["year"].to_pylist()))
    assert len(years) == 22 and all(years[float(i)] == (2024 if i < 10 else 2025) for i in range(22))


@pytest.mark.parametrize(("make", "expected"), [
    (lambda root: os.makedirs(root / "empty"), "no .parquet, .pq or .csv files"),
    (lambda root: None, "no .parquet, .pq or .csv files"),
], ids=["empty-folder", "missing-path"])
def test_a_source_matching_no_files_is_a_clear_error(tmp_path, make, expected):
    make(tmp_path)
    with pytest.raises(DataValidationError, match=expected):
        validate_source(spec(tmp_path / "empty"), shards=2, max_batch_size=4)
    with pytest.raises(DataValidationError, match=expected):
        list_source(str(tmp_path / "nothing-*.parquet"))


def test_files_whose_schemas_disagree_are_named(tmp_path):
    write_parts(tmp_path / "data", [10, 10])
    columns = make_columns(10)
    columns["x1"] = np.array([str(v) for v in columns["x1"]])
    pq.write_table(pa.table(columns), tmp_path / "data" / "part-zzz.parquet")
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(tmp_path / "data"), shards=2, max_batch_size=4)
    (failure,) = caught.value.failures
    assert "files disagree on column 'x1'" in failure and "part-000.parquet has double" in failure
    assert "part-zzz.parquet has string" in failure and "one schema" in failure


def test_a_corrupt_parquet_file_is_named(tmp_path):
    write_parts(tmp_path / "data", [10])
    (tmp_path / "data" / "part-bad.parquet").write_bytes(b"PAR1 not really parquet")
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(tmp_path / "data"), shards=2, max_batch_size=4)
    (failure,) = caught.value.failures
    assert "part-bad.parquet cannot be read as parquet" in failure and "replace or remove it" in failure


def test_mixed_formats_are_refused(tmp_path):
    write_parts(tmp_path / "data", [10])
    (tmp_path / "data" / "more.csv").write_text("x0,label\n1,0\n")
    with pytest.raises(DataValidationError, match="mixes Parquet and CSV files"):
        list_source(str(tmp_path / "data"))


# -- validation over several files ------------------------------------------------------------------
def test_failures_from_several_files_are_merged_with_file_and_row(tmp_path):
    paths = write_parts(tmp_path / "data", [20, 20, 20])
    for path, bad in zip(paths[1:], ([3], [0, 7])):
        table = pq.read_table(path).to_pydict()
        for row in bad:
            table["x1"][row] = float("nan")
        pq.write_table(pa.table(table), path)
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(tmp_path / "data"), shards=2, max_batch_size=4)
    (failure,) = caught.value.failures
    assert failure.startswith("column 'x1': 3 values are null or NaN (rows part-001.parquet:3, "
                              "part-002.parquet:0, part-002.parquet:7, counted from 0 in each file)")


def test_validation_streams_each_file_and_counts_every_row(tmp_path):
    write_parts(tmp_path / "data", [40, 41, 42])
    summary = validate_source(spec(tmp_path / "data"), shards=3, max_batch_size=8)
    assert (summary["rows"], summary["files"], summary["batches"]) == (123, 3, 3)
    assert summary["class_counts"] == {"0": 14 + 14 + 14, "1": 13 + 14 + 14, "2": 13 + 13 + 14}  # per file from 0


def test_classes_left_out_are_found_sorted_and_recorded(tmp_path, store):
    paths = write_parts(tmp_path / "data", [30, 30])
    data = spec(tmp_path / "data", classes=())
    assert validate_source(data, shards=2, max_batch_size=4)["classes"] == [0, 1, 2]
    assert shard_dataset(data, store, "dag", 2, 0).classes == [0, 1, 2]
    one_class = make_columns(30, classes=(5,))
    pq.write_table(pa.table(one_class), paths[0])
    pq.write_table(pa.table(one_class), paths[1])
    with pytest.raises(DataValidationError, match=r"holds 1 distinct value\(s\) \[5\]; classification needs"):
        validate_source(data, shards=2, max_batch_size=4)


# -- sharding many files --------------------------------------------------------------------------
def test_a_folder_is_sharded_row_by_row_at_random(tmp_path, store, store_dir):
    write_parts(tmp_path / "data", [50, 30, 23])
    manifest = shard_dataset(spec(tmp_path / "data", validation=0.2), store, "dag", 4, 7)
    assert [e.rows for e in manifest.shards] == [21, 21, 20, 20] and manifest.validation.rows == 21
    ids = [row_ids(store, e) for e in manifest.shards]
    assert sorted([i for shard in ids for i in shard] + row_ids(store, manifest.validation)) == list(range(103))
    # every shard samples all three files, not one file each
    assert all({i // 50 if i < 80 else 2 for i in shard} >= {0, 2} for shard in ids)
    assert len(tree(store_dir)) == 6


def test_the_same_listing_reuses_shards_and_a_changed_file_reshards(tmp_path, store):
    paths = write_parts(tmp_path / "data", [40, 40])
    first = shard_dataset(spec(tmp_path / "data"), store, "dag", 2, 0)
    assert shard_dataset(spec(tmp_path / "data"), store, "dag", 2, 0).reused
    write_parts(tmp_path / "data", [41], name="part-001.parquet")  # same name, new content and size
    again = shard_dataset(spec(tmp_path / "data"), store, "dag", 2, 0)
    assert not again.reused and again.fingerprint != first.fingerprint and again.total_rows + again.validation.rows == 81
    assert os.path.exists(paths[0])


def test_shuffle_files_deals_whole_files(tmp_path, store):
    write_parts(tmp_path / "data", [10] * 10)
    manifest = shard_dataset(spec(tmp_path / "data", shuffle="files", validation=0.2), store, "dag", 4, 3)
    parts = [row_ids(store, e) for e in [*manifest.shards, manifest.validation]]
    files_of = [sorted({i // 10 for i in part}) for part in parts]
    assert sorted(f for files in files_of for f in files) == list(range(10))  # each file in exactly one part
    assert all(len(part) == 10 * len(files) for part, files in zip(parts, files_of))
    assert [e.rows for e in manifest.shards] == [20, 20, 20, 20] and manifest.validation.rows == 20


def test_deal_files_balances_rows():
    parts = deal_files([100, 90, 80, 70, 60, 50, 40, 30], shards=3, seed=0, validation_rows=0)
    loads = [sum(r for r, p in zip([100, 90, 80, 70, 60, 50, 40, 30], parts) if p == k) for k in range(3)]
    assert sum(loads) == 520 and max(loads) - min(loads) <= 100


def test_an_s3_prefix_is_a_source(s3_endpoint, tmp_path, store):
    import s3fs

    make_bucket(s3_endpoint, "mop-source")
    options = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": s3_endpoint}}
    fs = s3fs.S3FileSystem(**options)
    for path in write_parts(tmp_path / "local", [25, 25, 30]):
        fs.put(path, f"mop-source/train/{os.path.basename(path)}")
    data = spec("s3://mop-source/train/", storage_options=options)
    listing = list_source(data.source, options)
    assert [f.uri for f in listing.files] == [f"s3://mop-source/train/part-00{i}.parquet" for i in range(3)]
    assert all(f.version for f in listing.files)  # the ETag
    assert validate_source(data, shards=2, max_batch_size=4)["rows"] == 80
    manifest = shard_dataset(data, store, "dag", 2, 0)
    assert sorted(i for e in [*manifest.shards, manifest.validation] for i in row_ids(store, e)) == list(range(80))


def test_a_csv_folder(tmp_path, store):
    os.makedirs(tmp_path / "csv")
    for part in range(3):
        rows = "".join(f"{i},{i * 0.5},{i % 3}\n" for i in range(part * 20, part * 20 + 20))
        (tmp_path / "csv" / f"part-{part}.csv").write_text("x0,x1,label\n" + rows)
    manifest = shard_dataset(spec(tmp_path / "csv"), store, "dag", 2, 0)
    assert [e.rows for e in manifest.shards] == [24, 24]
    assert sorted(i for e in [*manifest.shards, manifest.validation] for i in row_ids(store, e)) == list(range(60))


@pytest.mark.parametrize(("column", "value", "expected"), [
    ("x1", float("nan"), "column 'x1': 1 value is null or NaN (row part-002.parquet:4"),
    ("x2", float("-inf"), "column 'x2': 1 value is +/-inf (row part-002.parquet:4"),
    ("label", 7, "label column 'label': 1 value is not in data.classes [0, 1, 2] (row part-002.parquet:4"),
    ("label", None, "label column 'label': 1 value is null (row part-002.parquet:4"),
], ids=["nan", "inf", "label-outside-classes", "null-label"])
def test_a_bad_value_in_a_later_batch_is_found(tmp_path, column, value, expected):
    """The first batch runs every expectation; later ones only where the pre-check suspects a column."""
    paths = write_parts(tmp_path / "data", [20, 20, 20])
    table = pq.read_table(paths[2]).to_pydict()
    table[column][4] = value
    pq.write_table(pa.table(table), paths[2])
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(tmp_path / "data"), shards=2, max_batch_size=4)
    (failure,) = caught.value.failures
    assert failure.startswith(expected), failure
