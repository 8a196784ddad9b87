"""Scoring new rows with a run's model (mop_airflow.serving.predict) and exporting it for serving.

One tiny run per task, made once per module with dag.test(): scikit-learn's digits as 8x8x1 tensors
(a fixed-size list column, which shards store packed) with two configurations, and Friedman #1 as
a regression on CSV files. Every output is compared with ``model.predict`` on the same rows.
"""

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from mop_airflow.errors import DataValidationError, SpecError, StoreError
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.results.runs import run_layout
from mop_airflow.serving.predict import load_run_model, predict
from tests.conftest import write_dag_file

pytestmark = pytest.mark.integration

IMAGES = "mop_airflow.examples.image_models"


def _digits(path, rows=slice(None)):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = x[rows], y[rows]
    pixels = pa.FixedSizeListArray.from_arrays(pa.array((x / 16.0).astype(np.float32).reshape(-1)), 64)
    pq.write_table(pa.table({"key": [f"d{i}" for i in range(len(y))], "pixels": pixels,
                             "label": y.astype(np.int64)}), path, row_group_size=200)
    return (x / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)


def _run(tmp, dag_id, data, params, metric):
    root = f"file://{tmp / 'store'}"
    spec = {"data": data, "search": {"space": {"method": "grid", "params": {"batch_size": [64], **params}},
                                     "metric": metric},
            "schedule": {"shards": 2, "iterations": 1, "seed": 3}, "store": {"root": root}}
    dag_run = write_dag_file(dag_id, spec).test()
    assert dag_run.state == "success"
    return RunLayout(Store(root), dag_id, dag_run.run_id)


@pytest.fixture(scope="module")
def digits_run(airflow_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("predict_digits")
    _digits(tmp / "train.parquet")
    data = {"source": str(tmp / "train.parquet"), "label": "label", "features": {"pixels": {"shape": [8, 8, 1]}},
            "classes": list(range(10)), "validation": 0.2}
    params = {"model": [f"{IMAGES}:flat_mlp"], "learning_rate": [1e-2, 1e-4]}
    return tmp, _run(tmp, "mop_predict_digits", data, params, "val_accuracy")


@pytest.fixture(scope="module")
def friedman_run(airflow_db, tmp_path_factory):
    from mop_airflow.examples.sklearn_data import write_friedman

    tmp = tmp_path_factory.mktemp("predict_friedman")
    folder = write_friedman(str(tmp), rows=600)
    data = {"source": folder, "label": "y", "features": "x*", "task": "regression", "validation": 0.2}
    params = {"model": [f"{IMAGES}:regressor"], "learning_rate": [1e-2], "loss": ["mse"], "metrics": ["mae"]}
    return tmp, folder, _run(tmp, "mop_predict_friedman", data, params, "val_mae")


def _path(done):
    assert done["uri"].startswith("file:///")  # a local --out is written as a file:// URI
    return done["uri"].removeprefix("file://")


def _read(done):
    return pq.read_table(_path(done))


def _best(layout):
    import keras

    return keras.models.load_model(layout.store.local_path(layout.report_uri("best_model.keras")))


def test_each_mode_gives_what_model_predict_gives_on_the_same_rows(digits_run):
    tmp, layout = digits_run
    x = _digits(tmp / "new.parquet", slice(0, 300))
    expected = _best(layout).predict(x, verbose=0)

    out = predict(layout, str(tmp / "new.parquet"), str(tmp / "response.parquet"), mode="response", id_column="key")
    table = _read(out)
    assert out["rows"] == 300 and table.column_names == ["row_id", "key", "response"]
    assert table["row_id"].to_pylist() == list(range(300))
    assert table["key"].to_pylist() == [f"d{i}" for i in range(300)]
    assert table["response"].to_pylist() == expected.argmax(axis=1).tolist()  # the classes are 0..9

    out = predict(layout, str(tmp / "new.parquet"), str(tmp / "prob.parquet"), mode="prob")
    table = _read(out)
    assert table.column_names == ["row_id", *[f"prob_{c}" for c in range(10)]]
    probs = np.stack([table[f"prob_{c}"].to_numpy() for c in range(10)], axis=1)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)

    out = predict(layout, str(tmp / "new.parquet"), str(tmp / "top.parquet"), mode="top_k", k=3)
    table = _read(out)
    assert table.column_names == ["row_id", "rank", "class", "prob"] and table.num_rows == 300 * 3
    assert table["row_id"].to_pylist() == np.repeat(np.arange(300), 3).tolist()
    assert table["rank"].to_pylist() == [1, 2, 3] * 300
    top = np.argsort(-expected, axis=1, kind="stable")[:, :3]
    assert table["class"].to_pylist() == top.reshape(-1).tolist()
    np.testing.assert_allclose(table["prob"].to_numpy(), np.take_along_axis(expected, top, 1).reshape(-1),
                               rtol=1e-5, atol=1e-6)


def test_streaming_in_small_batches_writes_what_one_batch_writes(digits_run):
    tmp, layout = digits_run
    _digits(tmp / "stream.parquet", slice(0, 500))
    whole = predict(layout, str(tmp / "stream.parquet"), str(tmp / "whole.parquet"), mode="prob", batch_rows=10_000)
    small = predict(layout, str(tmp / "stream.parquet"), str(tmp / "small.parquet"), mode="prob", batch_rows=64)
    a, b = _read(whole), _read(small)
    assert pq.ParquetFile(_path(small)).metadata.num_row_groups == 8  # written a batch at a time
    assert a.column_names == b.column_names and a["row_id"].equals(b["row_id"])
    for name in a.column_names[1:]:
        np.testing.assert_allclose(a[name].to_numpy(), b[name].to_numpy(), rtol=1e-5, atol=1e-6)


def test_a_chosen_configuration_scores_with_its_last_checkpoint(digits_run):
    tmp, layout = digits_run
    x = _digits(tmp / "some.parquet", slice(0, 50))
    run = layout.store.read_json(layout.run_record_uri)
    best = layout.store.read_json(layout.report_uri("summary.json"))["best"]["config_id"]
    other = next(c["config_id"] for c in run["configs"] if c["config_id"] != best)
    chosen = load_run_model(layout, other)
    assert chosen.config_id == other and chosen.checkpoint.endswith(f"/checkpoints/{other}/t001.npz")
    out = predict(layout, str(tmp / "some.parquet"), str(tmp / "other.parquet"), mode="prob", run_model=chosen)
    probs = np.stack([_read(out)[f"prob_{c}"].to_numpy() for c in range(10)], axis=1)
    np.testing.assert_allclose(probs, chosen.model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert not np.allclose(probs, _best(layout).predict(x, verbose=0), atol=1e-3)  # another model indeed
    with pytest.raises(SpecError, match=r"--config='c00x': is not a configuration of run .*Fix: use one of"):
        load_run_model(layout, "c00x")


def test_bad_input_is_refused_before_scoring_naming_the_column_and_the_fix(digits_run):
    tmp, layout = digits_run
    _digits(tmp / "ok.parquet", slice(0, 20))
    table = pq.read_table(tmp / "ok.parquet")
    pq.write_table(table.rename_columns(["key", "pixel", "label"]), tmp / "renamed.parquet")
    out = tmp / "never.parquet"
    with pytest.raises(DataValidationError) as error:
        predict(layout, str(tmp / "renamed.parquet"), str(out))
    assert ("column 'pixels' is missing (did you mean 'pixel'?): the model's input 'pixels' was trained on it"
            in str(error.value)) and "add the column (same name as in training)" in str(error.value)
    short = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(20 * 63, np.float32)), 63)
    pq.write_table(table.set_column(1, "pixels", short), tmp / "short.parquet")
    with pytest.raises(DataValidationError, match=r"column 'pixels': rows hold 63 values, but input 'pixels' "
                                                  r"takes shape \[8, 8, 1\] \(64 values\)"):
        predict(layout, str(tmp / "short.parquet"), str(out))
    pq.write_table(table.set_column(1, "pixels", pa.array(["x"] * 20)), tmp / "text.parquet")
    with pytest.raises(DataValidationError, match=r"column 'pixels': type string is not a list of numbers"):
        predict(layout, str(tmp / "text.parquet"), str(out))
    ragged = pa.array([[0.0] * 64] * 19 + [[0.0] * 60], pa.list_(pa.float32()))
    pq.write_table(table.set_column(1, "pixels", ragged), tmp / "ragged.parquet")
    with pytest.raises(DataValidationError, match=r"1 row\(s\) hold a tensor of the wrong length \(row 19"):
        predict(layout, str(tmp / "ragged.parquet"), str(out), batch_rows=10)  # the 2nd batch fails
    with pytest.raises(SpecError, match=r"--k=11: must be between 1 and the run's 10 classes"):
        predict(layout, str(tmp / "ok.parquet"), str(out), mode="top_k", k=11)
    assert not out.exists()  # nothing written, not even the first batch of the ragged source


def test_regression_response_is_the_predicted_value(friedman_run):
    tmp, folder, layout = friedman_run
    out = predict(layout, folder, str(tmp / "values.parquet"))
    x = pa_csv.read_csv(f"{folder}/part-0.csv").drop(["y"]).to_pandas().to_numpy("float32")
    table = _read(out)
    assert table.column_names == ["row_id", "response"] and out["rows"] == 600
    np.testing.assert_allclose(table["response"].to_numpy()[:len(x)], _best(layout).predict(x, verbose=0)[:, 0],
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(SpecError, match="gives class probabilities, but the run is a regression"):
        predict(layout, folder, str(tmp / "p.parquet"), mode="prob")


def test_export_best_writes_a_saved_model_that_reloads_and_a_model_card(digits_run):
    import tensorflow as tf

    from mop_airflow.serving.export import export_for_serving

    tmp, layout = digits_run
    x = _digits(tmp / "serve.parquet", slice(0, 40))
    found = run_layout(layout.store.root, layout.dag_id)  # the latest reported run, without Airflow
    assert found.run_id == layout.run_id
    written = export_for_serving(found, str(tmp / "serving"), fmt="saved_model")
    assert set(written) == {"best_model.keras", "saved_model", "model_card.json"}
    served = tf.saved_model.load(str(tmp / "serving" / "saved_model"))
    np.testing.assert_allclose(served.serve(tf.constant(x)).numpy(), _best(layout).predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)
    card = json.loads((tmp / "serving" / "model_card.json").read_text())
    summary = layout.store.read_json(layout.report_uri("summary.json"))
    manifest = layout.store.read_json(layout.manifest_pointer_uri)
    assert card["config_id"] == summary["best"]["config_id"] == card["configuration"]["config_id"]
    assert card["ranked_on"]["value"] == summary["best"]["val_accuracy"] == card["metrics"]["val_accuracy"]
    assert {"train_loss", "val_loss"} <= set(card["metrics"])
    assert card["data"]["fingerprint"] == manifest["fingerprint"] and card["data"]["classes"] == list(range(10))
    assert card["data"]["inputs"][0]["shape"] == [8, 8, 1]
    assert card["versions"] == summary["versions"] and "keras" in card["exported_with"]
    with pytest.raises(StoreError, match="no run 'nope' of DAG"):
        run_layout(layout.store.root, layout.dag_id, "nope")
