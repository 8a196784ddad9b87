"""Per-configuration cost inside a bundle hop: ``model.fit``/``model.evaluate`` against the stepwise path.

A bundle's hop trains its configurations one after another in one compiled model (the task
session restores each configuration's state into it). This script does just that for ``--configs``
configurations of one model key (learning rates and batch sizes differ) on one in-memory shard,
once through ``model.fit``/``model.evaluate`` (``stepwise=False``, the previous path) and once
batch by batch on the traced step (the default), interleaved in one process, and prints per
configuration:
  train      train_on_shard's train_seconds (all passes)
  evaluate   evaluate on the validation rows
  floor      the same train and test steps called on prepared tensors with nothing around them:
             the training and evaluation themselves
  overhead   train + evaluate - floor
It checks that both paths give every configuration the same loss and validation metrics, and
times a configuration on a fresh model (tracing included) separately. One TensorFlow thread, as a
hop runs on the embedded Airflow.

``--bundle-hop`` also runs the whole bundle hop (run_slot over one hop: shard cache, checkpoints, hop
records in a file store) on the sklearn digits, a fresh task session per hop, both ways, and
compares the configurations' checkpoints byte for byte.

    python benchmarks/bundle_overhead.py [--configs 24] [--data digits|mnist1d] [--model mlp|cnn]
                                         [--shards 4] [--passes 1] [--reps 3] [--bundle-hop]
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from mop_airflow.training.session import apply_threads  # noqa: E402

RATES = (1e-3, 3e-3, 1e-2, 3e-2)
BATCHES = (16, 32, 64)


def load(data: str, shards: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """One shard's rows and the validation rows: (x, y, x_val, y_val, classes)."""
    if data == "digits":
        from sklearn.datasets import load_digits  # noqa: PLC0415

        digits = load_digits()
        x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("int64")
    else:
        from mnist1d.data import get_dataset_args, make_dataset  # noqa: PLC0415

        args = get_dataset_args()
        args.num_samples = 20000
        made = make_dataset(args)
        x, y = made["x"].astype("float32"), made["y"].astype("int64")
    order = np.random.default_rng(0).permutation(len(y))
    held = len(y) // 5
    val, train = order[:held], order[held:]
    shard = np.array_split(train, shards)[0]
    return x[shard], y[shard], x[val], y[val], int(y.max()) + 1


def configurations(count: int, model: str, passes: int) -> list[dict]:
    builder = f"mop_airflow.examples.mnist1d_models:{model}"
    hparams = {"units": [64, 64]} if model == "mlp" else {"filters": 16, "conv_layers": 2}
    grid = itertools.cycle(itertools.product(RATES, BATCHES))
    return [{"config_id": f"c{i:03d}", "model": builder, "hparams": hparams, "optimizer": "adam",
             "optimizer_params": {"learning_rate": rate}, "loss": "sparse_categorical_crossentropy",
             "metrics": ["accuracy"], "batch_size": batch, "epochs_per_hop": passes}
            for i, (rate, batch) in zip(range(count), grid)]


def build(config: dict, dim: int, classes: int):
    from mop_airflow.training.builder import build_model  # noqa: PLC0415

    return build_model(config, input_shapes={"features": (dim,)}, num_classes=classes, seed=0)


def start(model, initial: list[np.ndarray], config: dict) -> None:
    """What the session does for a configuration's first hop in a reused model: its own initial state."""
    for variable, value in zip([*model.variables, *model.optimizer.variables], initial):
        variable.assign(value)
    model.optimizer.learning_rate.assign(config["optimizer_params"]["learning_rate"])


def one_configuration(model, config: dict, shard: tuple, *, stepwise: bool) -> dict:
    from mop_airflow.training.hop import evaluate, train_on_shard  # noqa: PLC0415

    x, y, xv, yv = shard
    train = train_on_shard(model, x, y, batch_size=config["batch_size"], epochs=config["epochs_per_hop"], seed=0,
                           iteration=0, shard=0, stepwise=stepwise)
    began = time.perf_counter()
    val = evaluate(model, xv, yv, batch_size=max(config["batch_size"], 256), stepwise=stepwise)
    return {"train": train["train_seconds"], "evaluate": time.perf_counter() - began,
            "result": (train["loss"], train["accuracy"], val["val_loss"], val["val_accuracy"])}


def floor(model, config: dict, shard: tuple) -> float:
    """The train and test steps alone, on tensors made beforehand, one sync at the end."""
    import tensorflow as tf  # noqa: PLC0415

    x, y, xv, yv = shard
    size, passes = config["batch_size"], config["epochs_per_hop"]
    train = [(tf.constant(x[i:i + size]), tf.constant(y[i:i + size])) for i in range(0, len(y), size)]
    size = max(size, 256)
    test = [(tf.constant(xv[i:i + size]), tf.constant(yv[i:i + size])) for i in range(0, len(yv), size)]
    began = time.perf_counter()
    for _ in range(passes):
        for batch in train:
            logs = model.train_function(iter([batch]))
    for batch in test:
        logs = model.test_function(iter([batch]))
    float(logs["loss"])
    return time.perf_counter() - began


def bundle(model, initial, configs, shard, *, stepwise: bool) -> list[dict]:
    out = []
    for config in configs:
        start(model, initial, config)
        row = one_configuration(model, config, shard, stepwise=stepwise)
        start(model, initial, config)
        row["floor"] = floor(model, config, shard)
        out.append(row)
    return out


def bundle_hops(count: int, passes: int, home: Path, store: str, *,
                stepwise: bool) -> tuple[list[float], dict[str, str]]:
    """Two bundle hops (the second ends the iteration: it evaluates) of ``count`` configurations, as a
    hop task runs them; returns each hop's wall seconds and every configuration's last checkpoint sha256."""
    import functools  # noqa: PLC0415

    from mop_airflow.data.shard import shard_dataset  # noqa: PLC0415
    from mop_airflow.examples.sklearn_data import digits_data_spec, write_digits  # noqa: PLC0415
    from mop_airflow.records.layout import RunLayout  # noqa: PLC0415
    from mop_airflow.records import Assignment  # noqa: PLC0415
    from mop_airflow.planning.resolve import resolve_run  # noqa: PLC0415
    from mop_airflow.store import Store  # noqa: PLC0415
    from mop_airflow.training import hop  # noqa: PLC0415
    from mop_airflow.training.shard_loop import block_hops, run_slot, state_after  # noqa: PLC0415

    if not (home / "data").exists():
        write_digits(str(home / "data"))
    rates = [float(r) for r in np.geomspace(1e-3, 3e-2, max(1, count // len(BATCHES)))]
    spec = {"data": digits_data_spec(str(home / "data")),
            "search": {"space": {"method": "grid", "params": {
                "model": ["mop_airflow.examples.image_models:flat_mlp"], "learning_rate": rates,
                "batch_size": list(BATCHES), "epochs_per_hop": [passes]}}},
            "schedule": {"shards": 2, "iterations": 1, "seed": 3, "threads_per_hop": 1},
            "store": {"root": f"file://{home / store}", "cache_dir": str(home / "cache")}}
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", 2, run.schedule.seed)
    originals = hop.train_on_shard, hop.evaluate
    # run_hop imports these from the hop module when it runs: the previous path is fit/evaluate
    hop.train_on_shard = functools.partial(originals[0], stepwise=stepwise)
    hop.evaluate = functools.partial(originals[1], stepwise=stepwise)
    try:
        bundle = [Assignment(c["config_id"], -1, None) for c in run.configs]  # one class, taken in turn
        walls, sha = [], {}
        for t in range(2):
            began = time.perf_counter()
            hops = block_hops([bundle], shards=2, slots=1, start=t, end=t + 1)
            done = run_slot(layout, run, manifest, hops, mine=hops, block=f"hop-{t}", shard=t, slot=0,
                            cache_dir=run.store.local_cache)
            walls.append(time.perf_counter() - began)
            assert not done.failed, done.failed
            bundle = [state_after(r) for r in done.trained]
            sha = {r.config_id: r.checkpoint_sha256 for r in done.trained}
    finally:
        hop.train_on_shard, hop.evaluate = originals
    return walls, sha


def report_bundle_hops(count: int, passes: int) -> bool:
    import tempfile  # noqa: PLC0415

    home = Path(tempfile.mkdtemp(prefix="mop-bundle-overhead-"))
    bundle_hops(count, passes, home, "warm", stepwise=True)  # writes the data, its shards and the cache once
    walls: dict[str, list[list[float]]] = {"fit": [], "stepwise": []}
    sha: dict[str, dict[str, str]] = {}
    for i, name in enumerate(("fit", "stepwise", "stepwise", "fit")):  # ABBA: drifting load hits both alike
        hop_walls, sha[name] = bundle_hops(count, passes, home, f"{name}{i}", stepwise=name == "stepwise")
        walls[name].append(hop_walls)
    n = len(sha["fit"])
    print(f"\nwhole bundle hops (run_slot over one hop, digits flat_mlp, {n} configurations, a fresh task session per hop, "
          "hop 2 evaluates), seconds per configuration, mean of 2 runs per path (ABBA):")
    for name, runs in walls.items():
        first, second = (statistics.mean(run[hop] for run in runs) for hop in (0, 1))
        print(f"  {name:<9} hop 1 {first / n:6.3f}   hop 2 {second / n:6.3f}   (bundle: {first:.2f}s, {second:.2f}s)")
    same = sha["fit"] == sha["stepwise"]
    print(f"every configuration's checkpoint identical on both paths (sha256): {same}")
    return same


def machine() -> str:
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    load1, load5, _ = os.getloadavg()
    return (f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, TensorFlow {tf.__version__}, Keras {keras.__version__}, "
            f"load average {load1:.1f} (1 min) {load5:.1f} (5 min)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=24)
    parser.add_argument("--data", choices=("digits", "mnist1d"), default="digits")
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--passes", type=int, default=1, help="epochs_per_hop")
    parser.add_argument("--reps", type=int, default=3, help="bundle hops per path, interleaved")
    parser.add_argument("--bundle-hop", action="store_true", help="also time whole bundle hops with their store")
    args = parser.parse_args()
    threads = apply_threads(1)
    x, y, xv, yv, classes = load(args.data, args.shards)
    shard = (x, y, xv, yv)
    configs = configurations(args.configs, args.model, args.passes)
    print(f"machine: {machine()}; TensorFlow intra-op threads {threads}")
    print(f"{args.configs} configurations of one compiled {args.model} ({args.data}: shard of {len(y)} rows, "
          f"{len(yv)} validation rows, {args.passes} pass(es) per hop, "
          f"batch sizes {sorted({c['batch_size'] for c in configs})})")

    paths = {"fit": False, "stepwise": True}
    build(configs[0], x.shape[1], classes)  # TensorFlow's and Keras's one-time start-up, paid by neither path
    models, initial, fresh = {}, None, {}
    for name, stepwise in paths.items():  # a fresh model per path: its first configuration traces
        began = time.perf_counter()
        models[name] = build(configs[0], x.shape[1], classes)
        initial = initial or [v.numpy() for v in [*models[name].variables, *models[name].optimizer.variables]]
        built = time.perf_counter()
        row = one_configuration(models[name], configs[0], shard, stepwise=stepwise)
        fresh[name] = (built - began, row["train"], row["evaluate"])
        floor(models[name], configs[0], shard)  # traces the bare steps the floor calls, outside the figures
    rows: dict[str, list[dict]] = {name: [] for name in paths}
    for rep in range(args.reps):  # alternate which path goes first, so drifting load hits both alike
        for name in (list(paths) if rep % 2 == 0 else list(paths)[::-1]):
            rows[name].extend(bundle(models[name], initial, configs, shard, stepwise=paths[name]))

    same = all(a["result"] == b["result"] for a, b in zip(rows["fit"], rows["stepwise"]))
    print(f"every configuration's loss, accuracy, val_loss, val_accuracy identical on both paths: {same}")
    print("\nfresh model, first configuration (build / train incl. tracing / evaluate incl. tracing), seconds:")
    for name, (built, train, evaluate) in fresh.items():
        print(f"  {name:<9} {built:6.3f} / {train:6.3f} / {evaluate:6.3f}")
    print(f"\nreused model, per configuration, median of {args.reps} x {args.configs} (seconds):")
    print(f"  {'path':<9} {'train':>7} {'evaluate':>9} {'floor':>7} {'overhead':>9} {'p90 overhead':>13}")
    overhead = {}
    for name, done in rows.items():
        extra = sorted(r["train"] + r["evaluate"] - r["floor"] for r in done)
        overhead[name] = statistics.median(extra)
        print(f"  {name:<9} {statistics.median(r['train'] for r in done):7.3f} "
              f"{statistics.median(r['evaluate'] for r in done):9.3f} "
              f"{statistics.median(r['floor'] for r in done):7.3f} "
              f"{overhead[name]:9.3f} {extra[int(0.9 * (len(extra) - 1))]:13.3f}")
    total = {name: sum(r["train"] + r["evaluate"] for r in done) / args.reps for name, done in rows.items()}
    print(f"\nbundle hop of {args.configs} configurations (train + evaluate): fit {total['fit']:.2f}s, "
          f"stepwise {total['stepwise']:.2f}s; overhead per configuration cut by "
          f"{1 - overhead['stepwise'] / overhead['fit']:.0%}")
    if args.bundle_hop:
        same = report_bundle_hops(args.configs, args.passes) and same
    print(f"machine at the end: {machine()}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
