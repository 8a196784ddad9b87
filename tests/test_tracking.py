"""TensorBoard event files and MLflow runs of a finished run, from a report written by hand.

Two configurations over 2 iterations: c000 finished, c001 pruned after its first iteration (so it
has one evaluation); the numbers are made up and easy to check.
"""

import json
import socket

import pytest

from mop_airflow.records.layout import RunLayout
from mop_airflow.records import RunRecord
from mop_airflow.store import Store
from mop_airflow.results.tracking import config_params, track_run

MLP, CNN = "my_models:mlp", "my_models:cnn"
CONFIGS = [
    {"config_id": "c000-aaaaaa", "model": MLP, "optimizer": "adam", "optimizer_params": {"learning_rate": 0.01},
     "batch_size": 32, "epochs_per_hop": 1, "hparams": {"units": 64, "dropout": 0.2}, "loss": "x", "metrics": []},
    {"config_id": "c001-bbbbbb", "model": CNN, "optimizer": "sgd",
     "optimizer_params": {"learning_rate": 0.003, "momentum": 0.9}, "batch_size": 128, "epochs_per_hop": 1,
     "hparams": {"units": 32, "dropout": 0.0}, "loss": "x", "metrics": []},
]
# (config, iteration) -> train_loss, train_accuracy, val_loss, val_accuracy
POINTS = {("c000-aaaaaa", 0): (1.5, 0.5, 1.25, 0.625), ("c000-aaaaaa", 1): (0.75, 0.75, 0.5, 0.875),
          ("c001-bbbbbb", 0): (2.0, 0.25, 1.75, 0.375)}


def rows():
    return [{"config_id": cid, "model": "m", "iteration": it, "hops_done": 2, "complete": True, "train_loss": tl,
             "train_accuracy": ta, "val_loss": vl, "val_accuracy": va, "steps": 10, "train_seconds": 3.0,
             "elapsed_seconds": 9.0, "shard_order": "0,1"} for (cid, it), (tl, ta, vl, va) in POINTS.items()]


BOARD = [
    {"rank": 1, "config_id": "c000-aaaaaa", "val_accuracy": 0.875, "status": "finished", "outcome": "finished"},
    {"rank": 2, "config_id": "c001-bbbbbb", "val_accuracy": 0.375, "status": "pruned",
     "outcome": "pruned at rung 0: ranked below the top 1"},
]


@pytest.fixture
def finished_run(tmp_path, monkeypatch):
    """A run whose report task has written its metrics, leaderboard and best model."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    store = Store(f"file://{tmp_path / 'store'}")
    layout = RunLayout(store, "mop_track", "manual__2026-01-01T00:00:00+00:00")
    spec = {"search": {"metric": "val_accuracy", "direction": "max", "space": {"method": "grid"}},
            "schedule": {"shards": 2, "iterations": 2, "seed": 3}}
    run = RunRecord("mop_track", layout.run_id, "2026-01-01T00:00:00+00:00", spec, CONFIGS)
    store.write_json(layout.report_uri("metrics.json"), rows())
    store.write_json(layout.report_uri("leaderboard.json"), {"metric": "val_accuracy", "leaderboard": BOARD})
    store.write_bytes(layout.report_uri("best_model.keras"), b"not really a zip")
    return layout, run, {"best_model_uri": layout.report_uri("best_model.keras")}


def read_events(folder):
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util import tensor_util

    events = EventAccumulator(str(folder), size_guidance={TENSORS: 0})
    events.Reload()
    scalars = {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
               for tag in events.Tags()["tensors"] if not tag.startswith("_hparams_")}
    return scalars, events.PluginTagToContent("hparams")


def test_tensorboard_files_hold_each_configurations_scalars_and_the_hparams_table(finished_run, tmp_path):
    from tensorboard.plugins.hparams import plugin_data_pb2

    layout, run, summary = finished_run
    result = track_run(layout, run, summary)
    assert result == {"tensorboard": f"{layout.run_uri}/tensorboard", "mlflow_run_id": None, "warnings": []}
    logdir = tmp_path / "store" / "mop_track" / "manual__2026-01-01T00_00_00_00_00" / "tensorboard"
    assert sorted(p.name for p in logdir.iterdir() if p.is_dir()) == ["c000-aaaaaa", "c001-bbbbbb"]

    scalars, hparams = read_events(logdir / "c000-aaaaaa")
    assert scalars == {"train_loss": [(0, 1.5), (1, 0.75)], "train_accuracy": [(0, 0.5), (1, 0.75)],
                       "val_loss": [(0, 1.25), (1, 0.5)], "val_accuracy": [(0, 0.625), (1, 0.875)]}
    session = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"])
    values = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
              for k, v in session.session_start_info.hparams.items()}
    assert values == {"model": MLP, "optimizer": "adam", "learning_rate": 0.01, "batch_size": 32,
                      "epochs_per_hop": 1, "hparams.units": 64, "hparams.dropout": 0.2}
    assert session.session_start_info.group_name == "c000-aaaaaa"

    scalars, hparams = read_events(logdir / "c001-bbbbbb")  # pruned after one iteration: one point each
    assert scalars["val_accuracy"] == [(0, 0.375)] and scalars["train_loss"] == [(0, 2.0)]
    session = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/session_start_info"])
    assert session.session_start_info.hparams["optimizer_params.momentum"].number_value == 0.9

    _, hparams = read_events(logdir)  # the dashboard's columns: every hyperparameter, the ranking metric first
    experiment = plugin_data_pb2.HParamsPluginData.FromString(hparams["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == ["val_accuracy", "val_loss", "train_accuracy",
                                                             "train_loss"]
    columns = {h.name: [v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for v in h.domain_discrete.values]
               for h in experiment.hparam_infos}
    assert columns["model"] == [CNN, MLP] and columns["learning_rate"] == [0.003, 0.01]
    assert columns["batch_size"] == [32, 128] and set(columns) == {*config_params(CONFIGS[0]),
                                                                   "optimizer_params.momentum"}

    track_run(layout, run, summary)  # a retried report task replaces the files: still one event file per folder
    assert len(list((logdir / "c000-aaaaaa").iterdir())) == 1 and read_events(logdir / "c000-aaaaaa")[0] == \
        {"train_loss": [(0, 1.5), (1, 0.75)], "train_accuracy": [(0, 0.5), (1, 0.75)],
         "val_loss": [(0, 1.25), (1, 0.5)], "val_accuracy": [(0, 0.625), (1, 0.875)]}


@pytest.mark.integration
def test_tensorboard_serves_the_hparams_table_of_configurations_against_final_metrics(finished_run, tmp_path):
    """``tensorboard --logdir <run>/tensorboard``, asked what its HParams dashboard shows."""
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    layout, run, summary = finished_run
    logdir = layout.store.local_path(track_run(layout, run, summary)["tensorboard"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).with_name("tensorboard")), "--logdir", logdir, "--host",
                               "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    query = {"experimentName": "", "startIndex": 0, "sliceSize": 10,
             "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
             "colParams": [{"metric": {"tag": "val_accuracy", "group": ""}}, {"hparam": "model"}]}
    try:
        deadline, groups = time.monotonic() + 60, []
        while len(groups) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/data/plugin/hparams/session_groups",
                                                 json.dumps(query).encode(), {"Content-Type": "application/json"})
                groups = json.load(urllib.request.urlopen(request, timeout=5))["sessionGroups"]
            except OSError:
                continue  # not listening yet
    finally:
        server.terminate()
        server.wait(timeout=10)
    table = {g["name"]: (g["hparams"]["model"], g["hparams"]["learning_rate"],
                         {m["name"]["tag"]: m["value"] for m in g["metricValues"]}) for g in groups}
    assert table == {
        "c000-aaaaaa": (MLP, 0.01, {"val_accuracy": 0.875, "val_loss": 0.5, "train_accuracy": 0.75, "train_loss": 0.75}),
        "c001-bbbbbb": (CNN, 0.003, {"val_accuracy": 0.375, "val_loss": 1.75, "train_accuracy": 0.25,
                                     "train_loss": 2.0}),
    }


@pytest.mark.parametrize("backend", ["file", "sqlite"])
def test_mlflow_gets_a_parent_run_and_a_child_per_configuration(finished_run, tmp_path, monkeypatch, backend):
    from mlflow import MlflowClient

    layout, run, summary = finished_run
    if backend == "file":
        uri = f"file:{tmp_path / 'mlruns'}"
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks file stores to opt in
    else:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        # a database store keeps artifacts in ./mlruns unless the experiment says where
        MlflowClient(uri).create_experiment("mop_track", artifact_location=(tmp_path / "artifacts").as_uri())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    result = track_run(layout, run, summary)
    assert result["warnings"] == [] and result["mlflow_run_id"]

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("mop_track")  # named after the DAG
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    parent = client.get_run(result["mlflow_run_id"])
    assert set(runs) == {parent.info.run_name, "c000-aaaaaa", "c001-bbbbbb"}
    assert parent.data.tags["mop.best_config_id"] == "c000-aaaaaa" and parent.info.status == "FINISHED"
    assert parent.data.metrics == {"best_val_accuracy": 0.875}
    assert parent.data.params["schedule.shards"] == "2" and parent.data.params["metric"] == "val_accuracy"

    best, pruned = runs["c000-aaaaaa"], runs["c001-bbbbbb"]
    for child in (best, pruned):
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert best.data.params == {"model": MLP, "optimizer": "adam", "learning_rate": "0.01", "batch_size": "32",
                                "epochs_per_hop": "1", "hparams.units": "64", "hparams.dropout": "0.2"}
    assert pruned.data.params["optimizer_params.momentum"] == "0.9"
    history = {name: [(m.step, m.value) for m in sorted(client.get_metric_history(best.info.run_id, name),
                                                         key=lambda m: m.step)]
               for name in ("train_loss", "val_accuracy")}
    assert history == {"train_loss": [(0, 1.5), (1, 0.75)], "val_accuracy": [(0, 0.625), (1, 0.875)]}
    assert [(m.step, m.value) for m in client.get_metric_history(pruned.info.run_id, "val_accuracy")] == \
        [(0, 0.375)]
    assert (best.info.status, pruned.info.status) == ("FINISHED", "KILLED")
    assert pruned.data.tags["mop.outcome"] == "pruned at rung 0: ranked below the top 1"

    artifacts = sorted(a.path for a in client.list_artifacts(parent.info.run_id))
    assert artifacts == ["best_model", "leaderboard.json"]
    model = client.download_artifacts(parent.info.run_id, "best_model/best_model.keras", str(tmp_path / "dl"))
    assert open(model, "rb").read() == b"not really a zip"

    again = track_run(layout, run, summary)  # a retried report task logs nothing twice
    assert again["mlflow_run_id"] == parent.info.run_id
    assert len(client.search_runs([experiment.experiment_id])) == 3


def test_without_a_tracking_uri_nothing_goes_to_mlflow(finished_run, tmp_path, monkeypatch):
    layout, run, summary = finished_run
    monkeypatch.chdir(tmp_path)
    result = track_run(layout, run, summary)
    assert result["mlflow_run_id"] is None and result["warnings"] == []
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlflow.db").exists()


def test_an_mlflow_server_that_is_down_is_a_warning_and_tensorboard_is_still_written(finished_run, monkeypatch):
    layout, run, summary = finished_run
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:secret@127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    result = track_run(layout, run, summary)
    assert result["mlflow_run_id"] is None and result["tensorboard"]
    [warning] = result["warnings"]
    assert warning.startswith(f"nothing logged to MLflow at http://127.0.0.1:{port}: ") and "secret" not in warning


def test_mlflow_not_installed_is_a_warning_naming_the_extra(finished_run, monkeypatch):
    import sys

    layout, run, summary = finished_run
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:/nowhere")
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow raises ImportError
    result = track_run(layout, run, summary)
    assert result["mlflow_run_id"] is None and result["tensorboard"]
    assert result["warnings"] == ["MLFLOW_TRACKING_URI is set (file:/nowhere) but mlflow is not installed: nothing "
                                  "logged to MLflow. Fix: pip install 'mop-airflow[mlflow]' on the workers"]


def test_a_report_without_metrics_is_a_warning_not_an_error(tmp_path):
    store = Store(f"file://{tmp_path / 'store'}")
    layout = RunLayout(store, "mop_track", "r1")
    run = RunRecord("mop_track", "r1", "", {"search": {"metric": "val_loss", "direction": "min"}}, [])
    result = track_run(layout, run)
    assert result["tensorboard"] is None and result["warnings"][0].startswith(
        "nothing tracked: the report's metrics could not be read: StoreError: not found in the store")
    assert json.dumps(result)  # goes to XCom as it is


@pytest.mark.integration
def test_a_dag_run_ends_with_tensorboard_files_and_mlflow_runs_of_its_report(airflow_db, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from tests.conftest import write_dag_file
    from tests.test_end_to_end import tiny_spec, write_digits

    write_digits(tmp_path / "digits.parquet")
    spec = tiny_spec(tmp_path / "digits.parquet", f"file://{tmp_path / 'store'}", iterations=1)
    spec["search"]["space"]["params"]["learning_rate"] = [1e-2, 1e-3]
    uri = f"file:{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "mop tracking e2e")
    dag_run = write_dag_file("mop_track_e2e", spec).test()
    assert dag_run.state == "success"

    store = Store(f"file://{tmp_path / 'store'}")
    layout = RunLayout(store, "mop_track_e2e", dag_run.run_id)
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    logdir = store.local_path(f"{layout.run_uri}/tensorboard")
    for row in board:
        scalars, _ = read_events(f"{logdir}/{row['config_id']}")
        assert scalars["val_accuracy"] == [(0, pytest.approx(row["val_accuracy"]))]

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("mop tracking e2e")
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if r.data.tags["mop.role"] == "parent"]
    assert parent.data.tags["mop.run_id"] == dag_run.run_id
    assert parent.data.tags["mop.best_config_id"] == board[0]["config_id"]
    assert sorted(r.info.run_name for r in runs if r.data.tags["mop.role"] == "configuration") == \
        sorted(row["config_id"] for row in board)
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "best_model")] == ["best_model/best_model.keras"]
