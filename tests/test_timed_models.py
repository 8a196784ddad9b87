"""The timed example model sleeps per training batch only, still learns, and checkpoints."""

from __future__ import annotations

import math
import time

import keras
import numpy as np
import pytest

from mop_airflow.examples import timed_models
from mop_airflow.training.builder import build_model
from mop_airflow.training.checkpoint import restore_state, state_to_bytes
from mop_airflow.training.hop import evaluate, export_keras, train_on_shard

MODEL = "mop_airflow.examples.timed_models:sleepy"
BATCH = 16


def config(seconds_per_batch: float, **hparams) -> dict:
    return {"config_id": "c000-timed0", "model": MODEL, "hparams": {"seconds_per_batch": seconds_per_batch, **hparams},
            "optimizer": "adam", "optimizer_params": {"learning_rate": 0.05},
            "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"], "batch_size": BATCH,
            "epochs_per_hop": 1}


def data(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two well separated classes in 8 features."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, rows)
    x = rng.normal(size=(rows, 8)).astype("float32") + (2.0 * y[:, None] - 1.0).astype("float32")
    return x, y.astype("int64")


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """Every sleep the layer takes (the layer looks its callback up when the step is traced)."""
    calls: list[float] = []
    original = timed_models._sleep

    def counting(seconds):
        calls.append(float(seconds))
        return original(seconds)

    monkeypatch.setattr(timed_models, "_sleep", counting)
    return calls


def test_a_hop_sleeps_once_per_training_batch_and_gives_finite_losses(sleeps):
    seconds, batches = 0.05, 10
    x, y = data(batches * BATCH)
    model = build_model(config(seconds), input_shapes={"features": (8,)}, num_classes=2, seed=3)
    started = time.perf_counter()
    result = train_on_shard(model, x, y, batch_size=BATCH, epochs=1, seed=3, iteration=0, shard=0)
    elapsed = time.perf_counter() - started
    assert result["steps"] == batches
    assert len(sleeps) == batches
    assert elapsed >= batches * seconds  # a lower bound only
    assert result["train_seconds"] >= batches * seconds
    assert all(math.isfinite(v) for k, v in result.items() if k not in ("steps", "samples"))


def test_evaluation_and_prediction_do_not_sleep(sleeps):
    seconds, batches = 30.0, 20  # 600 s if evaluation slept
    x, y = data(batches * BATCH)
    model = build_model(config(seconds), input_shapes={"features": (8,)}, num_classes=2, seed=3)
    started = time.perf_counter()
    val = evaluate(model, x, y, batch_size=BATCH)
    model.predict(x, batch_size=BATCH, verbose=0)
    assert time.perf_counter() - started < seconds  # not even one batch's sleep
    assert sleeps == []
    assert math.isfinite(val["val_loss"])


def test_it_learns_and_its_state_hops(tmp_path):
    x, y = data(256)
    model = build_model(config(0.0), input_shapes={"features": (8,)}, num_classes=2, seed=5)
    before = evaluate(model, x, y, batch_size=64)["val_loss"]
    for iteration in range(3):
        train_on_shard(model, x, y, batch_size=BATCH, epochs=1, seed=5, iteration=iteration, shard=0)
    after = evaluate(model, x, y, batch_size=64)
    assert after["val_loss"] < before
    assert after["val_accuracy"] > 0.8

    # A fresh build of the same configuration takes the state by position and predicts the same.
    again = build_model(config(0.0), input_shapes={"features": (8,)}, num_classes=2, seed=99)
    restore_state(again, state_to_bytes(model, {"t": 0}))
    np.testing.assert_allclose(again.predict(x[:32], verbose=0), model.predict(x[:32], verbose=0), atol=1e-6)

    # The exported model (as the report exports the winner) loads back with its sleeping layer.
    reloaded = keras.models.load_model(export_keras(model, str(tmp_path / "best_model.keras")))
    assert any(isinstance(layer, timed_models.SleepPerBatch) for layer in reloaded.layers)
    np.testing.assert_allclose(reloaded.predict(x[:32], verbose=0), model.predict(x[:32], verbose=0), atol=1e-5)
