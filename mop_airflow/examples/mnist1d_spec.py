"""The data section the MNIST-1D example DAGs share (plain data: cheap to import at parse time)."""

from __future__ import annotations

import os

from mop_airflow.config import default_home

TRAIN_FILE = "mnist1d_train.parquet"
TEST_FILE = "mnist1d_test.parquet"


def mnist1d_data_spec(directory: str | None = None) -> dict:
    """Train on the generated training split, validate on MNIST-1D's own test split."""
    folder = directory or os.path.join(default_home(), "data")
    return {
        "source": os.path.join(folder, TRAIN_FILE),
        "validation": os.path.join(folder, TEST_FILE),
        "label": "label",
        "features": "x*",
        "classes": list(range(10)),
    }
