"""The MNIST-1D demo builders, and the demo's accuracy promise trained the MOP way."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from mop_airflow.examples.mnist1d_models import cnn, mlp
from mop_airflow.training.builder import build_model
from mop_airflow.training.hop import evaluate, train_on_shard

DIMS = {"input_dim": 40, "num_classes": 10}


def layer_types(model: keras.Model) -> list[str]:
    return [type(layer).__name__ for layer in model.layers]


def test_cnn_reads_the_40_features_as_a_sequence_of_one_channel():
    model = cnn({**DIMS, "filters": 8, "conv_layers": 2})
    assert model.input_shape == (None, 40) and model.output_shape == (None, 10)
    assert layer_types(model) == ["Reshape", "Conv1D", "Conv1D", "Flatten", "Dense"]
    assert model.layers[0].output.shape == (None, 40, 1)
    assert model.layers[1].filters == 8


def test_mlp_takes_one_width_or_a_list_and_optional_dropout():
    assert layer_types(mlp({**DIMS, "units": 64})) == ["Dense", "Dense"]
    model = mlp({**DIMS, "units": [64, 32], "dropout": 0.1})
    assert layer_types(model) == ["Dense", "Dropout", "Dense", "Dropout", "Dense"]
    assert [layer.units for layer in model.layers if isinstance(layer, keras.layers.Dense)] == [64, 32, 10]


@pytest.mark.integration
def test_the_demo_best_configuration_reaches_85_percent_in_three_mop_iterations():
    """The demo's settings: 20000 samples, 4 shards, 3 iterations x 1 pass per hop, CNN, Adam 1e-2, batch 32.

    One model trained shard after shard is what MOP computes (test_hop proves the equivalence).
    """
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = 20000
    data = make_dataset(args)
    x, y = data["x"].astype("float32"), data["y"]
    config = {"config_id": "demo-best", "model": "mop_airflow.examples.mnist1d_models:cnn", "hparams": {},
              "optimizer": "adam", "optimizer_params": {"learning_rate": 0.01},
              "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"], "batch_size": 32, "epochs_per_hop": 1}
    model = build_model(config, input_shapes={"features": (40,)}, num_classes=10, seed=0)
    for iteration in range(3):
        for shard, rows in enumerate(np.array_split(np.arange(len(x)), 4)):
            train_on_shard(model, x[rows], y[rows], batch_size=32, epochs=1, seed=0, iteration=iteration, shard=shard)
    assert evaluate(model, data["x_test"].astype("float32"), data["y_test"], batch_size=256)["val_accuracy"] >= 0.85
