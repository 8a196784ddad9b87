"""Model builders that kill their own training process half-way, for the tests that SIGKILL a hop.

A test writes :func:`killer_source` into a folder on the task processes' PYTHONPATH, outside the DAG
folder so the DAG processor never imports it. ``condition`` is a Python expression over ``_batches``
(training batches so far in this process) and ``env`` (Airflow exports the task's ids into it).
"""

KILLER = '''
import os
import signal

import keras

_batches = 0


def _count(x):
    global _batches
    _batches += 1
    env = os.environ
    if {condition}:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@keras.saving.register_keras_serializable(package="{package}")
class DieHalfWay(keras.layers.Layer):
    def call(self, inputs, training=None):
        if not training:
            return inputs
        import tensorflow as tf

        out = tf.numpy_function(_count, [inputs], inputs.dtype, stateful=True)
        out.set_shape(inputs.shape)
        return out


def mlp(hparams):
    return keras.Sequential([keras.Input((int(hparams["input_dim"]),)), DieHalfWay(),
                             keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(int(hparams["num_classes"]), activation="softmax")])


def narrow(hparams):
    """A plain MLP that cannot be built wider than 100 units: such a configuration fails at its first hop."""
    if int(hparams["units"]) > 100:
        raise ValueError(f"units={{hparams['units']}} is too wide for this builder")
    return keras.Sequential([keras.Input((int(hparams["input_dim"]),)),
                             keras.layers.Dense(int(hparams["units"]), activation="relu"),
                             keras.layers.Dense(int(hparams["num_classes"]), activation="softmax")])
'''


def killer_source(condition: str, package: str) -> str:
    """The module's source: ``mlp`` SIGKILLs its process when ``condition`` holds; ``narrow`` fails to
    build wider than 100 units."""
    return KILLER.format(condition=condition, package=package)
