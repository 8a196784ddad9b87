"""What the MNIST-1D example DAGs share: the data section, and the adaptive examples' random space
(plain data: cheap to import at parse time)."""

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


def mnist1d_grid_search() -> dict:
    """The demo's search (dags/mop_mnist1d.py, and its S3 copy for the compose file): an MLP or a 1-D CNN x
    2 learning rates x 2 batch sizes, ranked by validation accuracy. One definition, so every deployment
    of the demo trains the same grid and gives the same leaderboard."""
    return {
        "space": {
            "method": "grid",
            "params": {
                "model": ["mop_airflow.examples.mnist1d_models:mlp", "mop_airflow.examples.mnist1d_models:cnn"],
                "optimizer": "adam",
                "learning_rate": [3e-3, 1e-2],
                "batch_size": [32, 128],
                "metrics": ["accuracy"],
            },
        },
        "metric": "val_accuracy",
    }


def mnist1d_random_space(seed: int = 7) -> dict:
    """The random space the adaptive examples draw from: an MLP or a 1-D CNN, a log-uniform learning
    rate and a batch size (an adaptive search decides how many configurations to draw)."""
    return {
        "method": "random",
        "seed": seed,
        "params": {
            "model": {"distribution": "choice", "values": ["mop_airflow.examples.mnist1d_models:mlp",
                                                           "mop_airflow.examples.mnist1d_models:cnn"]},
            "optimizer": "adam",
            "learning_rate": {"distribution": "log_uniform", "low": 1e-3, "high": 3e-2},
            "batch_size": {"distribution": "choice", "values": [32, 64, 128]},
            "metrics": ["accuracy"],
        },
    }
