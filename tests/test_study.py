"""A search as an Optuna study (mop_airflow.results.study): `mop-airflow export-study` and which
hyperparameters mattered, from a reported run's records in a store."""

import math

import optuna
import pytest

from mop_airflow.cli.main import main
from mop_airflow.records import RunRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.results.study import build_study, importance
from mop_airflow.store import Store

SPACE = {"method": "random", "seed": 1, "num_samples": 8, "params": {
    "model": ["m:mlp", "m:cnn"], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 1e-1},
    "batch_size": [32, 64]}}


def config(k, model, lr, batch):
    return {"config_id": f"c{k:03d}", "model": model, "hparams": {}, "optimizer": "adam",
            "optimizer_params": {"learning_rate": lr}, "loss": "sparse_categorical_crossentropy",
            "metrics": ["accuracy"], "batch_size": batch, "epochs_per_hop": 1}


def reported_run():
    """8 configurations whose accuracy follows the learning rate (best at 1e-2) and hardly the rest."""
    configs = [config(k, ("m:mlp", "m:cnn")[k % 2], 10 ** (-4 + 3 * k / 7), (32, 64)[k // 4]) for k in range(8)]
    spec = {"search": {"space": SPACE, "metric": "val_accuracy", "direction": "max", "adaptive": None},
            "schedule": {"iterations": 2}}
    run = RunRecord(dag_id="d", run_id="r", created_at="2026-11-25T00:00:00+00:00", spec=spec, configs=configs)
    board, rows = [], []
    for c in configs:
        lr = c["optimizer_params"]["learning_rate"]
        accuracy = 0.95 - 0.1 * abs(math.log10(lr) + 2) + (0.001 if c["model"] == "m:cnn" else 0.0)
        failed = c["config_id"] == "c007"
        board.append({"config_id": c["config_id"], "val_accuracy": None if failed else accuracy,
                      "status": "failed" if failed else "pruned" if c["config_id"] == "c006" else "finished",
                      "outcome": "failed at hop 0" if failed else "finished"})
        rows += [{"config_id": c["config_id"], "iteration": i, "complete": True, "val_accuracy": accuracy - 0.1 * (1 - i)}
                 for i in range(2) if not failed]
    return run, board, rows


def test_every_configuration_is_a_trial_with_its_values_state_and_curve():
    run, board, rows = reported_run()
    study = build_study(run, board, rows)
    trials = {t.user_attrs["config_id"]: t for t in study.trials}
    assert len(trials) == 8 and study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert set(trials["c000"].params) == {"model", "learning_rate", "batch_size"}
    assert trials["c003"].params["learning_rate"] == pytest.approx(run.configs[3]["optimizer_params"]["learning_rate"])
    assert trials["c003"].value == pytest.approx(board[3]["val_accuracy"])
    assert trials["c003"].intermediate_values == {0: pytest.approx(rows[6]["val_accuracy"]),
                                                  1: pytest.approx(rows[7]["val_accuracy"])}
    assert trials["c006"].state == optuna.trial.TrialState.PRUNED and trials["c007"].state == optuna.trial.TrialState.FAIL
    assert study.best_trial.user_attrs["config_id"] == max((r for r in board[:6]), key=lambda r: r["val_accuracy"])[
        "config_id"]


def test_the_learning_rate_is_found_to_matter_most():
    run, board, rows = reported_run()
    found = importance(run, board, rows)
    assert found["trials"] == 6 and found["evaluator"] in ("fANOVA", "PED-ANOVA")
    shares = {row["field"]: row["importance"] for row in found["importances"]}
    assert max(shares, key=shares.get) == "learning_rate" and sum(shares.values()) == pytest.approx(1.0)
    assert importance(run, board[:2], rows) is None  # fewer than three finished: nothing to measure


def test_export_study_writes_a_storage_optuna_opens(tmp_path, capsys):
    run, board, rows = reported_run()
    store = Store(f"file://{tmp_path / 'store'}")
    layout = RunLayout(store, "d", "r")
    run.write(store, layout.run_record_uri)
    store.write_json(layout.report_uri("leaderboard.json"), {"leaderboard": board})
    store.write_json(layout.report_uri("metrics.json"), rows)
    out = tmp_path / "study.db"
    assert main(["export-study", "d", "r", "--store", str(tmp_path / "store"), "--out", str(out)]) == 0
    assert "8 trial(s) of d / r written" in capsys.readouterr().out
    loaded = optuna.load_study(study_name="d/r", storage=f"sqlite:///{out}")
    assert len(loaded.trials) == 8 and loaded.user_attrs["metric"] == "val_accuracy"
    assert loaded.best_value == pytest.approx(max(r["val_accuracy"] for r in board[:6]))
    assert main(["export-study", "d", "r", "--store", str(tmp_path / "store"), "--out", str(out)]) == 2
    assert "--out=" in capsys.readouterr().err  # never overwrites a study
    assert main(["export-study", "d", "nope", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "x.db")]) != 0
