"""Shard slots on one machine compile each JAX step once between them: the first to need it holds a
lock while it compiles, the others then load it from the persistent cache. It only orders
compilations: the checkpoints come out bit for bit the same with it and without it, and a lock
wait is bounded."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import time

import numpy as np
import pytest

from mop_airflow.training import shared_compile

from .test_shard_loop import SHARDS, _setup, _shas, _slots_in_processes


def test_a_step_takes_the_lock_only_for_new_batch_shapes_and_runs_on_the_same_data(tmp_path):
    calls = []

    def step(state, batches):
        batch = next(batches)
        calls.append((state, batch[0].shape, [b[0].shape for b in batches]))
        return {"n": len(calls)}, state + 1

    guarded = shared_compile._guarded(step, "train k", str(tmp_path), 1.0)
    full, part = (np.zeros((8, 3)), np.zeros(8)), (np.zeros((5, 3)), np.zeros(5))
    assert guarded(0, iter([full])) == ({"n": 1}, 1)
    guarded(1, iter([full, part]))
    guarded(2, iter([part]))
    assert calls == [(0, (8, 3), []), (1, (8, 3), [(5, 3)]), (2, (5, 3), [])]
    assert len(list((tmp_path / "locks").glob("compile-*.lock"))) == 2  # one per batch shape, not per call
    with pytest.raises(StopIteration):  # an exhausted iterator ends the step as Keras's own does
        guarded(3, iter([]))


def test_a_lock_wait_is_bounded(tmp_path):
    path = str(tmp_path / "locks" / "compile-x.lock")
    os.makedirs(os.path.dirname(path))
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process compiling, or hung
    began = time.monotonic()
    with shared_compile._held(path, 0.3) as held:
        assert held.fd is None  # runs without the lock
    assert 0.3 <= time.monotonic() - began < 2
    os.close(holder)
    with shared_compile._held(path, 0.3) as held:
        assert held.fd is not None


@pytest.mark.integration
@pytest.mark.slow
def test_slots_on_jax_train_the_same_bits_with_shared_compilation_and_without(toy_data, tmp_path, monkeypatch):
    slots = 2
    pytest.importorskip("jax")
    # the slot processes are spawned, not forked from the tests' forkserver (Keras on TensorFlow, and the
    # environment it started with): a fresh Keras on JAX, with the switch below
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    spawned = multiprocessing.get_context("spawn")
    shas, locks = {}, {}
    for switch in ("1", "0"):
        name = f"shared-{switch}"
        monkeypatch.setenv(shared_compile.SHARED_COMPILE_ENV, switch)
        run, layout, _ = _setup(tmp_path, toy_data, name)
        assert _slots_in_processes(tmp_path, toy_data, name, slots=slots, context=spawned) == {
            (s, k): 0 for s in range(SHARDS) for k in range(slots)}
        shas[switch] = _shas(run, layout)
        locks[switch] = list((tmp_path / f"{name}-cache").rglob("compile-*.lock"))
    assert locks["1"] and not locks["0"]
    assert shas["1"] == shas["0"]
