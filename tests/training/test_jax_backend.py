"""A hop on Keras's JAX backend: each hop task process compiles its model's steps once per worker,
not once per hop, through the compilation cache in the worker's cache folder.

Each hop runs in a fresh process (KERAS_BACKEND is fixed when Keras is imported, and a hop task is a
process of its own), on JAX's CPU backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mop_airflow.data.shard import shard_dataset
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store

from .toys import toy_spec

pytest.importorskip("jax")
REPO = Path(__file__).resolve().parents[2]

HOP = """
import json, sys
from mop_airflow.records import Assignment, Manifest, RunRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.training.model_hop import run_hop
from mop_airflow.training.session import TaskSession
from mop_airflow.training.steps import on_device

root, run_uri, manifest_uri, cache_dir = sys.argv[1:]
store = Store(root)
run = RunRecord.read(store, run_uri)
manifest = Manifest.read(store, manifest_uri)
cid = run.configs[0]["config_id"]
session = TaskSession(run, manifest, cache_dir)
record, out = run_hop(RunLayout(store, run.dag_id, run.run_id), run, manifest, Assignment(cid, -1, None), t=0,
                      shard=0, cache_dir=cache_dir, session=session, rung_end=True)
import keras
print(json.dumps({"backend": keras.config.backend(), "threads": record.threads, "loss": record.train_metrics["loss"],
                  "val": record.val_metrics, "checkpoint_sha256": record.checkpoint_sha256,
                  "tensorflow": "tensorflow" in sys.modules,
                  "on_device": [on_device(x) and on_device(y) for x, y in session._arrays.values()]}))
"""


@pytest.fixture
def runs(tmp_path, toy_data):
    """Three runs of the same spec: the same hop trains in each."""
    spec = toy_spec(tmp_path, *toy_data, cache="shards", learning_rates=(1e-2,), iterations=1)
    store = Store(spec["store"]["root"])
    uris = []
    for run_id in ("r1", "r2", "r3"):
        run = resolve_run(spec, None, dag_id="d", run_id=run_id)
        uris.append(run.write(store, RunLayout(store, "d", run_id).run_record_uri))
    manifest = shard_dataset(run.data, store, "d", 2, run.schedule.seed)
    return store.root, uris, manifest.write(store, f"{store.root}/manifest.json")


def hop_process(root: str, run_uri: str, manifest_uri: str, cache_dir: Path, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", HOP, root, run_uri, manifest_uri, str(cache_dir)],
                          env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
                               **env}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def cached(folder: Path) -> set[str]:
    return {p.name for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


def test_a_second_hop_process_loads_the_compiled_steps_and_trains_to_the_same_bits(runs, tmp_path):
    root, (first_run, second_run, third_run), manifest = runs
    cache_dir = tmp_path / "worker-cache"
    folder = cache_dir / "jax-compilation"

    first = hop_process(root, first_run, manifest, cache_dir)
    assert first["backend"] == "jax" and first["threads"] is None  # TensorFlow's pools are not touched
    assert not first["tensorflow"]  # nor imported: 2.4 s and hundreds of MB a slot process
    assert first["loss"] == first["loss"] and first["loss"] > 0     # trained: a finite, positive loss
    entries = cached(folder)
    assert entries, "the first hop process wrote no compiled step to the cache"

    # the same hop in a new process: every step it compiles is already there, and the executables it
    # loads train exactly as the ones it would have compiled
    second = hop_process(root, second_run, manifest, cache_dir)
    assert cached(folder) == entries
    assert second["checkpoint_sha256"] == first["checkpoint_sha256"]

    # the cache turned off: nothing written, the same result
    off_dir = tmp_path / "off-cache"
    third = hop_process(root, third_run, manifest, off_dir, MOP_COMPILATION_CACHE="0")
    assert not (off_dir / "jax-compilation").exists()
    assert third["checkpoint_sha256"] == first["checkpoint_sha256"]


def test_on_jax_a_shard_held_on_the_device_trains_and_evaluates_to_the_same_bits(runs, tmp_path):
    """On an accelerator a slot keeps its shard and the validation rows in the device's memory and gathers
    each pass's batches there: the same rows in the same order, so the same checkpoint and metrics as
    from host arrays (forced here on JAX's CPU backend, where they stay on the host by default)."""
    root, (first_run, second_run, _), manifest = runs
    on_host = hop_process(root, first_run, manifest, tmp_path / "cache-1")
    on_device = hop_process(root, second_run, manifest, tmp_path / "cache-2", MOP_DEVICE_ARRAYS="1")
    assert on_host["on_device"] == [False, False] and on_device["on_device"] == [True, True]  # shard, validation
    assert on_device["val"] == on_host["val"] and on_host["val"]["val_loss"] > 0
    assert on_device["checkpoint_sha256"] == on_host["checkpoint_sha256"]


SEEDS = """
import json, random, sys
import numpy as np
import keras
from mop_airflow.training.builder import set_random_seed

def draws():  # Python's, NumPy's, and Keras's global seed generator (what an unseeded layer draws from)
    return [random.random(), float(np.random.rand()), keras.ops.convert_to_numpy(keras.random.normal((4,))).tolist()]

keras.random.normal((2,))  # the global seed generator exists: seeding must reset it
set_random_seed(11)
ours, imported = draws(), "tensorflow" in sys.modules
keras.utils.set_random_seed(11)
print(json.dumps({"ours": ours, "keras": draws(), "tensorflow": imported}))
"""


def test_on_jax_seeding_draws_what_keras_seeding_draws_without_importing_tensorflow():
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", SEEDS], env=env, capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ours"] == result["keras"] and not result["tensorflow"]


STEPWISE = """
import json, sys
import numpy as np
import keras
from mop_airflow.training.builder import build_model
from mop_airflow.training.steps import evaluate_arrays, stepwise_supported, train_pass

rng = np.random.default_rng(0)
x = rng.normal(size=(100, 6)).astype("float64")  # cast to floatx as fit casts it
y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")
config = {"config_id": "c", "model": "tests.training.toys:batchnorm_dropout_mlp", "hparams": {},
          "optimizer": "adam", "optimizer_params": {"learning_rate": 0.01},
          "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"], "batch_size": 16, "epochs_per_hop": 1}

def fresh():
    return build_model(config, input_shapes={"x": (6,)}, num_classes=3, seed=3)

ours, theirs = fresh(), fresh()
assert stepwise_supported(ours)
logs = []
for epoch in range(3):  # 100 rows in batches of 16: a partial last batch every pass
    order = np.random.default_rng(epoch).permutation(100)
    mine = train_pass(ours, x[order], y[order], batch_size=16)
    ref = theirs.fit(x[order], y[order], batch_size=16, epochs=1, shuffle=False, verbose=0).history
    logs.append([mine, {k: float(v[-1]) for k, v in ref.items()}])
same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
           [*zip(ours.variables, theirs.variables), *zip(ours.optimizer.variables, theirs.optimizer.variables)])
evaluated = [evaluate_arrays(ours, x, y, batch_size=32), theirs.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)]
print(json.dumps({"backend": keras.config.backend(), "same": same, "logs": logs,
                  "evaluated": [{k: float(v) for k, v in e.items()} for e in evaluated]}))
"""


def test_on_jax_a_pass_through_the_jitted_step_equals_fit_bit_for_bit():
    """Three passes of a model with BatchNorm and dropout, a partial last batch each, and an evaluation:
    the JAX backend's jitted train and test functions called batch by batch give fit's and evaluate's
    variables and metrics exactly, without fit's epoch iterator and callbacks."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", STEPWISE], env=env, capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["backend"] == "jax" and result["same"]
    for mine, ref in result["logs"]:
        assert mine == ref
    mine, ref = result["evaluated"]
    assert mine == ref


TAKEN = """
import json
import numpy as np
from mop_airflow.training.builder import build_model
from mop_airflow.training.checkpoint import pack_state, restore_state, state_to_bytes, take_state
from mop_airflow.training.steps import train_pass

rng = np.random.default_rng(0)
x = rng.normal(size=(100, 6)).astype("float32")
y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")
config = {"config_id": "c", "model": "tests.training.toys:batchnorm_dropout_mlp", "hparams": {},
          "optimizer": "adam", "optimizer_params": {"learning_rate": 0.01},
          "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"], "batch_size": 16, "epochs_per_hop": 1}
model = build_model(config, input_shapes={"x": (6,)}, num_classes=3, seed=3)
train_pass(model, x, y, batch_size=16)
meta = {"config_id": "c", "t": 0}
then = state_to_bytes(model, meta)
taken = take_state(model)
restore_state(model, state_to_bytes(build_model(config, input_shapes={"x": (6,)}, num_classes=3, seed=7), meta))
train_pass(model, x[::-1], y[::-1], batch_size=16)  # the train step donates the arrays it is given
print(json.dumps({"device_arrays": not isinstance(taken["model"][0], np.ndarray),
                  "moved_on": state_to_bytes(model, meta) != then, "same": pack_state(taken, meta) == then}))
"""


def test_on_jax_a_taken_state_packs_to_the_bytes_of_its_moment_after_the_model_trains_on():
    """On JAX the shard loop keeps a hop's state as the device arrays it was (no copy on the training
    thread) and packs them on its writer thread while the same model trains the next configuration:
    they still hold the state as taken, though JAX's train step donates the arrays it is given."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", TAKEN], env=env, capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"device_arrays": True, "moved_on": True, "same": True}
