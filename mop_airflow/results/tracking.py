"""A finished run's results in the experiment trackers people already use: TensorBoard and MLflow.

Both are written once, at the end of the run, from the report's own files (``metrics.json``: per
configuration and iteration the training and validation metrics; ``leaderboard.json``: how each
configuration ended), so they show exactly what the report shows.

- **TensorBoard**: event files in the store under ``<run>/tensorboard/<config_id>/``, one folder per
  configuration: a scalar per metric and iteration (step = iteration, from 0, as Keras counts epochs)
  and the configuration's hyperparameters for the HParams dashboard, plus the dashboard's columns
  (hyperparameters and metrics) in ``<run>/tensorboard/`` itself. Written with ``tf.summary`` in a
  local folder, then uploaded through the store, so an ``s3://`` store works as ``file://`` does.
- **MLflow**, when ``mlflow`` is installed and ``MLFLOW_TRACKING_URI`` is set: one parent run per DAG
  run, a child run per configuration (parameters, metric history with step = iteration, outcome),
  and the best model and the leaderboard as artifacts of the parent.

Tracking never fails a finished model selection: :func:`track_run` turns every failure into a
warning it returns (the operator logs them). TensorFlow and MLflow are imported inside functions.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
import time
from typing import Any, Iterable, Mapping, Sequence

from mop_airflow.records.layout import RunLayout
from mop_airflow.records import RunRecord
from mop_airflow.store import safe_segment

# A configuration's MLflow status from its leaderboard status.
_MLFLOW_STATUS = {"finished": "FINISHED", "pruned": "KILLED", "failed": "FAILED", "diverged": "FAILED"}


def tensorboard_uri(layout: RunLayout, *parts: str) -> str:
    """``<run>/tensorboard/...``: give this folder to ``tensorboard --logdir``."""
    return posixpath.join(layout.run_uri, "tensorboard", *(safe_segment(p) for p in parts))


def config_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration's hyperparameters under the names the search space gives them."""
    optimizer_params = dict(config.get("optimizer_params") or {})
    params: dict[str, Any] = {"model": config["model"], "optimizer": config["optimizer"],
                              "learning_rate": optimizer_params.pop("learning_rate", None),
                              "batch_size": config["batch_size"], "epochs_per_hop": config["epochs_per_hop"]}
    params.update({f"optimizer_params.{k}": v for k, v in sorted(optimizer_params.items())})
    params.update({f"hparams.{k}": v for k, v in sorted((config.get("hparams") or {}).items())})
    return params


def metric_names(rows: Sequence[Mapping[str, Any]], ranking: str) -> list[str]:
    """The metrics of the metrics table: the ranking metric first, then validation, then training."""
    names = {k for row in rows for k in row if (k.startswith("val_") or k.startswith("train_"))
             and k != "train_seconds"}
    return sorted(names, key=lambda n: (n != ranking, not n.startswith("val_"), n))


def history(rows: Sequence[Mapping[str, Any]], config_id: str,
            names: Iterable[str]) -> list[tuple[str, int, float]]:
    """``(metric, iteration, value)`` of one configuration, in iteration order; missing values left out."""
    points = []
    for row in sorted((r for r in rows if r["config_id"] == config_id), key=lambda r: r["iteration"]):
        for name in names:
            value = row.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                points.append((name, int(row["iteration"]), float(value)))
    return points


def _hparam_value(value: Any) -> bool | int | float | str:
    """TensorBoard's HParams take booleans, numbers and strings; anything else is shown as JSON."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def write_tensorboard(layout: RunLayout, run: RunRecord, rows: Sequence[Mapping[str, Any]]) -> tuple[str, bool]:
    """Write the run's TensorBoard event files to ``<run>/tensorboard/``; return the folder and whether
    the HParams dashboard's data is in it (it needs the ``tensorboard`` package)."""
    import tensorflow as tf  # noqa: PLC0415 - only the report task writes these

    try:
        from tensorboard.plugins.hparams import api as hp  # noqa: PLC0415
    except ImportError:
        hp = None
    names = metric_names(rows, run.metric)
    store, root = layout.store, tensorboard_uri(layout)
    with tempfile.TemporaryDirectory(prefix="mop-tensorboard-") as local:
        for config in run.configs:
            cid = config["config_id"]
            writer = tf.summary.create_file_writer(os.path.join(local, safe_segment(cid)))
            with writer.as_default():
                if hp is not None:
                    hp.hparams({k: _hparam_value(v) for k, v in config_params(config).items()}, trial_id=cid)
                for name, step, value in history(rows, cid, names):
                    tf.summary.scalar(name, value, step=step)
            writer.close()
        if hp is not None:
            writer = tf.summary.create_file_writer(local)
            with writer.as_default():
                hp.hparams_config(hparams=_hparam_columns(hp, run.configs),
                                  metrics=[hp.Metric(name, display_name=name) for name in names])
            writer.close()
        store.delete_tree(root)  # a retried report task replaces the files instead of adding a second copy
        for folder, _, files in os.walk(local):
            for name in sorted(files):
                relative = os.path.relpath(os.path.join(folder, name), local).split(os.sep)
                store.put_file(os.path.join(folder, name), posixpath.join(root, *relative))
    return root, hp is not None


def _hparam_columns(hp: Any, configs: Sequence[Mapping[str, Any]]) -> list[Any]:
    """One HParams column per hyperparameter, with the values the run tried as its domain."""
    values: dict[str, set[Any]] = {}
    for config in configs:
        for name, value in config_params(config).items():
            values.setdefault(name, set()).add(_hparam_value(value))
    columns = []
    for name, seen in values.items():
        try:
            domain = hp.Discrete(sorted(seen))
        except (TypeError, ValueError):  # values of mixed types: TensorBoard infers the domain
            domain = None
        columns.append(hp.HParam(name, domain))
    return columns


def mlflow_tracking_uri() -> str | None:
    """Where MLflow logs to: ``MLFLOW_TRACKING_URI``, as for every MLflow client; None turns MLflow off."""
    return os.environ.get("MLFLOW_TRACKING_URI") or None


def log_mlflow(layout: RunLayout, run: RunRecord, rows: Sequence[Mapping[str, Any]],
               board: Sequence[Mapping[str, Any]], *, tracking_uri: str,
               best_model_uri: str | None = None) -> str:
    """Log the run to MLflow and return the parent run's id.

    The experiment is ``MLFLOW_EXPERIMENT_NAME`` if set, else the DAG id. A parent run already logged
    for this DAG run is kept (a retried report task logs nothing twice); one a crash left unfinished
    is deleted and logged again.
    """
    from mlflow import MlflowClient  # noqa: PLC0415
    from mlflow.entities import Metric, Param, RunTag  # noqa: PLC0415

    client = MlflowClient(tracking_uri=tracking_uri)
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or run.dag_id
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    found = client.search_runs([experiment_id], filter_string=(
        f"tags.`mop.dag_id` = '{_quoted(run.dag_id)}' and tags.`mop.run_id` = '{_quoted(run.run_id)}'"))
    for old in found:
        if old.data.tags.get("mop.role") == "parent" and old.info.status == "FINISHED":
            return old.info.run_id
    for old in found:
        client.delete_run(old.info.run_id)

    names = metric_names(rows, run.metric)
    ours = {"mop.dag_id": run.dag_id, "mop.run_id": run.run_id}
    best = board[0]
    parent = client.create_run(experiment_id, run_name=f"{run.dag_id} {run.run_id}", tags={
        **ours, "mop.role": "parent", "mop.best_config_id": best["config_id"], "mop.store": layout.run_uri})
    parent_id = parent.info.run_id
    schedule = run.spec.get("schedule", {})
    _log_batch(client, parent_id, Metric, Param, RunTag, params={
        "metric": run.metric, "direction": run.direction, "configurations": len(run.configs),
        "search": run.spec["search"]["space"].get("method"),
        **{f"schedule.{k}": schedule[k] for k in ("shards", "iterations", "seed") if k in schedule}},
        metrics=[(f"best_{run.metric}", 0, best[run.metric])] if isinstance(best.get(run.metric), (int, float)) else [])
    by_id = {row["config_id"]: row for row in board}
    for config in run.configs:
        cid = config["config_id"]
        entry = by_id.get(cid, {})
        child = client.create_run(experiment_id, run_name=cid, tags={
            **ours, "mop.role": "configuration", "mlflow.parentRunId": parent_id, "mop.config_id": cid,
            "mop.rank": str(entry.get("rank")), "mop.outcome": str(entry.get("outcome", ""))})
        _log_batch(client, child.info.run_id, Metric, Param, RunTag, params=config_params(config),
                   metrics=history(rows, cid, names))
        client.set_terminated(child.info.run_id, status=_MLFLOW_STATUS.get(entry.get("status"), "FINISHED"))
    with tempfile.TemporaryDirectory(prefix="mop-mlflow-") as local:
        board_path = os.path.join(local, "leaderboard.json")
        with open(board_path, "w") as handle:
            json.dump({"metric": run.metric, "direction": run.direction, "leaderboard": list(board)}, handle,
                      indent=2, default=str)
        client.log_artifact(parent_id, board_path)
        if best_model_uri:
            model_path = os.path.join(local, posixpath.basename(best_model_uri))
            layout.store.get_file(best_model_uri, model_path)
            client.log_artifact(parent_id, model_path, artifact_path="best_model")
    client.set_terminated(parent_id, status="FINISHED")
    return parent_id


def _redacted(text: str, uri: str) -> str:
    """``text`` without the user and password ``uri`` may carry (``https://user:secret@host``)."""
    host = uri.partition("://")[2].partition("/")[0]
    return text.replace(host.rsplit("@", 1)[0] + "@", "") if "@" in host else text


def _quoted(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("'", "\\'")


def _log_batch(client: Any, run_id: str, Metric: Any, Param: Any, RunTag: Any, *,  # noqa: N803
               params: Mapping[str, Any], metrics: Sequence[tuple[str, int, float]]) -> None:
    """Params and metrics in batches within MLflow's limits (100 params, 1000 metrics a call)."""
    now = int(time.time() * 1000)
    params_list = [Param(k, str(v)) for k, v in params.items()]
    metric_list = [Metric(name, value, now, step) for name, step, value in metrics]
    for start in range(0, len(params_list), 100):
        client.log_batch(run_id, params=params_list[start:start + 100])
    for start in range(0, len(metric_list), 1000):
        client.log_batch(run_id, metrics=metric_list[start:start + 1000])


def track_run(layout: RunLayout, run: RunRecord, summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """TensorBoard files for the run and, when configured, its MLflow runs; never raises.

    Returns ``{"tensorboard": folder or None, "mlflow_run_id": parent run id or None, "warnings": [...]}``.
    """
    result: dict[str, Any] = {"tensorboard": None, "mlflow_run_id": None, "warnings": []}
    warn = result["warnings"].append
    try:
        rows = layout.store.read_json(layout.report_uri("metrics.json"))
        board = layout.store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    except Exception as exc:  # noqa: BLE001
        warn(f"nothing tracked: the report's metrics could not be read: {type(exc).__name__}: {exc}")
        return result
    try:
        result["tensorboard"], with_hparams = write_tensorboard(layout, run, rows)
        if not with_hparams:
            warn("TensorBoard scalars written without the HParams table: the tensorboard package is not "
                 "installed. Fix: pip install 'mop-airflow[tensorboard]' on the workers")
    except Exception as exc:  # noqa: BLE001 - the model selection itself has finished
        warn(f"TensorBoard files not written: {type(exc).__name__}: {exc}")
    uri = mlflow_tracking_uri()
    if uri is None:
        return result
    try:
        import mlflow  # noqa: F401, PLC0415
    except ImportError:
        warn(f"MLFLOW_TRACKING_URI is set ({_redacted(uri, uri)}) but mlflow is not installed: nothing logged to MLflow. "
             "Fix: pip install 'mop-airflow[mlflow]' on the workers")
        return result
    try:
        result["mlflow_run_id"] = log_mlflow(layout, run, rows, board, tracking_uri=uri,
                                             best_model_uri=(summary or {}).get("best_model_uri"))
    except Exception as exc:  # noqa: BLE001
        warn(f"nothing logged to MLflow at {_redacted(uri, uri)}: {type(exc).__name__}: {_redacted(str(exc), uri)}")
    return result
