"""Building a configuration: import paths, optimizers, seeded initial weights, ready optimizer."""

from __future__ import annotations

import os.path

import keras
import numpy as np
import pytest

from mop_airflow.errors import TrainingError
from mop_airflow.search.space import OPTIMIZERS
from mop_airflow.training.builder import build_model, load_builder, make_optimizer
from tests.training import toys
from tests.training.toys import make_config


def test_load_builder_follows_a_dotted_attribute_after_the_colon():
    assert load_builder("os:path.join") is os.path.join
    assert load_builder("mop_airflow.examples.mnist1d_models:cnn").__name__ == "cnn"


@pytest.mark.parametrize("path, words", [
    ("no_such_module_xyz:build", ["'no_such_module_xyz:build'", "could not be imported", "Fix:"]),
    ("tests.training.toys:missing", ["attribute 'missing' is missing", "Fix:"]),
    ("tests.training.toys:NOT_CALLABLE", ["int object is not callable", "Fix:"]),
    ("tests.training.toys", ["not an import path", "Fix:"]),
])
def test_bad_import_paths_say_what_failed_and_how_to_fix_it(path, words):
    with pytest.raises(TrainingError) as caught:
        load_builder(path)
    for word in words:
        assert word in str(caught.value)


def test_every_optimizer_the_search_space_accepts_is_built_with_its_parameters():
    for name in OPTIMIZERS:
        optimizer = make_optimizer({"optimizer": name, "optimizer_params": {"learning_rate": 0.25, "clipnorm": 1.0}})
        assert type(optimizer).__name__.lower() == name  # names get suffixes (adam_20) in a long process
        assert float(optimizer.learning_rate.numpy()) == 0.25 and optimizer.clipnorm == 1.0
    assert float(make_optimizer({"optimizer": "adam", "optimizer_params": {"beta_1": 0.5}}).beta_1) == 0.5


def test_an_unknown_optimizer_parameter_is_named():
    with pytest.raises(TrainingError, match="optimizer 'adam' has no parameter 'beta_3'.*Fix:"):
        make_optimizer({"optimizer": "adam", "optimizer_params": {"learning_rate": 0.1, "beta_3": 0.9}})
    with pytest.raises(TrainingError, match="'momentum'"):
        make_optimizer({"optimizer": "adam", "optimizer_params": {"momentum": 0.9}})


def test_builders_get_input_dim_and_num_classes_injected_over_their_hparams():
    config = make_config("tests.training.toys:remember_hparams", hparams={"units": 7, "num_classes": 99})
    model = build_model(config, input_shapes={"features": (6,)}, num_classes=3, seed=0)
    assert toys.LAST_HPARAMS == {"units": 7, "input_dim": 6, "num_classes": 3, "input_shape": (6,),
                                 "input_shapes": {"features": (6,)}, "num_outputs": 3, "task": "classification"}
    assert model.output_shape == (None, 3)


def test_initial_weights_follow_from_the_seed():
    def weights(seed: int) -> list[np.ndarray]:
        return [v.numpy() for v in build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=seed).weights]

    first, again, other = weights(1), weights(1), weights(2)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], other[0])


def test_initial_weights_stay_when_an_s3_request_fails_on_another_thread_during_the_build():
    """botocore draws a failed request's retry delay from Python's generator, where Keras takes a layer's
    default seed: a store outage while a hop was built moved its initial weights (and a final accuracy)."""
    def weights(model: str) -> list[np.ndarray]:
        config = make_config(model)
        return [v.numpy() for v in build_model(config, input_shapes={"features": (6,)}, num_classes=3, seed=5).weights]

    calm, disturbed = weights(toys.TOY_MODEL), weights("tests.training.toys:mlp_after_a_failed_s3_request")
    assert toys.FAILED_REQUESTS  # the request failed, as the store's were during the outage
    assert len(calm) == len(disturbed) and all(np.array_equal(a, b) for a, b in zip(calm, disturbed))


def test_the_model_is_compiled_and_its_optimizer_variables_exist_before_any_step():
    model = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=0)
    assert model.compiled and isinstance(model.optimizer, keras.optimizers.Adam)
    assert int(model.optimizer.iterations.numpy()) == 0
    # iteration counter and learning rate, then a momentum and a velocity per trainable variable
    assert len(model.optimizer.variables) == 2 + 2 * len(model.trainable_variables)


@pytest.mark.parametrize("builder, message", [
    ("tests.training.toys:not_a_model", "returned str, not a keras.Model"),
    ("tests.training.toys:raises", r"failed with hparams .*KeyError"),
])
def test_a_builder_that_misbehaves_is_reported_with_its_path(builder, message):
    with pytest.raises(TrainingError, match=message) as caught:
        build_model(make_config(builder), input_shapes={"features": (6,)}, num_classes=3, seed=0)
    assert builder in str(caught.value)


def test_an_unknown_loss_is_reported():
    with pytest.raises(TrainingError, match="not_a_loss"):
        build_model(make_config(loss="not_a_loss"), input_shapes={"features": (6,)}, num_classes=3, seed=0)


def test_an_unknown_metric_is_reported_but_compile_aliases_are_kept():
    with pytest.raises(TrainingError, match="metric 'no_such_metric'"):
        build_model(make_config(metrics=["acc", "no_such_metric"]), input_shapes={"features": (6,)}, num_classes=3, seed=0)
    model = build_model(make_config(metrics=["acc", "sparse_top_k_categorical_accuracy"]), input_shapes={"features": (6,)}, num_classes=3,
                        seed=0)
    assert model.compiled


def test_an_unbuilt_subclassed_model_is_built_for_flat_rows():
    model = build_model(make_config("tests.training.toys:subclassed"), input_shapes={"features": (6,)}, num_classes=3, seed=0)
    assert model.built and [tuple(v.shape) for v in model.trainable_variables] == [(6, 4), (4,), (4, 3), (3,)]
    assert len(model.optimizer.variables) == 2 + 2 * 4


def test_an_unbuilt_model_that_cannot_take_flat_rows_is_reported():
    with pytest.raises(TrainingError, match=r"(?s)cannot be built for input shapes \{'features': \(6,\)\}.*keras.Input"):
        build_model(make_config("tests.training.toys:subclassed_for_sequences"), input_shapes={"features": (6,)}, num_classes=3, seed=0)
