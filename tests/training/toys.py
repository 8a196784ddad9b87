"""Toy model builders, named by import path ("tests.training.toys:..."), and configurations."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TOY_MODEL = "tests.training.toys:batchnorm_dropout_mlp"


def make_config(model: str = TOY_MODEL, **overrides: Any) -> dict[str, Any]:
    """A configuration dict shaped like SearchSpace.expand() makes them."""
    config = {"config_id": "c000-test00", "model": model, "hparams": {}, "optimizer": "adam",
              "optimizer_params": {"learning_rate": 0.01}, "loss": "sparse_categorical_crossentropy",
              "metrics": ["accuracy"], "batch_size": 8, "epochs_per_hop": 1}
    config.update(overrides)
    return config


def toy_spec(folder: Path, x: np.ndarray, y: np.ndarray, *, store: str = "store", cache: str = "cache",
             models: Sequence[str] = (TOY_MODEL,), learning_rates: Sequence[float] = (1e-2, 3e-2),
             batch_sizes: Sequence[int] = (8,), shards: int = 2, iterations: int = 2) -> dict[str, Any]:
    """A grid spec over ``x``/``y``, written once as ``<folder>/toy.parquet`` (features f0.., label y),
    with its store and worker cache in ``<folder>/<store>`` and ``<folder>/<cache>``."""
    source = folder / "toy.parquet"
    if not source.exists():
        pq.write_table(pa.table({**{f"f{i}": x[:, i] for i in range(x.shape[1])}, "y": y}), source)
    return {
        "data": {"source": str(source), "label": "y", "features": "f*", "classes": [0, 1, 2], "validation": 0.2},
        "search": {"space": {"method": "grid", "params": {"model": list(models), "learning_rate": list(learning_rates),
                                                          "batch_size": list(batch_sizes)}}},
        "schedule": {"shards": shards, "iterations": iterations, "seed": 3},
        "store": {"root": f"file://{folder / store}", "cache_dir": str(folder / cache)},
    }


# The hparams the last call of `remember_hparams` received.
LAST_HPARAMS: dict[str, Any] = {}


def batchnorm_dropout_mlp(hparams: dict[str, Any]) -> keras.Model:
    """Small, but with every kind of state a hop must carry: trainable and non-trainable weights
    (BatchNorm moving statistics) and a dropout seed generator."""
    return keras.Sequential([
        keras.Input((hparams["input_dim"],)),
        keras.layers.Dense(hparams.get("units", 12), activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(hparams["num_classes"], activation="softmax"),
    ])


def remember_hparams(hparams: dict[str, Any]) -> keras.Model:
    LAST_HPARAMS.clear()
    LAST_HPARAMS.update(hparams)
    return keras.Sequential([keras.Input((hparams["input_dim"],)), keras.layers.Dense(hparams["num_classes"])])


def not_a_model(hparams: dict[str, Any]) -> str:
    return "a string"


def raises(hparams: dict[str, Any]) -> keras.Model:
    raise KeyError("units")


NOT_CALLABLE = 42


class _Subclassed(keras.Model):
    def __init__(self, num_classes: int):
        super().__init__()
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.out = keras.layers.Dense(num_classes, activation="softmax")

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def subclassed(hparams: dict[str, Any]) -> keras.Model:
    """Returned unbuilt: it has no weights until it sees an input shape."""
    return _Subclassed(hparams["num_classes"])


def subclassed_for_sequences(hparams: dict[str, Any]) -> keras.Model:
    """Unbuilt and expecting (batch, steps, channels): flat rows cannot build it."""
    model = _Subclassed(hparams["num_classes"])
    model.hidden = keras.layers.Conv1D(4, 3)
    return model


def narrow_only(hparams: dict[str, Any]) -> keras.Model:
    """A builder that works for some hyperparameters and raises for others (units above 100)."""
    if hparams["units"] > 100:
        raise ValueError(f"units={hparams['units']} is too wide for this builder")
    return keras.Sequential([keras.Input((hparams["input_dim"],)),
                             keras.layers.Dense(hparams["units"], activation="relu"),
                             keras.layers.Dense(hparams["num_classes"], activation="softmax")])


def fixed_input(hparams: dict[str, Any]) -> keras.Model:
    """Ignores the data's shape: expects 5 features whatever the data has."""
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(hparams["num_classes"], activation="softmax")])


def seven_outputs(hparams: dict[str, Any]) -> keras.Model:
    """Ignores the number of classes."""
    return keras.Sequential([keras.Input((hparams["input_dim"],)), keras.layers.Dense(7, activation="softmax")])


def two_inputs(hparams: dict[str, Any]) -> keras.Model:
    """A functional model with one named input per entry of ``input_shapes`` (a dict of arrays)."""
    inputs = {name: keras.Input(shape, name=name) for name, shape in hparams["input_shapes"].items()}
    merged = keras.layers.Concatenate()([keras.layers.Flatten()(inputs[name]) for name in sorted(inputs)])
    hidden = keras.layers.Dropout(0.2)(keras.layers.Dense(10, activation="relu")(merged))
    return keras.Model(inputs, keras.layers.Dense(hparams["num_classes"], activation="softmax")(hidden))


def regression_mlp(hparams: dict[str, Any]) -> keras.Model:
    return keras.Sequential([keras.Input(hparams["input_shape"]), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(hparams["num_outputs"])])


def mlp_after_a_failed_s3_request(hparams: dict[str, Any]) -> keras.Model:
    """The toy model, built after an S3 request failed on another thread, as a commit or a read-ahead
    does while a hop is built when the store's endpoint is away (nothing listens on the port here)."""
    import threading

    from mop_airflow.deployment.local import free_port
    from mop_airflow.errors import StoreError
    from mop_airflow.store import Store

    port = free_port()
    store = Store("s3://away/runs", {"key": "k", "secret": "s", "endpoint_url": f"http://127.0.0.1:{port}",
                                     "config_kwargs": {"retries": {"max_attempts": 1}}}, retry_seconds=0.1)

    def request():
        try:
            store.read_bytes(store.uri("checkpoint.npz"))
        except StoreError:
            FAILED_REQUESTS.append(port)

    thread = threading.Thread(target=request)
    thread.start()
    thread.join()
    return batchnorm_dropout_mlp(hparams)


FAILED_REQUESTS: list[int] = []


# The training step at which `nan_after_steps` models turn their output NaN: the 13th, as a learning
# rate too high blows a loss up some way into a search (in its second hop or later), not at its start.
NAN_AT_STEP = 13


@keras.saving.register_keras_serializable(package="mop_tests")
class NanAfterSteps(keras.layers.Layer):
    """Passes its input through until it has trained ``at`` steps, then outputs NaN. The count is a
    non-trainable weight, so it hops with the model's state and the step is the same whichever slot
    trains it."""

    def __init__(self, at: int = NAN_AT_STEP, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.at = at

    def build(self, input_shape: Any) -> None:
        self.steps = self.add_weight(shape=(), initializer="zeros", trainable=False, name="steps")

    def call(self, inputs: Any, training: bool = False) -> Any:
        if training:
            self.steps.assign(self.steps + 1.0)
        blown = keras.ops.greater_equal(self.steps, float(self.at))
        return keras.ops.where(blown, keras.ops.full_like(inputs, float("nan")), inputs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "at": self.at}


def nan_after_steps(hparams: dict[str, Any]) -> keras.Model:
    """The toy model with a layer whose output turns NaN at its 13th training step, or the one
    ``MOP_TEST_NAN_AT_STEP`` names (a test's DAG file sets it for its task processes: a run where the
    same configurations never diverge sets it past the run's last step)."""
    import os

    return keras.Sequential([
        keras.Input((hparams["input_dim"],)),
        keras.layers.Dense(hparams.get("units", 12), activation="relu"),
        NanAfterSteps(int(os.environ.get("MOP_TEST_NAN_AT_STEP") or NAN_AT_STEP)),
        keras.layers.Dense(hparams["num_classes"], activation="softmax"),
    ])
