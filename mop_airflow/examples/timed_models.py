"""A model whose training time is set by its hyperparameters, for scheduling benchmarks and tests.

``sleepy`` is a tiny dense classifier with one extra layer that sleeps ``seconds_per_batch`` in
every training step (never in evaluation or prediction). A hop over a shard of ``n`` batches then
takes about ``n * seconds_per_batch`` of training, while the process sleeps instead of computing:
many such hops run side by side on a small machine without competing for CPU, so a run's timing
is decided by the schedule (pools, priorities, Airflow's own latencies), which is what
``benchmarks/sim_vs_airflow.py`` compares with the simulator
(:func:`mop_airflow.planning.simulation.simulate`).

The sleeping layer has no variables, so checkpoints hold only the dense layers' and the
optimizer's variables, and it is registered with Keras so an exported model loads again.
Needs the TensorFlow backend (the sleep is a ``tf.numpy_function``).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import keras


def _sleep(seconds):
    time.sleep(float(seconds))
    return seconds


@keras.saving.register_keras_serializable(package="mop_airflow.timed")
class SleepPerBatch(keras.layers.Layer):
    """Passes its input through; in a training step it first sleeps ``seconds`` (once per batch)."""

    def __init__(self, seconds: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seconds = float(seconds)
        self.supports_jit = False  # a Python callback cannot be compiled by XLA

    def call(self, inputs, training=None):
        if not training or self.seconds <= 0:
            return inputs
        import tensorflow as tf  # noqa: PLC0415

        slept = tf.numpy_function(_sleep, [tf.constant(self.seconds, tf.float32)], tf.float32, stateful=True)
        slept.set_shape(())
        # Tie the sleep to the output so the step cannot run without it; adds exactly zero.
        return inputs + tf.stop_gradient(tf.cast(slept, inputs.dtype) * 0.0)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "seconds": self.seconds}


def sleepy(hparams: Mapping[str, Any]) -> keras.Model:
    """``seconds_per_batch`` (default 0.1) of sleep per training batch, then Dense(``units``, relu)
    (default 16) and a softmax classifier."""
    return keras.Sequential([
        keras.Input((int(hparams["input_dim"]),)),
        SleepPerBatch(float(hparams.get("seconds_per_batch", 0.1))),
        keras.layers.Dense(int(hparams.get("units", 16)), activation="relu"),
        keras.layers.Dense(int(hparams["num_classes"]), activation="softmax"),
    ], name="sleepy")
