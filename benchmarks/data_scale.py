"""The data path's tasks on synthetic sources of growing size: wall time, MB/s and peak RSS per step.

    python benchmarks/data_scale.py                       # 0.5 and 2 GB, tabular, tensor, PNG and folder images
    python benchmarks/data_scale.py --kinds folder        # a folder of PNG files alone
    python benchmarks/data_scale.py --sizes 0.5 2 8       # add 8 GB (about 20 minutes on 2 cores)
    python benchmarks/data_scale.py --kinds tabular --sizes 1 --workers 1 2

Every source is generated into a temporary folder (deleted at the end, with the store and the
shard cache); all but the last are folders of ~128 MB Parquet files:

- ``tabular``: 64 float32 feature columns and an integer label;
- ``tensor``: 32x32x3 uint8 images as a fixed-size list column;
- ``png``: the same kind of images as PNG bytes (decoded on the worker);
- ``folder``: the same PNG images as files, one folder per class (``<label>/<i>.png``): one row
  per file, so files/s is printed too. It has no whole-file read (no table to read).

The steps are the DAG's tasks, each in its own process, so its peak RSS (``VmHWM``) is the
step's alone:

- ``whole-file read``: ``pyarrow.parquet.read_table`` of the whole source, the way the data path
  read it before it streamed: the memory a whole-source reader needs, on the same files;
- ``list_data``: list the files, fingerprint, cut slices of ``--slice-mb`` MB (default 256);
- ``scatter xN``: N worker processes at once, each validating (Great Expectations) and scattering
  every N-th slice, as N Airflow workers would run the mapped ``scatter`` task; wall time is the
  slowest worker's, RSS the largest;
- ``shard``: merge the slices' findings and write the manifest;
- ``stage``: gather shard 0's parts into the worker's cache;
- ``hop``: one small Keras model, one pass over shard 0 (4 shards), by the hop's own rule: streamed
  in windows of an eighth of the batch budget (16 MB) when the shard is larger than a quarter (32 MB).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import header, result  # noqa: E402

FILE_MB = 128
SHARDS = 4


def generate(kind: str, folder: str, gigabytes: float, seed: int = 0) -> tuple[int, int]:
    """Write ``gigabytes`` of ``kind`` into ``folder`` as ~128 MB files; return (rows, bytes on disk)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    if kind == "folder":
        return _generate_folder(folder, gigabytes, rng)
    row_bytes = {"tabular": 64 * 4 + 8, "tensor": 3072 + 8, "png": 3200}[kind]
    rows_per_file = max(1000, FILE_MB * 1_000_000 // row_bytes)
    target = gigabytes * 1e9
    written = rows = index = 0
    while written < target:
        n = rows_per_file
        label = rng.integers(0, 10, n)
        if kind == "tabular":
            x = rng.standard_normal((n, 64), dtype=np.float32) + label[:, None].astype(np.float32) * 0.1
            table = pa.table({**{f"x{i:02d}": x[:, i] for i in range(64)}, "label": label})
        else:
            images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
            if kind == "tensor":
                column = pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1)), 3072)
            else:
                column = pa.array([_png(image) for image in images], type=pa.binary())
            table = pa.table({"image": column, "label": label})
        path = os.path.join(folder, f"part-{index:05d}.parquet")
        # Uncompressed: random data does not compress, and the byte count is then the data's size.
        pq.write_table(table, path, compression="none")
        written += os.path.getsize(path)
        rows += n
        index += 1
    return rows, written


def _generate_folder(folder: str, gigabytes: float, rng: np.random.Generator) -> tuple[int, int]:
    """PNG files in ten class folders, written until they hold ``gigabytes``."""
    for label in range(10):
        os.makedirs(os.path.join(folder, str(label)), exist_ok=True)
    written = rows = 0
    while written < gigabytes * 1e9:
        images = rng.integers(0, 256, (1000, 32, 32, 3), dtype=np.uint8)
        for image in images:
            data = _png(image)
            with open(os.path.join(folder, str(rows % 10), f"{rows:08d}.png"), "wb") as handle:
                handle.write(data)
            written += len(data)
            rows += 1
    return rows, written


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def data_spec(kind: str, source: str) -> dict:
    features = {"tabular": "x*", "tensor": {"image": {"shape": [32, 32, 3]}},
                "png": {"image": {"shape": [32, 32, 3], "decode": "image"}},
                "folder": {"image": {"shape": [32, 32, 3], "decode": "image"}}}[kind]
    classes = [str(c) for c in range(10)] if kind == "folder" else list(range(10))  # folder names are text
    return {"source": source, "label": "label", "features": features, "classes": classes, "validation": 0.1}


# -- the steps, each run in a child process -------------------------------------------------------------
def step(name: str, kind: str, source: str, store_root: str, cache: str, slice_mb: float,
         slices: list[int] | None = None) -> dict:
    from mop_airflow.records import Manifest, ShardingPlan, SliceResult
    from mop_airflow.config import DataSpec
    from mop_airflow.store import Store

    data = DataSpec(**data_spec(kind, source), slice_mb=slice_mb)
    store = Store(store_root)
    plan_uri, manifest_uri = store.uri("bench", "sharding.json"), store.uri("bench", "manifest.json")
    started = time.perf_counter()
    out: dict = {}
    if name == "whole-file read":
        import pyarrow.parquet as pq

        out["rows"] = pq.read_table(source).num_rows
    elif name == "list_data":
        from mop_airflow.data.shard import plan_sharding, write_plan

        plan = plan_sharding(data, store, "bench", SHARDS, 0)
        write_plan(plan, store, plan_uri)
        out["slices"] = len(plan.slices)
    elif name == "scatter":
        from mop_airflow.data.shard import scatter_slice
        from mop_airflow.data.validate import DataChecks

        plan = ShardingPlan.read(store, plan_uri)
        for index in slices or []:
            checks = DataChecks.plan(data, plan.listing, plan.held, shards=SHARDS, max_batch_size=256)
            scatter_slice(plan, data, store, index, checks).write(store, store.uri("bench", f"slice-{index}.json"))
    elif name == "shard":
        from mop_airflow.data.shard import collect_shards
        from mop_airflow.data.validate import DataChecks

        plan = ShardingPlan.read(store, plan_uri)
        results = [SliceResult.read(store, store.uri("bench", f"slice-{k}.json")) for k in range(len(plan.slices))]
        checks = DataChecks.plan(data, plan.listing, plan.held, shards=SHARDS, max_batch_size=256)
        manifest = collect_shards(plan, data, store, results, checks)
        manifest.write(store, manifest_uri)
        out["rows"] = manifest.total_rows + manifest.validation.rows
    elif name == "stage":
        from mop_airflow.data.cache import cached_shard

        cached_shard(store, Manifest.read(store, manifest_uri).shards[0], cache)
    elif name == "hop":
        import keras

        from mop_airflow.data.cache import cached_shard, load_shard, load_table, manifest_inputs
        from mop_airflow.data.inputs import input_shapes
        from mop_airflow.training.hop import train_on_shard, train_streamed
        from mop_airflow.training.model_hop import STREAM_ABOVE_BATCHES, WINDOW_SHARE

        manifest = Manifest.read(store, manifest_uri)
        entry = manifest.shards[0]
        path = cached_shard(store, entry, cache)
        (shape,) = input_shapes(manifest_inputs(manifest)).values()
        model = keras.Sequential([keras.Input(shape), keras.layers.Flatten(),
                                  keras.layers.Rescaling(1 / 255.0) if kind != "tabular" else keras.layers.Identity(),
                                  keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        # The hop's own rule: a shard above a few batch budgets streams, a smaller one is read whole.
        out["streamed"] = entry.bytes > STREAM_ABOVE_BATCHES * data.batch_mb * 1e6
        if out["streamed"]:
            window = max(512, int(entry.rows * WINDOW_SHARE * data.batch_mb * 1e6 / entry.bytes))
            summary = train_streamed(model, path, lambda table: load_table(table, manifest), batch_size=512,
                                     epochs=1, seed=0, iteration=0, shard=0, window_rows=window)
        else:
            x, y = load_shard(path, manifest)
            summary = train_on_shard(model, x, y, batch_size=512, epochs=1, seed=0, iteration=0, shard=0)
        out["rows"] = summary["samples"]
    out["seconds"] = time.perf_counter() - started
    return out


def run_steps(name: str, kind: str, source: str, store_root: str, cache: str, slice_mb: float,
              workers: list[list[int]] | None = None) -> dict:
    """Run a step in fresh processes (one per worker, all at once); each reports its own peak RSS."""
    started = time.perf_counter()
    processes = []
    for slices in workers or [None]:
        args = [sys.executable, __file__, "--step", name, "--kind", kind, "--source", source, "--store", store_root,
                "--cache", cache, "--slice-mb", str(slice_mb)]
        if slices is not None:
            args += ["--slices", ",".join(map(str, slices)) or "none"]
        processes.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}))
    results = []
    for process in processes:
        stdout, stderr = process.communicate()
        if process.returncode != 0:
            return {"error": (stderr.strip().splitlines() or ["?"])[-1][:200]}
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    wall = time.perf_counter() - started
    merged = {k: v for r in results for k, v in r.items()}
    merged["seconds"] = max(r["seconds"] for r in results) if workers else results[0]["seconds"]
    merged["peak_rss_mb"] = max(r["peak_rss_mb"] for r in results)
    return {**merged, "wall": wall}


def _peak_rss_mb() -> float:
    """This process's peak RSS since exec (VmHWM); ru_maxrss would include the forking parent's RSS."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.5, 2.0], help="source sizes in GB")
    parser.add_argument("--kinds", nargs="+", default=["tabular", "tensor", "png", "folder"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="scatter worker counts to compare")
    parser.add_argument("--slice-mb", type=float, default=256.0, help="data.slice_mb: MB of files per scatter task")
    parser.add_argument("--tmp", default=None, help="where to generate (default: the system temp folder)")
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--slices", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        os.chdir(tempfile.gettempdir())  # Great Expectations must not scaffold into the working folder
        slices = [int(k) for k in args.slices.split(",")] if args.slices not in (None, "none") else []
        out = step(args.step, args.kind, args.source, args.store, args.cache, args.slice_mb, slices)
        out["peak_rss_mb"] = _peak_rss_mb()
        print(json.dumps(out))
        return

    header("data_scale", f"data.batch_mb=128 (default), data.slice_mb={args.slice_mb:g}; {SHARDS} shards")
    rows_out = []
    print(f"{'kind':8} {'GB':>5} {'files':>7} {'rows':>10}  {'step':18} {'wall s':>7} {'MB/s':>7} {'files/s':>8} "
          f"{'peak RSS MB':>11}")
    for kind in args.kinds:
        for size in args.sizes:
            root = tempfile.mkdtemp(prefix="mop-data-scale-", dir=args.tmp)
            try:
                source = os.path.join(root, "source")
                rows, nbytes = generate(kind, source, size)
                files = sum(len(names) for _, _, names in os.walk(source))
                store_root = "file://" + os.path.join(root, "store")
                steps: list[tuple[str, str, list[list[int]] | None]] = [("whole-file read", "whole-file read", None),
                                                                         ("list_data", "list_data", None)]
                if kind == "folder":
                    steps = steps[1:]
                for n in args.workers:
                    steps.append((f"scatter x{n}", "scatter", n))
                steps += [("shard", "shard", None), ("stage", "stage", None), ("hop", "hop", None)]
                slices = 0
                for label, name, n in steps:
                    if name == "scatter":
                        # a fresh store per worker count: the slices are written again, not reused
                        shutil.rmtree(os.path.join(root, "store", "bench", "shards"), ignore_errors=True)
                    workers = [list(range(w, slices, n)) for w in range(n)] if name == "scatter" else None
                    measured = run_steps(name, kind, source, store_root, os.path.join(root, "cache"), args.slice_mb,
                                         workers)
                    if "error" in measured:
                        print(f"{kind:8} {nbytes / 1e9:5.2f} {files:7} {rows:10}  {label:18} failed: {measured['error']}")
                        continue
                    slices = measured.get("slices", slices)
                    step_bytes = nbytes / SHARDS if name in ("hop", "stage") else nbytes
                    if name == "list_data":
                        label = f"list_data ({slices} sl.)"
                    elif measured.get("streamed"):
                        label = "hop (streamed)"
                    per_second = (f"{files / (SHARDS if name in ('hop', 'stage') else 1) / measured['seconds']:8.0f}"
                                  if kind == "folder" else f"{'':8}")
                    print(f"{kind:8} {nbytes / 1e9:5.2f} {files:7} {rows:10}  {label:18} {measured['seconds']:7.1f} "
                          f"{step_bytes / 1e6 / measured['seconds']:7.0f} {per_second} {measured['peak_rss_mb']:11.0f}",
                          flush=True)
                    rows_out.append({"kind": kind, "gb": round(nbytes / 1e9, 2), "step": label,
                                     "seconds": round(measured["seconds"], 1),
                                     "mb_per_s": round(step_bytes / 1e6 / measured["seconds"]),
                                     "peak_rss_mb": round(measured["peak_rss_mb"])})
            finally:
                shutil.rmtree(root, ignore_errors=True)
    result("data_scale", {"rows": rows_out})


if __name__ == "__main__":
    main()
