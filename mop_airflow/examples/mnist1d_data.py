"""MNIST-1D (Greydanus, 2020) as Parquet files for the examples: 40 numeric features, 10 classes.

Generated offline with the ``mnist1d`` package's own ``make_dataset`` (its ``get_dataset`` would
download a pickle instead). Small enough to train in seconds, hard enough that model choice matters.
"""

from __future__ import annotations

import json
import os
import random
import uuid

import numpy as np

from mop_airflow.examples.mnist1d_spec import TEST_FILE, TRAIN_FILE
SIDECAR_FILE = "mnist1d.json"  # written last: names the parameters the two files were made with


def write_mnist1d(directory: str, num_samples: int = 20000, seed: int = 42) -> dict:
    """Write ``mnist1d_train.parquet`` and ``mnist1d_test.parquet`` (``x0..x39`` float32, ``label`` int64).

    Does nothing when both files exist and were made with the same ``num_samples`` and ``seed``.
    Returns ``{"train": path, "test": path, "rows": {"train": n, "test": m}}``.
    """
    directory = os.path.abspath(os.path.expanduser(directory))
    paths = {"train": os.path.join(directory, TRAIN_FILE), "test": os.path.join(directory, TEST_FILE)}
    sidecar = os.path.join(directory, SIDECAR_FILE)
    made = _read_sidecar(sidecar)
    if (made.get("num_samples") == num_samples and made.get("seed") == seed
            and all(os.path.exists(p) for p in paths.values())):
        return {**paths, "rows": made["rows"]}

    dataset = _generate(num_samples, seed)
    os.makedirs(directory, exist_ok=True)
    if os.path.exists(sidecar):  # it must not vouch for half-replaced files if we crash below
        os.unlink(sidecar)
    rows = {
        "train": _write_split(paths["train"], dataset["x"], dataset["y"]),
        "test": _write_split(paths["test"], dataset["x_test"], dataset["y_test"]),
    }
    _write_atomic(sidecar, json.dumps({"num_samples": num_samples, "seed": seed, "rows": rows}).encode())
    return {**paths, "rows": rows}


def _generate(num_samples: int, seed: int) -> dict:
    from mnist1d.data import get_dataset_args, make_dataset  # noqa: PLC0415 - imports scipy and matplotlib

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = seed
    # make_dataset reseeds the global `random` and numpy generators; restore them so the caller's
    # random streams (e.g. a seeded search in the same process) are not silently reset.
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        return make_dataset(args)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def _write_split(path: str, x: np.ndarray, y: np.ndarray) -> int:
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    columns = {f"x{i}": pa.array(x[:, i].astype(np.float32)) for i in range(x.shape[1])}
    columns["label"] = pa.array(y.astype(np.int64))
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        pq.write_table(pa.table(columns), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return int(len(y))


def _write_atomic(path: str, payload: bytes) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "wb") as handle:
        handle.write(payload)
    os.replace(tmp, path)


def _read_sidecar(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):  # absent or half-written: regenerate
        return {}
