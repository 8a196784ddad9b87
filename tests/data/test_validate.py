"""Great Expectations validation: every rule, every failure listed, nothing written anywhere."""

from __future__ import annotations

import numpy as np
import pytest

from mop_airflow.data.inputs import resolve_columns
from mop_airflow.data.validate import validate_source
from mop_airflow.errors import DataValidationError
from mop_airflow.config import DataSpec

from .tables import make_columns, tree, write_parquet


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    # Great Expectations must not scaffold a project (gx/) in the working directory either.
    monkeypatch.chdir(tmp_path)


def spec(source, **overrides) -> DataSpec:
    values = {"source": str(source), "label": "label", "features": "x*", "classes": (0, 1, 2)}
    return DataSpec(**{**values, **overrides})


def test_resolve_features_glob_keeps_file_order_and_tuple_is_taken_as_is():
    columns = ["b2", "a1", "label", "b1"]
    assert resolve_columns(columns, "b*", "data.features") == ["b2", "b1"]
    assert resolve_columns(columns, ("b1", "zz"), "data.features") == ["b1", "zz"]
    with pytest.raises(DataValidationError, match="matches none of the columns"):
        resolve_columns(columns, "x*", "data.features")


def test_success_summary_counts_rows_classes_and_holdout(tmp_path, store_dir):
    source = write_parquet(tmp_path / "train.parquet", make_columns(103, features=4))
    summary = validate_source(spec(source, validation=0.2), shards=4, max_batch_size=10)
    assert summary["rows"] == 103
    assert summary["columns"] == ["x0", "x1", "x2", "x3", "label"]
    assert summary["features"] == ["x0", "x1", "x2", "x3"]
    assert summary["label"] == "label"
    # labels cycle 0, 1, 2: 103 rows -> 35, 34, 34
    assert summary["class_counts"] == {"0": 35, "1": 34, "2": 34}
    assert summary["validation_rows"] == 21  # round(103 * 0.2) = round(20.6)
    assert {"expect_column_to_exist", "expect_column_values_to_be_in_type_list",
            "expect_column_values_to_not_be_null", "expect_column_values_to_not_be_in_set",
            "expect_column_values_to_be_in_set", "expect_table_row_count_to_be_between"} == set(summary["checks"])
    assert tree(store_dir) == []
    assert tree(tmp_path) == ["train.parquet"]


def test_row_count_boundary_follows_the_holdout(tmp_path):
    # 4 shards x 10 rows = 40 training rows; 50 rows hold out 10 -> 40 (enough); 49 hold out 10 -> 39.
    enough = write_parquet(tmp_path / "enough.parquet", make_columns(50))
    validate_source(spec(enough), shards=4, max_batch_size=10)
    short = write_parquet(tmp_path / "short.parquet", make_columns(49))
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(short), shards=4, max_batch_size=10)
    (failure,) = caught.value.failures
    assert "49 row(s) but needs at least 50" in failure
    assert "4 shard(s) x max_batch_size 10 = 40 training rows" in failure


def _missing_column(columns):
    return columns, {"features": ("x0", "x_2")}


def _non_numeric(columns):
    columns["x1"] = np.array([f"v{i}" for i in range(len(columns["x1"]))])
    return columns, {}


def _nan(columns):
    columns["x2"][[10, 57]] = np.nan
    return columns, {}


def _inf(columns):
    columns["x1"][3] = np.inf
    columns["x1"][4] = -np.inf
    return columns, {}


def _label_outside_classes(columns):
    columns["label"][[5, 6]] = 9
    return columns, {}


def _too_few_rows(columns):
    return columns, {}


@pytest.mark.parametrize(("mutate", "shards", "expected"), [
    (_missing_column, 2, ["column 'x_2' is missing", "(did you mean 'x2'?)", "fix data.features"]),
    (_non_numeric, 2, ["column 'x1'", "type string is not numeric", "convert the column to numbers"]),
    (_nan, 2, ["column 'x2'", "2 values are null or NaN", "rows 10, 57", "remove or impute"]),
    (_inf, 2, ["column 'x1'", "2 values are +/-inf", "rows 3, 4", "clip the values"]),
    (_label_outside_classes, 2, ["label column 'label'", "2 values are not in data.classes [0, 1, 2]",
                                 "rows 5, 6", "values 9", "add the missing classes"]),
    (_too_few_rows, 20, ["the file has 100 row(s) but needs at least 200", "use fewer shards"]),
], ids=["missing-column", "non-numeric", "nan", "inf", "label-outside-classes", "too-few-rows"])
def test_each_failure_names_column_rule_and_fix(tmp_path, store_dir, mutate, shards, expected):
    columns, overrides = mutate(make_columns(100))
    source = write_parquet(tmp_path / "train.parquet", columns)
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(source, **overrides), shards=shards, max_batch_size=8)
    assert len(caught.value.failures) == 1, caught.value.failures
    for fragment in expected:
        assert fragment in caught.value.failures[0]
    assert caught.value.source == source
    assert tree(store_dir) == []
    assert tree(tmp_path) == ["train.parquet"]


def test_multiple_failures_are_all_listed(tmp_path, store_dir):
    columns = make_columns(100)
    columns["x1"][0] = np.nan
    columns["x2"][1] = np.inf
    columns["label"][2] = 7
    source = write_parquet(tmp_path / "train.parquet", columns)
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(source, features=("x0", "x1", "x2", "x9")), shards=50, max_batch_size=8)
    failures = caught.value.failures
    assert len(failures) == 5, failures
    for fragment in ["'x9' is missing", "'x1': 1 value is null or NaN", "'x2': 1 value is +/-inf",
                     "'label': 1 value is not in data.classes", "needs at least"]:
        assert sum(fragment in f for f in failures) == 1, (fragment, failures)
    assert "failed 5 expectation(s)" in str(caught.value)
    assert tree(store_dir) == []


def test_glob_matching_nothing_is_reported_with_the_other_failures(tmp_path):
    columns = make_columns(100)
    columns["label"][0] = 5
    source = write_parquet(tmp_path / "train.parquet", columns)
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(source, features="feat_*"), shards=2, max_batch_size=8)
    assert [("'feat_*' matches none" in f, "not in data.classes" in f) for f in caught.value.failures] == \
        [(True, False), (False, True)]


def test_missing_label_points_at_data_label(tmp_path):
    source = write_parquet(tmp_path / "train.parquet", make_columns(100))
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(source, label="lable"), shards=2, max_batch_size=8)
    assert caught.value.failures == ["column 'lable' is missing (did you mean 'label'?); the file has columns "
                                     "'x0', 'x1', 'x2', 'label'; add the column or fix data.label"]


def test_a_missing_label_without_declared_classes_is_named_once(tmp_path):
    """With data.classes left out the classes are found in the label column; a column that is not there is the
    one failure, not also "holds 0 distinct values"."""
    source = write_parquet(tmp_path / "train.parquet", make_columns(100))
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(source, label="Label", classes=()), shards=2, max_batch_size=8)
    assert caught.value.failures == ["column 'Label' is missing (did you mean 'label'?); the file has columns "
                                     "'x0', 'x1', 'x2', 'label'; add the column or fix data.label"]


def test_separate_validation_file_with_a_bad_column(tmp_path, store_dir):
    source = write_parquet(tmp_path / "train.parquet", make_columns(100))
    bad = make_columns(20)
    bad["x1"] = np.array(["oops"] * 20)
    valid = write_parquet(tmp_path / "valid.parquet", bad)
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(source, validation=valid), shards=2, max_batch_size=8)
    (failure,) = caught.value.failures
    assert failure.startswith(f"validation file {valid}: column 'x1': type string is not numeric")
    assert tree(store_dir) == []


def test_separate_validation_file_counts_its_own_rows(tmp_path):
    source = write_parquet(tmp_path / "train.parquet", make_columns(16))
    valid = write_parquet(tmp_path / "valid.parquet", make_columns(7))
    # a separate file holds nothing out: 16 rows = exactly 2 shards x 8
    summary = validate_source(spec(source, validation=valid), shards=2, max_batch_size=8)
    assert (summary["rows"], summary["validation_rows"]) == (16, 7)


def test_csv_source(tmp_path):
    columns = make_columns(60)
    lines = ["x0,x1,x2,label"] + [",".join(str(columns[c][i]) for c in ("x0", "x1", "x2", "label"))
                                  for i in range(60)]
    lines[11] = "10,nan,0.5,1"  # row 10
    source = tmp_path / "train.csv"
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataValidationError, match=r"column 'x1': 1 value is null or NaN \(row 10,"):
        validate_source(spec(source), shards=2, max_batch_size=8)
    lines[11] = "10,0.25,0.5,1"
    source.write_text("\n".join(lines) + "\n")
    summary = validate_source(spec(source), shards=2, max_batch_size=8)
    assert summary["rows"] == 60 and summary["class_counts"] == {"0": 20, "1": 20, "2": 20}


def test_missing_or_unreadable_source_is_a_data_error(tmp_path):
    with pytest.raises(DataValidationError, match="no .parquet, .pq or .csv files at .*absent.parquet"):
        validate_source(spec(tmp_path / "absent.parquet"), shards=2, max_batch_size=8)
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataValidationError, match="broken.parquet cannot be read as parquet"):
        validate_source(spec(tmp_path / "broken.parquet"), shards=2, max_batch_size=8)


def test_empty_or_unreadable_validation_file_is_reported_with_source_failures(tmp_path):
    columns = make_columns(100)
    columns["x1"][0] = np.nan
    source = write_parquet(tmp_path / "train.parquet", columns)
    empty = write_parquet(tmp_path / "empty.parquet", make_columns(0))
    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(source, validation=empty), shards=2, max_batch_size=8)
    assert caught.value.failures[-1] == (
        f"validation file {empty} has 0 row(s) but needs at least 1 (a validation set); "
        "point data.validation at a non-empty file or use a fraction such as 0.2")
    assert len(caught.value.failures) == 2

    with pytest.raises(DataValidationError) as caught:
        validate_source(spec(source, validation=str(tmp_path / "absent.csv")), shards=2, max_batch_size=8)
    assert [f.split(":")[0] for f in caught.value.failures] == [
        f"validation file {tmp_path}/absent.csv", "column 'x1'"]
