"""A real run of a tiny MOP DAG through Airflow (dag.test): leaderboard, metrics, exported model.

scikit-learn's bundled digits (1,797 rows x 64 features, 10 classes), 2 shards, 2 iterations and
3 configurations (not a multiple of the shard count, so one shard's group is smaller).
"""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mop_airflow.records.layout import RunLayout
from mop_airflow.hooks.connections import open_spec_store
from mop_airflow.config import StoreSpec
from mop_airflow.store import Store
from tests.conftest import logged, make_bucket, write_dag_file

pytestmark = pytest.mark.integration

MLP = "mop_airflow.examples.mnist1d_models:mlp"


def write_digits(path, *, corrupt=False):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    columns = {f"px{i}": x[:, i].astype("float32") / 16.0 for i in range(x.shape[1])}
    if corrupt:
        columns["px3"][[5, 9]] = np.nan
    columns["digit"] = y.astype("int64")
    pq.write_table(pa.table(columns), path)


def tiny_spec(source, store_root, **schedule):
    return {
        "data": {"source": str(source), "label": "digit", "features": "px*", "classes": list(range(10)),
                 "validation": 0.2},
        "search": {"space": {"method": "grid", "params": {"model": [MLP], "learning_rate": [3e-3, 1e-2, 1e-4],
                                                          "batch_size": [32], "hparams": {"units": [32]}}},
                   "metric": "val_accuracy"},
        "schedule": {"shards": 2, "iterations": 2, "seed": 11, **schedule},
        "store": {"root": store_root},
    }


def run_dag(spec, dag_id):
    dag = write_dag_file(dag_id, spec)
    return dag.test()


def test_tiny_dag_end_to_end(airflow_db, tmp_path):
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    dag_run = run_dag(tiny_spec(source, root), "mop_e2e")
    assert dag_run.state == "success"

    store = Store(root)
    layout = RunLayout(store, "mop_e2e", dag_run.run_id)
    board = store.read_json(layout.report_uri("leaderboard.json"))
    assert board["metric"] == "val_accuracy" and board["direction"] == "max"
    rows = board["leaderboard"]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    values = [r["val_accuracy"] for r in rows]
    assert values == sorted(values, reverse=True)
    assert values[0] > 0.8  # an MLP on digits learns in 2 passes; a broken hop would sit near 0.1
    assert rows[-1]["learning_rate"] == 1e-4  # the smallest learning rate learns least in 2 passes

    metrics = json.loads(store.read_bytes(layout.report_uri("metrics.json")))
    assert len(metrics) == 3 * 2  # a row per configuration per iteration
    for row in metrics:
        assert row["complete"] and row["hops_done"] == 2
        assert sorted(row["shard_order"].split(",")) == ["0", "1"]
        assert np.isfinite(row["train_loss"]) and 0.0 <= row["val_accuracy"] <= 1.0
    import pyarrow.parquet as pq_read
    table = pq_read.read_table(store.local_path(layout.report_uri("metrics.parquet")))
    assert table.num_rows == 6 and {"train_loss", "val_loss", "val_accuracy", "elapsed_seconds"} <= set(table.column_names)
    # training loss falls from the first to the second iteration for the best configuration
    best = rows[0]["config_id"]
    curve = sorted((r for r in metrics if r["config_id"] == best), key=lambda r: r["iteration"])
    assert curve[1]["train_loss"] < curve[0]["train_loss"]

    plan = store.read_json(layout.plan_uri)
    summary = store.read_json(layout.report_uri("summary.json"))
    assert summary["visit_order"] == plan["visit_order"]  # each configuration ran exactly the planned chain
    assert summary["model_hops"] == 3 * 2 * 2
    # disk: per configuration its last 2 checkpoints plus its best evaluated one (hop 1 or 3)
    disk = summary["disk"]
    for cid in summary["visit_order"]:
        kept = sorted(int(u.rsplit("/t", 1)[1][:3]) for u in store.glob(f"{layout.run_uri}/checkpoints/{cid}/*"))
        assert kept in ([1, 2, 3], [2, 3])
    assert disk["checkpoints"] == len(store.glob(f"{layout.run_uri}/checkpoints/*/*")) <= 3 * 3
    assert 0 < disk["checkpoint_bytes"] < disk["run_bytes"] and disk["keep_checkpoints"] == 2
    assert set(disk["worker_cache_bytes"]) and all(v > 0 for v in disk["worker_cache_bytes"].values())
    png = store.read_bytes(layout.report_uri("learning_curves.png"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    import keras

    model = keras.models.load_model(store.local_path(summary["best_model_uri"]), safe_mode=True)  # runs no code
    x = pq.read_table(source).drop(["digit"]).to_pandas().to_numpy("float32")[:10]
    probabilities = model.predict(x, verbose=0)
    assert probabilities.shape == (10, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-4)


def test_bad_data_stops_the_run_before_anything_is_written(airflow_db, tmp_path):
    source = tmp_path / "digits.parquet"
    write_digits(source, corrupt=True)
    root = f"file://{tmp_path / 'store'}"
    dag_run = run_dag(tiny_spec(source, root), "mop_e2e_bad")
    assert dag_run.state == "failed"
    shard = dag_run.get_task_instance("shard")
    assert (shard.state, shard.try_number) == ("failed", 1)  # bad data is not retried: a retry would repeat it
    store_dir = tmp_path / "store"
    written = [p for p in store_dir.rglob("*") if p.is_file()] if store_dir.exists() else []
    assert written == []  # no shard, no plan, no checkpoint


def test_an_invalid_trigger_conf_fails_the_run_at_once_with_the_validation_message(airflow_db, tmp_path, capfd,
                                                                                    caplog):
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    dag = write_dag_file("mop_e2e_bad_conf", tiny_spec(source, root))
    conf = {"search": {"space": {"method": "grid", "params": {"model": [MLP], "learning_rate": [-0.1]}}}}
    capfd.readouterr()
    dag_run = dag.test(run_conf=conf)
    assert dag_run.state == "failed"
    preflight = dag_run.get_task_instance("preflight")
    assert (preflight.state, preflight.try_number) == ("failed", 1)  # not retried: a retry would repeat it
    assert "search.space.params.learning_rate=-0.1: must be a number > 0. Fix: fix the value of learning_rate" in \
        logged(capfd, caplog)
    assert not (tmp_path / "store").exists()  # nothing written


def test_tiny_dag_with_the_store_on_s3(airflow_db, tmp_path, s3_endpoint, monkeypatch):
    """Shards, checkpoints and reports travel through an S3 endpoint; credentials come from a connection."""
    make_bucket(s3_endpoint, "mop-e2e")
    conn = {"conn_type": "aws", "login": "test", "password": "test", "extra": {"endpoint_url": s3_endpoint}}
    monkeypatch.setenv("AIRFLOW_CONN_MOP_S3_E2E", json.dumps(conn))
    local = tmp_path / "digits.parquet"
    write_digits(local)
    store = open_spec_store(StoreSpec(root="s3://mop-e2e/runs", conn_id="mop_s3_e2e"))
    store.put_file(str(local), "s3://mop-e2e/data/digits.parquet")  # the input lives in the bucket too
    spec = tiny_spec("s3://mop-e2e/data/digits.parquet", "s3://mop-e2e/runs", iterations=1)
    spec["data"]["conn_id"] = "mop_s3_e2e"
    spec["store"]["conn_id"] = "mop_s3_e2e"
    spec["store"]["cache_dir"] = str(tmp_path / "cache")
    dag_run = run_dag(spec, "mop_e2e_s3")
    assert dag_run.state == "success"
    layout = RunLayout(store, "mop_e2e_s3", dag_run.run_id)
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    assert len(board) == 3 and board[0]["val_accuracy"] > 0.5
    checkpoints = store.glob(layout.checkpoint_uri("*", 1))
    assert len(checkpoints) == 3  # every configuration's state after hop 1 is in the bucket
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(cached) == 3  # two shards and the validation set, copied to local disk once


def test_an_s3_outage_during_the_hops_is_waited_for_and_the_run_ends_as_an_undisturbed_one(
        airflow_db, tmp_path, restartable_s3, monkeypatch, capfd, caplog):
    """The endpoint stops answering for 6 s once the first hop has saved; the store calls wait."""
    import threading

    endpoint = restartable_s3.endpoint
    make_bucket(endpoint, "mop-outage-e2e")
    conn = {"conn_type": "aws", "login": "test", "password": "test", "extra": {"endpoint_url": endpoint}}
    monkeypatch.setenv("AIRFLOW_CONN_MOP_S3_OUTAGE", json.dumps(conn))
    store = open_spec_store(StoreSpec(root="s3://mop-outage-e2e/runs", conn_id="mop_s3_outage"))
    write_digits(tmp_path / "digits.parquet")
    spec = tiny_spec(str(tmp_path / "digits.parquet"), "s3://mop-outage-e2e/runs", iterations=2)
    spec["store"].update(conn_id="mop_s3_outage", cache_dir=str(tmp_path / "cache"),
                         # one botocore attempt per call: its own retries (up to ~15 s) would otherwise
                         # bridge the outage before the store's retries, which are under test, see it
                         storage_options={"config_kwargs": {"retries": {"max_attempts": 1}}})

    undisturbed = run_dag(spec, "mop_s3_calm")
    assert undisturbed.state == "success"

    outages = []

    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")

    def cut_once_a_hop_saved():  # listed afresh each time: no filesystem cache between the polls
        while not any("/hops/" in o["Key"] and o["Key"].endswith("/t000.json") for o in client.list_objects_v2(
                Bucket="mop-outage-e2e", Prefix="runs/mop_s3_outage/").get("Contents", [])):
            threading.Event().wait(0.2)
        outages.append(restartable_s3.outage(6.0))

    watcher = threading.Thread(target=cut_once_a_hop_saved, daemon=True)
    watcher.start()
    capfd.readouterr()
    disturbed = run_dag(spec, "mop_s3_outage")
    watcher.join(timeout=5)
    outages[0].join()
    assert disturbed.state == "success"
    assert f"the store at {endpoint} did not answer" in logged(capfd, caplog)  # a store call waited
    assert all(ti.state in ("success", "skipped") for ti in disturbed.get_task_instances())

    boards = [store.read_json(RunLayout(store, dag_id, run.run_id).report_uri("leaderboard.json"))["leaderboard"]
              for dag_id, run in (("mop_s3_calm", undisturbed), ("mop_s3_outage", disturbed))]
    assert [(r["config_id"], r["val_accuracy"]) for r in boards[1]] == \
        [(r["config_id"], pytest.approx(r["val_accuracy"], abs=1e-6)) for r in boards[0]]
    layout = RunLayout(store, "mop_s3_outage", disturbed.run_id)
    import hashlib

    kept = set(store.glob(f"{layout.run_uri}/checkpoints/*/*"))
    assert len(kept) >= 3 * 2  # every configuration's last two
    for uri in store.glob(layout.hops_glob):  # no kept checkpoint was corrupted: each matches its record
        record = store.read_json(uri)
        if record["checkpoint"] in kept:
            assert hashlib.sha256(store.read_bytes(record["checkpoint"])).hexdigest() == record["checkpoint_sha256"]


def _example_spec(dag_file: str, data: dict, store_root: str) -> dict:
    """The example DAG file's spec with its data in a temp folder, 1 iteration and the store under tmp."""
    import importlib.util

    from mop_airflow.config import MopSpec

    module_spec = importlib.util.spec_from_file_location(f"example_{dag_file}", f"dags/{dag_file}.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    spec = MopSpec.from_dict(module.spec).to_dict()
    return {**spec, "data": data, "schedule": {**spec["schedule"], "iterations": 1},
            "store": {"root": store_root}}


def test_the_image_example_trains_a_cnn_on_a_tensor_column_with_classes_found(airflow_db, tmp_path):
    from mop_airflow.examples.sklearn_data import digits_data_spec, write_digits as write_digit_images

    write_digit_images(str(tmp_path))
    root = f"file://{tmp_path / 'store'}"
    data = {**digits_data_spec(str(tmp_path)), "slice_mb": 1e-6}  # one scatter task per file
    dag_run = run_dag(_example_spec("mop_digits", data, root), "mop_e2e_digits")
    assert dag_run.state == "success"
    store = Store(root)
    layout = RunLayout(store, "mop_e2e_digits", dag_run.run_id)
    manifest = store.read_json(layout.manifest_pointer_uri)
    assert manifest["classes"] == list(range(10)) and manifest["inputs"][0]["shape"] == [8, 8, 1]
    slices = store.read_json(layout.sharding_plan_uri)["slices"]
    assert len(slices) > 1 and all(len(shard["parts"]) == len(slices) for shard in manifest["shards"])
    assert sum(shard["rows"] for shard in manifest["shards"]) + manifest["validation"]["rows"] == 1797
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    assert len(board) == 4 and board[0]["val_accuracy"] > 0.7  # one pass over 8x8 digits; chance is 0.1

    import keras

    model = keras.models.load_model(store.local_path(store.read_json(layout.report_uri("summary.json"))
                                                     ["best_model_uri"]))
    assert model.input_shape == (None, 8, 8, 1)


def test_the_regression_example_ranks_by_validation_mae(airflow_db, tmp_path):
    from mop_airflow.examples.sklearn_data import friedman_data_spec, write_friedman

    write_friedman(str(tmp_path))
    root = f"file://{tmp_path / 'store'}"
    dag_run = run_dag(_example_spec("mop_friedman", friedman_data_spec(str(tmp_path)), root), "mop_e2e_friedman")
    assert dag_run.state == "success"
    store = Store(root)
    layout = RunLayout(store, "mop_e2e_friedman", dag_run.run_id)
    board = store.read_json(layout.report_uri("leaderboard.json"))
    assert board["metric"] == "val_mae" and board["direction"] == "min"
    values = [row["val_mae"] for row in board["leaderboard"]]
    assert values == sorted(values) and len(values) == 4
    # Friedman #1's target has a standard deviation near 5; predicting its mean gives an MAE near 4
    assert values[0] < 3.5


def test_the_image_folder_example_trains_on_png_class_folders_and_scores_a_folder(airflow_db, tmp_path):
    from mop_airflow.examples.sklearn_data import digit_images_data_spec, write_digit_images
    from mop_airflow.serving.predict import predict

    folder = write_digit_images(str(tmp_path))
    root = f"file://{tmp_path / 'store'}"
    dag_run = run_dag(_example_spec("mop_digit_images", digit_images_data_spec(str(tmp_path)), root),
                      "mop_e2e_digit_images")
    assert dag_run.state == "success"
    store = Store(root)
    layout = RunLayout(store, "mop_e2e_digit_images", dag_run.run_id)
    manifest = store.read_json(layout.manifest_pointer_uri)
    assert manifest["classes"] == [str(d) for d in range(10)]  # the folder names, sorted
    assert manifest["inputs"][0]["shape"] == [8, 8, 1] and manifest["inputs"][0]["color_mode"] == "grayscale"
    assert sum(shard["rows"] for shard in manifest["shards"]) + manifest["validation"]["rows"] == 1797
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    assert len(board) == 4 and board[0]["val_accuracy"] > 0.7  # one pass over 8x8 digits; chance is 0.1

    # Scoring a folder of images: one row per file, keyed by row_id and the file's path.
    threes = sorted(os.listdir(os.path.join(folder, "3")))
    out = predict(layout, os.path.join(folder, "3"), str(tmp_path / "threes.parquet"), mode="response")
    scores = pq.read_table(out["uri"].removeprefix("file://"))
    assert scores.column_names == ["row_id", "path", "response"] and out["rows"] == len(threes) == 183
    assert scores["row_id"].to_pylist() == list(range(183)) and scores["path"].to_pylist() == threes
    assert np.mean(np.asarray(scores["response"].to_pylist()) == "3") > 0.7
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "ok.png").write_bytes(open(os.path.join(folder, "3", threes[0]), "rb").read())
    (broken / "cut.png").write_bytes(open(os.path.join(folder, "3", threes[1]), "rb").read()[:40])
    from mop_airflow.errors import DataValidationError

    with pytest.raises(DataValidationError, match=r"column 'image': 1 image\(s\) cannot be decoded: not an image, or "
                                                  r"truncated \(file cut.png\); replace or remove them"):
        predict(layout, str(broken), str(tmp_path / "broken.parquet"), mode="response")
    assert not (tmp_path / "broken.parquet").exists()


@pytest.mark.slow
def test_the_image_folder_example_reads_its_folders_from_an_s3_prefix(airflow_db, tmp_path, s3_endpoint, monkeypatch):
    import s3fs

    from mop_airflow.examples.sklearn_data import digit_images_data_spec, write_digit_images

    make_bucket(s3_endpoint, "mop-images-e2e")
    conn = {"conn_type": "aws", "login": "test", "password": "test", "extra": {"endpoint_url": s3_endpoint}}
    monkeypatch.setenv("AIRFLOW_CONN_MOP_S3_IMAGES", json.dumps(conn))
    folder = write_digit_images(str(tmp_path))
    s3fs.S3FileSystem(key="test", secret="test", client_kwargs={"endpoint_url": s3_endpoint}).put(
        folder, "mop-images-e2e/digit_images", recursive=True)
    data = {**digit_images_data_spec(), "source": "s3://mop-images-e2e/digit_images/", "conn_id": "mop_s3_images"}
    spec = _example_spec("mop_digit_images", data, "s3://mop-images-e2e/runs")
    spec["store"].update(conn_id="mop_s3_images", cache_dir=str(tmp_path / "cache"))
    dag_run = run_dag(spec, "mop_e2e_digit_images_s3")
    assert dag_run.state == "success"
    store = open_spec_store(StoreSpec(root="s3://mop-images-e2e/runs", conn_id="mop_s3_images"))
    layout = RunLayout(store, "mop_e2e_digit_images_s3", dag_run.run_id)
    manifest = store.read_json(layout.manifest_pointer_uri)
    assert manifest["classes"] == [str(d) for d in range(10)]
    assert sum(shard["rows"] for shard in manifest["shards"]) + manifest["validation"]["rows"] == 1797
    plan = store.read_json(layout.sharding_plan_uri)
    assert plan["listing"]["files"][0]["uri"] == "s3://mop-images-e2e/digit_images/0/0000.png"
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    assert len(board) == 4 and board[0]["val_accuracy"] > 0.7
