"""Requests a block's shard slots make to an S3 store, per hop, counted at the endpoint.

Every shard slot of one block runs :func:`mop_airflow.slots.driver.run_slot` as its train task
would, each in a thread of this process (16 Airflow slots are too heavy for a small machine; the loop
runs without Airflow), against moto's S3 server on loopback, which counts every request it answers by
kind. The models are sleepy (``mop_airflow.examples.timed_models:sleepy``: a sleep per training batch,
one batch a shard), so the hops are short and the slots wait for each other's commits as on a real
block: the polling, not the training, is what is measured. A local store's run of the same block is
timed beside it.

    python benchmarks/s3_requests.py                          # 64 configurations x 4 shards x 2 iterations
    python benchmarks/s3_requests.py --configs 256 --shards 16 --iterations 1 --repeats 1

Prints the machine, the date, and per store: hops, requests (all, per hop, by kind) and the block's
wall time (the median of ``--repeats`` runs).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import header, result  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
SLEEPY = "mop_airflow.examples.timed_models:sleepy"


class Counter:
    """Counts the requests moto's server answers: a WSGI middleware around its application."""

    def __init__(self, app):
        self.app, self.counts, self.lock = app, collections.Counter(), threading.Lock()
        self.detail = collections.Counter()

    def __call__(self, environ, start_response):
        method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        kind = "LIST" if method == "GET" and "list-type" in query else method
        # what the request was for: hops, checkpoints, slots (statuses and commit markers)...
        path = environ.get("PATH_INFO", "").split("/")
        what = path[5] if len(path) > 5 else "bucket"
        if what == "slots" and "commits" in path:
            what = "markers"
        with self.lock:
            self.counts[kind] += 1
            self.detail[f"{kind} {what}"] += 1
        return self.app(environ, start_response)


def s3_endpoint():
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line a request otherwise

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    counter = Counter(server._server.app)  # the werkzeug server's application
    server._server.app = counter
    host, port = server.get_host_and_port()
    return server, counter, f"http://{host}:{port}"


def write_data(folder: Path, rows: int) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    path = folder / "data.parquet"
    pq.write_table(pa.table({**{f"f{i}": x[:, i] for i in range(6)}, "y": y}), path)
    return path


def spec(source: Path, root: str, cache: Path, args) -> dict:
    rates = [float(f"{1e-3 * (1 + i):.6g}") for i in range(args.configs)]
    return {
        "data": {"source": str(source), "label": "y", "features": "f*", "classes": [0, 1], "validation": 0.1},
        "search": {"space": {"method": "grid", "params": {
            "model": [SLEEPY], "learning_rate": rates, "batch_size": [16],
            "hparams": {"units": [8], "seconds_per_batch": [args.seconds_per_batch]}}}},
        "schedule": {"shards": args.shards, "iterations": args.iterations, "seed": 3},
        "store": {"root": root, "cache_dir": str(cache)},
    }


def one_block(root: str, options: dict | None, folder: Path, args, counter: Counter | None) -> dict:
    from mop_airflow.data.shard import shard_dataset
    from mop_airflow.planning.resolve import resolve_run
    from mop_airflow.planning.schedule import deal_classes
    from mop_airflow.records import Assignment
    from mop_airflow.records.layout import RunLayout
    from mop_airflow.store import Store
    from mop_airflow.training.model_hop import Where
    from mop_airflow.planning.placement import block_hops
    from mop_airflow.slots.driver import run_slot

    source = write_data(folder, rows=int(args.shards * 16 / 0.9) + 1)
    run_id = f"r{time.time_ns()}"
    run = resolve_run(spec(source, root, folder / f"cache-{run_id}", args), None, dag_id="bench", run_id=run_id)
    store = Store(root, options)
    layout = RunLayout(store, "bench", run_id)
    manifest = shard_dataset(run.data, store, "bench", args.shards, run.schedule.seed)
    ids = [c["config_id"] for c in run.configs]
    classes = [[Assignment(cid, -1, None) for cid in members]
               for members in deal_classes(ids, shards=args.shards, seed=run.schedule.seed)]
    hops = block_hops(classes, shards=args.shards, slots=1, start=0, end=args.iterations * args.shards)
    errors, results = [], {}

    def slot(shard: int) -> None:
        try:
            results[shard] = run_slot(RunLayout(Store(root, options), "bench", run_id), run, manifest, hops,
                                      block="bench", shard=shard, slot=0, cache_dir=str(folder / f"cache-{run_id}"),
                                      where=Where(task_id=f"train_shard_{shard}"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=slot, args=(s,)) for s in range(args.shards)]
    if counter is not None:
        counter.counts.clear()  # the block's requests only, not the data's sharding
        counter.detail.clear()
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - began
    if errors:
        raise errors[0]
    trained = sum(len(r.trained) for r in results.values())
    counts = dict(counter.counts) if counter is not None else {}
    detail = dict(sorted(counter.detail.items())) if counter is not None else {}
    return {"hops": trained, "seconds": took, "requests": sum(counts.values()), "by_kind": counts, "detail": detail,
            "per_hop": sum(counts.values()) / trained if trained else None}


def main() -> None:
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: every thread's stack, to see where a block waits
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=64)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--seconds-per-batch", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-local", action="store_true", help="only the S3 store")
    args = parser.parse_args()
    import boto3

    server, counter, endpoint = s3_endpoint()
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                 region_name="us-east-1").create_bucket(Bucket="bench")
    options = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint}}
    header("s3_requests")
    print(f"block: {args.configs} sleepy configurations ({args.seconds_per_batch} s a batch, one batch a shard) x "
          f"{args.shards} shards x {args.iterations} iteration(s), one slot a shard, each a thread")
    figures = {}
    try:
        for name in ("s3", "local") if not args.no_local else ("s3",):
            runs = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory() as tmp:
                    root = "s3://bench/runs" if name == "s3" else f"file://{tmp}/store"
                    runs.append(one_block(root, options if name == "s3" else None, Path(tmp), args,
                                          counter if name == "s3" else None))
            runs.sort(key=lambda r: r["seconds"])
            median = runs[len(runs) // 2]
            figures[name] = {**median, "seconds_all": [round(r["seconds"], 1) for r in runs],
                             "per_hop_all": [round(r["per_hop"], 2) for r in runs if r["per_hop"]]}
            if name == "s3":
                print(f"s3: {median['hops']} hops, {median['requests']} requests, {median['per_hop']:.2f} a hop "
                      f"(runs: {figures[name]['per_hop_all']}), by kind {json.dumps(median['by_kind'])}, "
                      f"by kind and folder {json.dumps(median['detail'])}; "
                      f"block {median['seconds']:.1f} s (median; runs {figures[name]['seconds_all']})")
            else:
                print(f"local: {median['hops']} hops; block {median['seconds']:.1f} s (runs {figures[name]['seconds_all']})")
    finally:
        server.stop()
    result("s3_requests", {"configs": args.configs, "shards": args.shards, "iterations": args.iterations, **figures})


if __name__ == "__main__":
    main()
