"""The hop state: every model and optimizer variable, restored exactly or refused with a reason."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mop_airflow.errors import TrainingError
from mop_airflow.training.builder import build_model
from mop_airflow.training.checkpoint import arrays_in_place, pack_state, restore_state, state_to_bytes, take_state
from mop_airflow.training.hop import train_on_shard
from tests.training.toys import make_config


@pytest.fixture(scope="module")
def trained(toy_data):
    """A toy model after one hop of 13 Adam steps, and its state bytes."""
    x, y = toy_data
    model = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=3)
    train_on_shard(model, x, y, batch_size=8, epochs=1, seed=3, iteration=0, shard=0)
    return model, state_to_bytes(model, {"config_id": "c000-test00", "t": 0})


def test_optimizer_state_survives_a_hop_exactly(trained):
    model, data = trained
    fresh = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=99)
    assert int(fresh.optimizer.iterations.numpy()) == 0

    meta = restore_state(fresh, data)

    assert meta == {"config_id": "c000-test00", "t": 0}
    assert int(fresh.optimizer.iterations.numpy()) == 13  # ceil(100 / 8) steps
    for saved, restored in zip(model.optimizer.variables, fresh.optimizer.variables, strict=True):
        assert np.array_equal(saved.numpy(), restored.numpy()), saved.path
    moments = [v for v in fresh.optimizer.variables if v.path.endswith(("momentum", "velocity"))]
    assert len(moments) == 2 * len(fresh.trainable_variables) and all(np.any(v.numpy()) for v in moments)


def test_every_model_variable_survives_including_batchnorm_statistics_and_dropout_seed(trained):
    model, data = trained
    fresh = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=99)
    restore_state(fresh, data)
    for saved, restored in zip(model.variables, fresh.variables, strict=True):
        assert np.array_equal(saved.numpy(), restored.numpy()), saved.path
    assert {"moving_mean", "moving_variance", "seed_generator_state"} <= {v.name for v in fresh.variables}


def test_the_bytes_are_a_plain_npz_without_pickle(trained):
    _, data = trained
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        assert "meta" in archive.files and any(name.startswith("optimizer/") for name in archive.files)


def test_a_shape_mismatch_names_the_variable_and_both_shapes(trained):
    _, data = trained
    wider = build_model(make_config(hparams={"units": 16}), input_shapes={"features": (6,)}, num_classes=3, seed=0)
    before = [v.numpy() for v in wider.variables]
    with pytest.raises(TrainingError) as caught:
        restore_state(wider, data)
    message = str(caught.value)
    assert "model variable #0" in message and "kernel" in message
    assert "checkpoint has shape (6, 12), model has shape (6, 16)" in message
    # nothing was half-assigned
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, wider.variables))


def test_a_variable_count_mismatch_is_refused(trained):
    _, data = trained
    other = build_model(make_config("mop_airflow.examples.mnist1d_models:mlp", hparams={"units": [12]}),
                        input_shapes={"features": (6,)}, num_classes=3, seed=0)
    with pytest.raises(TrainingError, match=r"checkpoint holds 9 model variables but the model has 4"):
        restore_state(other, data)


def test_bytes_that_are_not_a_checkpoint_are_refused(trained):
    model, data = trained
    for garbage in (b"not a checkpoint", data[: len(data) // 2]):
        with pytest.raises(TrainingError, match="not a readable mop_airflow checkpoint"):
            restore_state(model, garbage)


class _Payload:
    """Unpickling this would run code (it records that it did)."""

    ran = False

    def __reduce__(self):
        return (_mark_ran, ())


def _mark_ran():
    _Payload.ran = True
    return "ran"


def test_a_checkpoint_holding_a_pickled_object_is_refused_without_running_it(trained):
    model, data = trained
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    arrays["model/00000"] = np.array([_Payload()], dtype=object)  # what a tampered checkpoint could carry
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    before = [v.numpy().copy() for v in model.variables]
    with pytest.raises(TrainingError, match="not a readable mop_airflow checkpoint"):
        restore_state(model, buffer.getvalue())
    assert not _Payload.ran  # loading ran no code
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.variables))  # and changed nothing


def test_a_warm_start_under_a_new_learning_rate_restores_the_weights_and_resets_the_optimizer(trained, toy_data):
    model, data = trained
    tuned = build_model(make_config(optimizer_params={"learning_rate": 0.001}), input_shapes={"features": (6,)},
                        num_classes=3, seed=99)
    restore_state(tuned, data, optimizer=False)
    for saved, restored in zip(model.variables, tuned.variables, strict=True):
        assert np.array_equal(saved.numpy(), restored.numpy()), saved.path
    # the new configuration's optimizer as built: its own learning rate, step 0, no moments
    assert float(tuned.optimizer.learning_rate.numpy()) == pytest.approx(0.001)
    assert int(tuned.optimizer.iterations.numpy()) == 0
    assert not any(np.any(v.numpy()) for v in tuned.optimizer.variables if v.path.endswith(("momentum", "velocity")))
    # ... and it is the learning rate in effect: one Adam step moves each weight by about lr
    x, y = toy_data
    before = [v.numpy().copy() for v in tuned.trainable_variables]
    tuned.train_on_batch(x[:8], y[:8])
    steps = [np.max(np.abs(v.numpy() - b)) for v, b in zip(tuned.trainable_variables, before)]
    assert max(steps) == pytest.approx(0.001, rel=0.05)
    # restoring everything, as a hop of the same configuration does, brings back the old rate
    same = build_model(make_config(optimizer_params={"learning_rate": 0.001}), input_shapes={"features": (6,)},
                       num_classes=3, seed=99)
    restore_state(same, data)
    assert float(same.optimizer.learning_rate.numpy()) == pytest.approx(0.01)


def test_a_taken_state_packs_to_the_bytes_of_its_moment_after_the_model_trains_on(toy_data):
    """The shard loop takes a hop's state out of the model, trains the next configuration in the same
    model, and packs the taken state on its writer thread later: what it packs is the state as taken."""
    x, y = toy_data
    model = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=3)
    train_on_shard(model, x, y, batch_size=8, epochs=1, seed=3, iteration=0, shard=0)
    meta = {"config_id": "c000-test00", "t": 0}
    then = state_to_bytes(model, meta)
    taken = take_state(model)
    other = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=7)
    restore_state(model, state_to_bytes(other, meta))  # the next configuration in the same model
    train_on_shard(model, x, y, batch_size=8, epochs=1, seed=4, iteration=1, shard=1)
    assert state_to_bytes(model, meta) != then
    assert pack_state(taken, meta) == then


def test_a_verified_restore_reads_thearrays_in_place_and_restores_the_same_state(trained):
    """With its digest checked (``verify``), a hop's input is read where its arrays lie in the archive,
    without np.load's copies and CRC-32s: every array as np.load reads it, writable and the model's own."""
    model, data = trained
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        loaded = {key: archive[key] for key in archive.files}
    in_place = arrays_in_place(data)
    assert in_place.keys() == loaded.keys()
    for key, value in loaded.items():
        assert in_place[key].dtype == value.dtype and np.array_equal(in_place[key], value), key
        assert in_place[key].flags.writeable  # a copy of the bytes, not the immutable bytes themselves
    views = arrays_in_place(data, copy=False)  # for values copied to a device at once: views into the bytes
    assert all(np.array_equal(views[key], value) and not views[key].flags.writeable for key, value in loaded.items())
    checked = []
    fresh = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=99)
    assert restore_state(fresh, data, verify=lambda: checked.append(True)) == {"config_id": "c000-test00", "t": 0}
    assert checked == [True]
    for saved, restored in zip([*model.variables, *model.optimizer.variables],
                               [*fresh.variables, *fresh.optimizer.variables], strict=True):
        assert np.array_equal(saved.numpy(), restored.numpy()), saved.path


def test_a_restore_whose_digest_check_fails_assigns_nothing(trained):
    model, data = trained
    fresh = build_model(make_config(), input_shapes={"features": (6,)}, num_classes=3, seed=99)
    before = [v.numpy().copy() for v in [*fresh.variables, *fresh.optimizer.variables]]

    def corrupt():
        raise TrainingError("checkpoint x is corrupt")

    with pytest.raises(TrainingError, match="is corrupt"):
        restore_state(fresh, data, verify=corrupt)
    after = [v.numpy() for v in [*fresh.variables, *fresh.optimizer.variables]]
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_verified_restore_refuses_bytes_that_are_not_a_checkpoint(trained):
    model, data = trained
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    compressed = io.BytesIO()
    np.savez_compressed(compressed, **arrays)  # a valid .npz, but not one pack_state writes
    arrays["model/00000"] = np.array([_Payload()], dtype=object)
    pickled = io.BytesIO()
    np.savez(pickled, **arrays)
    for garbage in (b"not a checkpoint", data[: len(data) // 2], compressed.getvalue(), pickled.getvalue()):
        with pytest.raises(TrainingError, match="not a readable mop_airflow checkpoint"):
            restore_state(model, garbage, verify=lambda: None)
    assert not _Payload.ran
