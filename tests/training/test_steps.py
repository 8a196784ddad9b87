"""Training batch by batch on the model's traced step gives bit for bit what ``model.fit`` gives:
the same variables (weights, BatchNorm statistics, dropout seed state, optimizer state), the same
loss and metrics, the same divergence; evaluation the same as ``model.evaluate``."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from mop_airflow.errors import TrainingError
from mop_airflow.training.builder import build_model
from mop_airflow.training.hop import evaluate, train_on_shard
from mop_airflow.training.steps import _STEPS, stepwise_supported, train_pass
from tests.training.toys import make_config

SEED = 5


def state(model) -> list[np.ndarray]:
    return [v.numpy() for v in [*model.variables, *model.optimizer.variables]]


def assert_same_state(a, b) -> None:
    ours, theirs = state(a), state(b)
    assert len(ours) == len(theirs) > 10
    for i, (u, v) in enumerate(zip(ours, theirs)):
        np.testing.assert_array_equal(u, v, err_msg=f"variable {i}")


def hop_both_ways(config, x, y, *, input_shapes, epochs, task="classification", **where):
    """The same hop trained stepwise and through model.fit, each on a fresh model from the same seed."""
    out = []
    for stepwise in (True, False):
        model = build_model(config, input_shapes=input_shapes, num_classes=3, seed=SEED, task=task)
        summary = train_on_shard(model, x, y, batch_size=config["batch_size"], epochs=epochs, seed=SEED,
                                 stepwise=stepwise, **{"iteration": 1, "shard": 2, **where})
        out.append((model, summary))
    return out


def without_time(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "train_seconds"}


def test_three_passes_with_a_partial_last_batch_equal_fit_bit_for_bit(toy_data):
    x, y = toy_data  # 100 rows in batches of 8: the 13th batch has 4 rows
    (steps_model, steps), (fit_model, fitted) = hop_both_ways(make_config(), x, y, input_shapes={"features": (6,)},
                                                              epochs=3)
    assert stepwise_supported(steps_model)  # else both sides would have run fit
    assert_same_state(steps_model, fit_model)
    assert without_time(steps) == without_time(fitted)  # the same floats, not merely close
    assert list(steps) == list(fitted) == ["accuracy", "loss", "steps", "samples", "train_seconds"]
    assert steps["steps"] == 3 * math.ceil(100 / 8)


def test_a_dict_of_inputs_trains_and_evaluates_like_fit(toy_data):
    x, y = toy_data
    inputs = {"a": x[:, :4], "b": x[:, 4:].reshape(100, 2, 1)}
    config = make_config(model="tests.training.toys:two_inputs", batch_size=16,
                         metrics=["accuracy", "sparse_top_k_categorical_accuracy"])
    shapes = {"a": (4,), "b": (2, 1)}
    (steps_model, steps), (fit_model, fitted) = hop_both_ways(config, inputs, y, input_shapes=shapes, epochs=2)
    assert_same_state(steps_model, fit_model)
    assert without_time(steps) == without_time(fitted)
    assert evaluate(steps_model, inputs, y, batch_size=32) == evaluate(fit_model, inputs, y, batch_size=32,
                                                                       stepwise=False)


def test_float64_rows_and_targets_are_cast_as_keras_casts_them_for_fit(toy_data):
    x, _ = toy_data
    x64 = x.astype("float64")
    target = (x64 @ np.arange(1, 7) / 10).reshape(-1, 1)  # a regression target, float64 like Parquet doubles
    config = make_config(model="tests.training.toys:regression_mlp", loss="mse", metrics=["mae"], batch_size=32)
    (steps_model, steps), (fit_model, fitted) = hop_both_ways(config, x64, target, input_shapes={"features": (6,)},
                                                              epochs=2, task="regression")
    assert_same_state(steps_model, fit_model)
    assert without_time(steps) == without_time(fitted)


def test_a_model_reused_with_another_batch_size_still_equals_a_fresh_fit(toy_data):
    """A slot's compiled model is traced for the first configuration's batches and reused by the next."""
    x, y = toy_data
    reused = build_model(make_config(batch_size=8), input_shapes={"features": (6,)}, num_classes=3, seed=SEED + 1)
    train_on_shard(reused, x, y, batch_size=8, epochs=1, seed=SEED, iteration=0, shard=0)
    fresh = build_model(make_config(batch_size=24), input_shapes={"features": (6,)}, num_classes=3, seed=SEED)
    for target, value in zip([*reused.variables, *reused.optimizer.variables], state(fresh)):
        target.assign(value)  # what the task session does for a configuration's first hop
    ours = train_on_shard(reused, x, y, batch_size=24, epochs=2, seed=SEED, iteration=0, shard=1)
    theirs = train_on_shard(fresh, x, y, batch_size=24, epochs=2, seed=SEED, iteration=0, shard=1, stepwise=False)
    assert_same_state(reused, fresh)
    assert without_time(ours) == without_time(theirs)


def test_a_model_s_steps_are_traced_once_for_every_batch_size(toy_data):
    """A partial last batch, another configuration's batch size, the validation rows: one trace each
    for training and evaluation (a trace costs 0.2-0.5 s on a CPU, more than a small shard's pass)."""
    x, y = toy_data
    model = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=SEED)
    train_on_shard(model, x, y, batch_size=8, epochs=2, seed=SEED, iteration=0, shard=0)  # 12 x 8 rows, then 4
    train_on_shard(model, x, y, batch_size=24, epochs=1, seed=SEED, iteration=0, shard=1)
    evaluate(model, x[:30], y[:30], batch_size=16)
    evaluate(model, x, y, batch_size=32)
    traced = {kind: function.experimental_get_tracing_count() for kind, function in _STEPS[model].items()}
    assert traced == {"train": 1, "test": 1}
    assert int(model.optimizer.iterations.numpy()) == 2 * math.ceil(100 / 8) + math.ceil(100 / 24)


def test_divergence_stops_at_the_same_batch_with_the_same_error(toy_data):
    x, y = toy_data
    x = x.copy()
    x[37, 0] = np.inf
    errors, steps = [], []
    for stepwise in (True, False):
        model = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=SEED)
        with pytest.raises(TrainingError) as caught:
            train_on_shard(model, x, y, batch_size=8, epochs=3, seed=SEED, iteration=2, shard=1, stepwise=stepwise)
        errors.append(str(caught.value))
        steps.append(int(model.optimizer.iterations.numpy()))
    assert errors[0] == errors[1]
    assert errors[0].startswith("diverged: loss=nan at iteration 2 on shard 1 (pass 1 of 3 of the hop)")
    assert steps[0] == steps[1] < math.ceil(100 / 8)  # stopped at the poisoned row's batch, within the first pass


def test_evaluate_equals_model_evaluate_with_a_partial_batch(toy_data):
    x, y = toy_data
    model = build_model(make_config(metrics=["accuracy", "sparse_top_k_categorical_accuracy"]),
                        input_shapes={"features": (6,)}, num_classes=3, seed=SEED)
    train_on_shard(model, x, y, batch_size=8, epochs=1, seed=SEED, iteration=0, shard=0)
    ours = evaluate(model, x, y, batch_size=32)  # 100 rows: the last batch has 4
    assert ours == evaluate(model, x, y, batch_size=32, stepwise=False)
    assert list(ours) == ["val_accuracy", "val_loss", "val_sparse_top_k_categorical_accuracy"]


class _ExtraLogs(keras.Sequential):
    """A custom train step that reports one more value than the model's metrics."""

    def train_step(self, data):
        logs = super().train_step(data)
        return {**logs, "double_loss": logs["loss"] * 2}


def test_a_custom_train_step_reports_what_fit_reports(toy_data):
    x, y = toy_data
    results = []
    for stepwise in (True, False):
        keras.utils.set_random_seed(SEED)
        model = _ExtraLogs([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")], name="extra_logs")
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        if stepwise:
            results.append(train_pass(model, x, y, batch_size=8))
        else:
            history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
            results.append({name: float(values[-1]) for name, values in history.history.items()})
    assert results[0] == results[1]
    assert list(results[0]) == ["accuracy", "double_loss", "loss"]
