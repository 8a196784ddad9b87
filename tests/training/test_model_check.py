"""Each distinct model is built once on the data's shapes before training; what cannot train, or
cannot be saved and loaded back as the report saves the best model, is named."""

from __future__ import annotations

import keras
import pytest

from mop_airflow.training.model_check import check_models
from tests.training.toys import TOY_MODEL, make_config

SHAPES = {"features": (6,)}


def configs(*specs):
    return [make_config(model, config_id=f"c{i:03d}-test00", **over) for i, (model, over) in enumerate(specs)]


def check(cfgs, **kwargs):
    return check_models(cfgs, input_shapes=kwargs.pop("shapes", SHAPES), num_classes=kwargs.pop("classes", 3),
                        task=kwargs.pop("task", "classification"))


def test_configurations_that_differ_only_in_learning_rate_or_batch_size_are_built_once():
    cfgs = configs((TOY_MODEL, {"optimizer_params": {"learning_rate": 0.1}}),
                   (TOY_MODEL, {"optimizer_params": {"learning_rate": 0.01}, "batch_size": 64}),
                   (TOY_MODEL, {"hparams": {"units": 4}}))
    found = check(cfgs)
    assert found.failures == {} and found.built == 2
    assert found.fatal(cfgs, fail_fast=True) is None


@pytest.mark.parametrize("model, words", [
    ("tests.training.no_such_module:build", "could not be imported"),
    ("tests.training.toys:not_a_model", "returned str, not a keras.Model"),
    ("tests.training.toys:fixed_input", "the model does not take the data's inputs features (6,): ValueError: "),
    ("tests.training.toys:seven_outputs", "the model outputs 7 value(s) per row but 3 classes and loss "
                                          "'sparse_categorical_crossentropy' need(s) 3. Fix: end with "
                                          "keras.layers.Dense(hparams['num_classes']"),
])
def test_a_builder_that_cannot_train_on_this_data_fails_the_run_before_any_hop(model, words):
    cfgs = configs((TOY_MODEL, {}), (model, {"optimizer_params": {"learning_rate": 0.1}}),
                   (model, {"optimizer_params": {"learning_rate": 0.01}}))
    found = check(cfgs)
    assert set(found.failures) == {"c001-test00", "c002-test00"}
    message = found.fatal(cfgs, fail_fast=False)
    assert message.startswith(f"model builder {model!r} fails for each of its 2 configuration(s): ")
    assert words in message and "Fix:" in message and "\n" not in message


def test_a_builder_failing_for_some_hparams_only_marks_those_unless_fail_fast():
    narrow = "tests.training.toys:narrow_only"
    cfgs = configs((narrow, {"hparams": {"units": 32}}), (narrow, {"hparams": {"units": 200}}))
    found = check(cfgs)
    assert list(found.failures) == ["c001-test00"]
    assert "units=200 is too wide for this builder" in found.failures["c001-test00"]
    assert found.fatal(cfgs, fail_fast=False) is None
    assert found.fatal(cfgs, fail_fast=True).startswith("c001-test00: model builder")


def test_a_regression_model_must_output_one_value_per_row():
    cfgs = configs(("tests.training.toys:seven_outputs", {"loss": "mse", "metrics": ["mae"]}))
    found = check(cfgs, task="regression", classes=0)
    assert found.failures["c000-test00"].endswith(
        "the model outputs 7 value(s) per row but a regression target need(s) 1. Fix: end with keras.layers.Dense(1)")


class Bomb(keras.layers.Layer):
    """A custom layer its author forgot to register with Keras: it trains, but a saved model holding it
    cannot be loaded back ("Could not locate class 'Bomb'")."""

    def call(self, inputs):
        return inputs * 1.0


@keras.saving.register_keras_serializable(package="mop_tests_model_check")
class Defused(keras.layers.Layer):
    """The same layer, registered: a model holding it saves and loads back."""

    def call(self, inputs):
        return inputs * 1.0


def with_unregistered_layer(hparams):
    return keras.Sequential([keras.Input((hparams["input_dim"],)), keras.layers.Dense(4, activation="relu"), Bomb(),
                             keras.layers.Dense(hparams["num_classes"], activation="softmax")])


def with_registered_layer(hparams):
    return keras.Sequential([keras.Input((hparams["input_dim"],)), keras.layers.Dense(4, activation="relu"), Defused(),
                             keras.layers.Dense(hparams["num_classes"], activation="softmax")])


def test_a_model_keras_cannot_save_and_load_back_fails_the_run_before_any_hop_naming_the_class_and_the_decorator(
        tmp_path):
    unregistered = "tests.training.test_model_check:with_unregistered_layer"
    model = with_unregistered_layer({"input_dim": 6, "num_classes": 3})  # the failure the report would meet
    model.save(tmp_path / "bomb.keras")
    with pytest.raises(TypeError, match="could not be deserialized"):
        keras.models.load_model(tmp_path / "bomb.keras", safe_mode=True)

    cfgs = configs((TOY_MODEL, {}), (unregistered, {"optimizer_params": {"learning_rate": 0.1}}),
                   (unregistered, {"optimizer_params": {"learning_rate": 0.01}}),
                   ("tests.training.test_model_check:with_registered_layer", {}))
    found = check(cfgs)
    assert set(found.failures) == {"c001-test00", "c002-test00"}  # the registered layer saves and loads back
    message = found.fatal(cfgs, fail_fast=False)
    assert message.startswith(f"model builder {unregistered!r} fails for each of its 2 configuration(s): ")
    assert "Keras cannot save this model and load it back" in message and "best_model.keras" in message
    assert "tests.training.test_model_check.Bomb is not registered with Keras" in message
    assert "Fix: decorate it with @keras.saving.register_keras_serializable()" in message
    assert "Defused" not in message and "\n" not in message


def test_a_pbt_mutation_of_an_hparam_that_changes_the_weights_is_refused_and_one_that_does_not_passes():
    from mop_airflow.errors import SpecError
    from mop_airflow.search.pbt import mutations
    from mop_airflow.training.model_check import check_mutations

    cfgs = configs((TOY_MODEL, {"hparams": {"units": 12, "scale": 1.0}}))
    space = {"hparams": {"units": [12], "scale": [1.0]}}
    built = check_mutations(cfgs, mutations({"learning_rate": [0.01, 0.1], "hparams.scale": [0.5, 2.0]}, space),
                            input_shapes=SHAPES, num_classes=3, task="classification")
    assert built == 3  # the builder's own model, then each listed value of the hparam
    with pytest.raises(SpecError) as caught:
        check_mutations(cfgs, mutations({"hparams.units": {"distribution": "int_uniform", "low": 8, "high": 16}}, space),
                        input_shapes=SHAPES, num_classes=3, task="classification")
    assert caught.value.field == "search.adaptive.mutations.hparams.units" and caught.value.value == 8
    assert "changes the weights of model" in str(caught.value) and "units=12" in str(caught.value)
