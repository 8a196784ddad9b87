"""One hop (sub-epoch): train a model on the whole shard it visits, evaluate, export.

The batch order of every pass is a pure function of (seed, iteration, shard, epoch): a run can be
replayed exactly, and tests rebuild the very same batches to compare MOP with plain Keras.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import keras
import numpy as np

from mop_airflow.errors import TrainingError
from mop_airflow.training import progress
from mop_airflow.training.steps import (as_keras_arrays, evaluate_arrays, evaluate_batches, stepwise_supported,
                                        train_batches, train_pass)


def batch_order(n_rows: int, *, seed: int, iteration: int, shard: int, epoch: int) -> np.ndarray:
    """The permutation of the shard's rows for one pass: the single definition of the batch order."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, iteration, shard, epoch]))
    return rng.permutation(n_rows)


def train_on_shard(model: keras.Model, x: Any, y: np.ndarray, *, batch_size: int, epochs: int,
                   seed: int, iteration: int, shard: int, stepwise: bool = True) -> dict[str, float | int]:
    """Train ``epochs`` passes over the shard, each in the order :func:`batch_order` gives.

    ``x`` is an array, or a dict of arrays for a model with several inputs. Each pass runs the
    model's traced train step batch by batch (:mod:`~mop_airflow.training.steps`): exactly the
    optimizer steps, losses and metrics of ``model.fit(shuffle=False)`` on the permuted arrays
    (tested bit for bit), without the ~0.1 s of input pipeline ``fit`` builds per call, which a
    slot would pay per pass and per configuration. ``stepwise=False`` runs ``fit`` itself (the
    reference; also taken where the step-by-step path is not known to be exact).
    Returns the hop's mean training loss and compiled metrics (Keras epoch means, averaged over the
    passes, which all have the same number of batches), optimizer ``steps``, ``samples`` and
    ``train_seconds``: the training calls only, not building or restoring the model, but including
    Keras's tracing of the train step, which a fresh model pays once per hop (~0.5 s on CPU for
    the MNIST-1D demo models).
    """
    stepwise = stepwise and stepwise_supported(model)
    if stepwise:
        x, y = as_keras_arrays(x, y)

    def one_pass(epoch: int) -> dict[str, float]:
        order = batch_order(len(y), seed=seed, iteration=iteration, shard=shard, epoch=epoch)
        if stepwise:
            return train_pass(model, _take(x, order), y[order], batch_size=batch_size)
        return _last_epoch(model.fit(_take(x, order), y[order], batch_size=batch_size, epochs=1, shuffle=False,
                                     verbose=0, callbacks=[keras.callbacks.TerminateOnNaN(), _Ticks()]))

    return _train(model, len(y), epochs, one_pass, iteration=iteration, shard=shard)


def train_streamed(model: keras.Model, path: str, load: Any, *, batch_size: int, epochs: int, seed: int,
                   iteration: int, shard: int, window_rows: int, stepwise: bool = True) -> dict[str, float | int]:
    """Like :func:`train_on_shard`, streaming the shard file a window of row groups at a time.

    ``load(table) -> (x, y)`` decodes Parquet rows; the order is :func:`~mop_airflow.training.stream.stream_order`.
    The batches run on the model's traced train step as in memory (``fit`` over a Python generator
    cost a tf.data pipeline and a thread hand-off per batch); ``stepwise=False`` runs ``fit`` itself.
    """
    from mop_airflow.training.stream import count_rows, stream_batches  # noqa: PLC0415

    n_rows = count_rows(path)
    stepwise = stepwise and stepwise_supported(model)

    def one_pass(epoch: int) -> dict[str, float]:
        batches = stream_batches(path, load, batch_size=batch_size, window_rows=window_rows, seed=seed,
                                 iteration=iteration, shard=shard, epoch=epoch)
        if stepwise:
            return train_batches(model, batches)
        return _last_epoch(model.fit(batches, steps_per_epoch=math.ceil(n_rows / batch_size), epochs=1, shuffle=False,
                                     verbose=0, callbacks=[keras.callbacks.TerminateOnNaN(), _Ticks()]))

    return _train(model, n_rows, epochs, one_pass, iteration=iteration, shard=shard)


class _Ticks(keras.callbacks.Callback):
    """Counts ``fit``'s batches as progress (:mod:`~mop_airflow.training.progress`), as the step-by-step
    path does: a shard slot's watchdog would take a long pass for a hang."""

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        progress.tick()


def _train(model: keras.Model, n_rows: int, epochs: int, one_pass: Any, *, iteration: int,
           shard: int) -> dict[str, float | int]:
    check_hop(n_rows, epochs, iteration=iteration, shard=shard)
    steps_before = int(model.optimizer.iterations.numpy())
    per_epoch: list[dict[str, float]] = []
    started = time.perf_counter()
    for epoch in range(epochs):
        # A pass stops at the first non-finite batch loss instead of wasting the rest of the hop.
        logs = one_pass(epoch)
        error = divergence(logs, iteration=iteration, shard=shard, epoch=epoch, epochs=epochs)
        if error is not None:
            raise error
        per_epoch.append(logs)
    return hop_summary(per_epoch, steps=int(model.optimizer.iterations.numpy()) - steps_before,
                       samples=n_rows * epochs, train_seconds=time.perf_counter() - started)


def check_hop(n_rows: int, epochs: int, *, iteration: int, shard: int) -> None:
    if n_rows == 0:
        raise TrainingError(f"shard {shard} is empty at iteration {iteration}. Fix: use fewer shards than rows")
    if epochs < 1:
        raise TrainingError(f"epochs_per_hop={epochs} must be >= 1. Fix: set epochs_per_hop to 1 or more")


def divergence(logs: dict[str, float], *, iteration: int, shard: int, epoch: int, epochs: int) -> TrainingError | None:
    """The error a pass whose mean loss is not finite ends its configuration's hop with, or None."""
    if math.isfinite(logs.get("loss", math.nan)):
        return None
    return TrainingError(f"diverged: loss={logs.get('loss')} at iteration {iteration} on shard {shard} "
                         f"(pass {epoch + 1} of {epochs} of the hop). Fix: lower the learning rate, "
                         "add clipnorm to optimizer_params, or check the data for NaN/inf")


def hop_summary(per_epoch: list[dict[str, float]], *, steps: int, samples: int,
                train_seconds: float) -> dict[str, float | int]:
    """A hop's training metrics: each pass's Keras epoch means averaged over the passes (which all have
    the same number of batches), and its optimizer steps, samples and seconds."""
    summary: dict[str, float | int] = {name: float(np.mean([logs[name] for logs in per_epoch]))
                                       for name in per_epoch[0]}
    summary.update(steps=steps, samples=samples, train_seconds=train_seconds)
    return summary


def _last_epoch(history: Any) -> dict[str, float]:
    return {name: float(values[-1]) for name, values in history.history.items()}


def _take(x: Any, rows: np.ndarray) -> Any:
    return {name: values[rows] for name, values in x.items()} if isinstance(x, dict) else x[rows]


def evaluate(model: keras.Model, x: Any, y: np.ndarray, *, batch_size: int, stepwise: bool = True) -> dict[str, float]:
    """Validation loss and every compiled metric, prefixed ``val_`` like Keras's fit history.

    Batch by batch on the model's traced test step, exactly what ``model.evaluate`` returns without
    its input pipeline (``stepwise=False``: ``model.evaluate`` itself).
    """
    if stepwise and len(y) and stepwise_supported(model):
        results = evaluate_arrays(model, *as_keras_arrays(x, y), batch_size=batch_size)
    else:
        results = model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
    return {f"val_{name}": float(value) for name, value in results.items()}


def evaluate_streamed(model: keras.Model, path: str, load: Any, *, batch_size: int,
                      window_rows: int, stepwise: bool = True) -> dict[str, float]:
    """:func:`evaluate` over a validation file larger than memory, a window of row groups at a time."""
    from mop_airflow.training.stream import count_rows, stream_batches  # noqa: PLC0415

    # Any fixed order will do: the metrics are means over every row.
    batches = stream_batches(path, load, batch_size=batch_size, window_rows=window_rows, seed=0, iteration=0,
                             shard=0, epoch=0)
    if stepwise and stepwise_supported(model):
        return {f"val_{name}": value for name, value in evaluate_batches(model, batches).items()}
    results = model.evaluate(batches, steps=math.ceil(count_rows(path) / batch_size), verbose=0, return_dict=True)
    return {f"val_{name}": float(value) for name, value in results.items()}


def export_keras(model: keras.Model, path: str) -> str:
    """Save the model as a native ``.keras`` file that ``keras.models.load_model`` can serve from."""
    if not str(path).endswith(".keras"):
        raise TrainingError(f"export path {path!r} must end with '.keras'. Fix: e.g. 'best_model.keras'")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    model.save(path)
    return str(path)
