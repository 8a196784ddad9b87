"""A hop trains exactly like sequential Keras; divergence stops it; the best model exports."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from mop_airflow.errors import TrainingError
from mop_airflow.training.builder import build_model
from mop_airflow.training.checkpoint import restore_state, state_to_bytes
from mop_airflow.training.hop import batch_order, evaluate, export_keras, train_on_shard
from tests.training.toys import make_config

SEED = 11
BATCH = 8


def shards_of(x: np.ndarray, y: np.ndarray, p: int) -> list[tuple[np.ndarray, np.ndarray]]:
    # 100 rows in 3 shards of 34/33/33: every shard ends with a partial batch.
    return [(x[rows], y[rows]) for rows in np.array_split(np.arange(len(x)), p)]


def mop(config: dict, shards: list, *, iterations: int = 1, keep_optimizer_state: bool = True) -> keras.Model:
    """MOP as the hop operator runs it: a fresh model per hop, the state passed on as bytes."""
    state = None
    for iteration in range(iterations):
        for shard, (x, y) in enumerate(shards):
            model = build_model(config, input_shapes={"features": (x.shape[1],)}, num_classes=3, seed=SEED)
            just_built = [v.numpy() for v in model.optimizer.variables]
            if state is not None:
                restore_state(model, state)
            if not keep_optimizer_state:  # what MADlib does: weights hop, the optimizer starts over
                for variable, value in zip(model.optimizer.variables, just_built):
                    variable.assign(value)
            train_on_shard(model, x, y, batch_size=BATCH, epochs=config["epochs_per_hop"], seed=SEED,
                           iteration=iteration, shard=shard)
            state = state_to_bytes(model, {"iteration": iteration, "shard": shard})
    final = build_model(config, input_shapes={"features": (shards[0][0].shape[1],)}, num_classes=3, seed=SEED)
    restore_state(final, state)
    return final


def plain_keras(config: dict, shards: list, *, iterations: int = 1) -> keras.Model:
    """The reference: one model, train_on_batch on the same batches in the same order."""
    model = build_model(config, input_shapes={"features": (shards[0][0].shape[1],)}, num_classes=3, seed=SEED)
    for iteration in range(iterations):
        for shard, (x, y) in enumerate(shards):
            for epoch in range(config["epochs_per_hop"]):
                order = batch_order(len(x), seed=SEED, iteration=iteration, shard=shard, epoch=epoch)
                for start in range(0, len(x), BATCH):
                    rows = order[start:start + BATCH]
                    model.train_on_batch(x[rows], y[rows])
    return model


def same_variables(a: keras.Model, b: keras.Model) -> bool:
    pairs = list(zip(a.variables, b.variables, strict=True))
    return all(np.allclose(u.numpy(), v.numpy(), rtol=0, atol=1e-5) for u, v in pairs)


def test_batch_order_is_a_seeded_permutation_per_pass():
    order = batch_order(50, seed=1, iteration=2, shard=3, epoch=0)
    assert sorted(order) == list(range(50))
    assert np.array_equal(order, batch_order(50, seed=1, iteration=2, shard=3, epoch=0))
    others = [batch_order(50, seed=1, iteration=2, shard=3, epoch=1), batch_order(50, seed=1, iteration=2, shard=4, epoch=0),
              batch_order(50, seed=1, iteration=3, shard=3, epoch=0), batch_order(50, seed=2, iteration=2, shard=3, epoch=0)]
    assert not any(np.array_equal(order, other) for other in others)


def test_mop_over_three_shards_ends_with_the_weights_of_sequential_keras(toy_data):
    config = make_config()
    shards = shards_of(*toy_data, p=3)

    reference = plain_keras(config, shards)
    mop_model = mop(config, shards)

    assert int(mop_model.optimizer.iterations.numpy()) == int(reference.optimizer.iterations.numpy()) == 5 + 5 + 5
    assert same_variables(mop_model, reference)


def test_dropping_the_optimizer_state_at_each_hop_gives_other_weights(toy_data):
    config = make_config()
    shards = shards_of(*toy_data, p=3)
    assert not same_variables(mop(config, shards, keep_optimizer_state=False), plain_keras(config, shards))


def test_one_shard_two_iterations_of_two_passes_equal_plain_keras(toy_data):
    """p=1: MOP is plain Keras training, even across hops and with several passes per hop."""
    config = make_config(epochs_per_hop=2)
    assert same_variables(mop(config, [toy_data], iterations=2), plain_keras(config, [toy_data], iterations=2))


def test_a_hop_reports_its_mean_loss_metrics_steps_and_time(toy_data):
    x, y = toy_data
    model = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=SEED)

    summary = train_on_shard(model, x, y, batch_size=BATCH, epochs=2, seed=SEED, iteration=0, shard=0)

    assert set(summary) == {"loss", "accuracy", "steps", "samples", "train_seconds"}
    assert summary["steps"] == int(model.optimizer.iterations.numpy()) == 2 * math.ceil(100 / BATCH)
    assert summary["samples"] == 200
    assert math.isfinite(summary["loss"]) and 0 <= summary["accuracy"] <= 1 and summary["train_seconds"] > 0


def test_a_non_finite_loss_stops_the_hop_as_diverged(toy_data):
    x, y = toy_data
    x = x.copy()
    x[5, 0] = np.inf
    model = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=SEED)
    with pytest.raises(TrainingError, match=r"diverged: loss=nan at iteration 2 on shard 1 .*Fix: lower the learning"):
        train_on_shard(model, x, y, batch_size=BATCH, epochs=3, seed=SEED, iteration=2, shard=1)
    # stopped within the first pass instead of running all three
    assert int(model.optimizer.iterations.numpy()) <= math.ceil(100 / BATCH)


def test_evaluate_reports_every_compiled_metric_with_a_val_prefix(toy_data):
    x, y = toy_data
    model = build_model(make_config(metrics=["accuracy", "sparse_top_k_categorical_accuracy"]), input_shapes={"features": (6,)},
                        num_classes=3, seed=SEED)
    result = evaluate(model, x, y, batch_size=32)
    assert set(result) == {"val_loss", "val_accuracy", "val_sparse_top_k_categorical_accuracy"}
    probabilities = model.predict(x, verbose=0)
    assert result["val_accuracy"] == pytest.approx(np.mean(probabilities.argmax(1) == y))
    assert result["val_sparse_top_k_categorical_accuracy"] == 1.0  # top-5 of 3 classes


def test_the_exported_model_loads_and_predicts_like_the_trained_one(toy_data, tmp_path):
    x, y = toy_data
    model = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=SEED)
    train_on_shard(model, x, y, batch_size=BATCH, epochs=1, seed=SEED, iteration=0, shard=0)

    path = export_keras(model, str(tmp_path / "best" / "model.keras"))

    loaded = keras.models.load_model(path)
    assert np.allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    with pytest.raises(TrainingError, match="must end with '.keras'"):
        export_keras(model, str(tmp_path / "model.h5"))
