"""The example project's model builders, in the folder of the selection's file: the workers put
that folder on every task's path, so ``my_models`` is found there too.

A builder receives the configuration's ``hparams`` plus what the data decides (``input_dim``,
``num_classes``, ...) and returns an uncompiled Keras model: mop_airflow compiles it with the
configuration's optimizer and learning rate. Keras is imported here, and only the tasks that train
import this module: parsing the selection's file never loads Keras. (This text avoids naming the
scheduler or its graphs, so the scheduler's parser, in its safe mode, does not import this file.)
"""

import keras


def mlp(hparams):
    """A dense network: ``units`` wide, ``layers`` deep (default 64 and 1)."""
    layers = [keras.Input((hparams["input_dim"],))]
    for _ in range(hparams.get("layers", 1)):
        layers.append(keras.layers.Dense(hparams.get("units", 64), activation="relu"))
    layers.append(keras.layers.Dense(hparams["num_classes"], activation="softmax"))
    return keras.Sequential(layers)
