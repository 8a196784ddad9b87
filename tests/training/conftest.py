"""Fixtures of the training tests; TensorFlow's C++ logging kept quiet before Keras loads."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"


@pytest.fixture(scope="session")
def toy_data() -> tuple[np.ndarray, np.ndarray]:
    """100 rows, 6 features, 3 classes that depend on the features (so the loss moves)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")
    return x, y
