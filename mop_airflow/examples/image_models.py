"""Model builders for the image and regression examples: ``build(hparams) -> keras.Model`` (uncompiled).

They read the input's shape from ``hparams["input_shape"]`` and the output size from
``hparams["num_outputs"]`` (classes, or 1 for regression), both injected from the data. The image
builders take ``rescale`` (e.g. 1/255 for pixels decoded from image files, as Keras's ``Rescaling``).
"""

from __future__ import annotations

from typing import Any

import keras


def cnn2d(hparams: dict[str, Any]) -> keras.Model:
    """A small 2-D CNN for images of shape (height, width, channels)."""
    filters = int(hparams.get("filters", 16))
    return keras.Sequential([
        *_inputs(hparams),
        keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(int(hparams.get("units", 64)), activation="relu"),
        keras.layers.Dense(int(hparams["num_outputs"]), activation="softmax"),
    ])


def flat_mlp(hparams: dict[str, Any]) -> keras.Model:
    """An MLP on any input shape (flattened): the baseline a CNN has to beat."""
    return keras.Sequential([
        *_inputs(hparams),
        keras.layers.Flatten(),
        keras.layers.Dense(int(hparams.get("units", 64)), activation="relu"),
        keras.layers.Dense(int(hparams["num_outputs"]), activation="softmax"),
    ])


def _inputs(hparams: dict[str, Any]) -> list[Any]:
    """The input, rescaled when ``rescale`` is given."""
    layers: list[Any] = [keras.Input(tuple(hparams["input_shape"]))]
    if hparams.get("rescale") is not None:
        layers.append(keras.layers.Rescaling(float(hparams["rescale"])))
    return layers


def regressor(hparams: dict[str, Any]) -> keras.Model:
    """An MLP with a linear output per target value."""
    layers: list[Any] = [keras.Input(tuple(hparams["input_shape"]))]
    for units in hparams.get("units", [64, 64]):
        layers.append(keras.layers.Dense(int(units), activation="relu"))
    layers.append(keras.layers.Dense(int(hparams["num_outputs"])))
    return keras.Sequential(layers)
