"""The warm shard loop without Airflow, against the task-parallel pattern and plain Keras, in one run.

What a block of mop_airflow's DAG does once its train tasks run: one process per shard slot (4
shards x 1 slot sharing this machine's device), each started once, reading its shard once and
training every hop the block puts on it (:func:`mop_airflow.slots.driver.run_slot`), the
models hopping through the store. Beside it, on the same data and the same configurations:

  task-parallel   what a Ray Tune trial does: a process per configuration over the whole data
                  (model.fit for the same passes, validating after each as the slots do), all
                  configurations at once
  one slot alone  the fair sequential baseline: the slots' own loop in one process over the whole
                  data as one shard, every configuration one after another (the data held on the
                  device as the slots hold theirs, the same steps, validating after each pass, a
                  checkpoint a pass): what the slots cost without hopping and without sharing
  plain Keras     one process, one model at a time, the whole data, ``model.fit`` on host arrays:
                  the steady epoch (the second one) a configuration-epoch is also held against

Every TensorFlow process trains with one thread (``threads_per_hop: 1``, the default); JAX keeps its
own thread pool. Prints per pattern the wall time, and for the warm loop where a slot's seconds went (start-up:
the process to its first hop; hops; waiting for hops of other slots) and the configuration-epoch:
one configuration's pass over the whole data, i.e. its 4 hops' seconds on the slots (start to
release, commit excluded: the commit runs beside the next hop), against plain Keras's epoch.

    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python benchmarks/warm_shards.py [--model cnn1m] [--configs 4]
        [--iterations 10] [--images 20000] [--no-trials] [--out DIR]
    python benchmarks/warm_shards.py --model cnn --iterations 3          # TensorFlow on the CPU, MNIST-1D
    KERAS_BACKEND=jax JAX_PLATFORMS=cpu python benchmarks/warm_shards.py --model mlp --configs 16 --fuse 8

``--fuse N`` runs the slots a second time with ``schedule.fuse: N`` (the classes dealt as the plan task
deals them, each fused group whole in one), beside the unfused slots, in the same run. ``--runs N``
repeats every pattern N times, one after another in turn, and prints each pattern's median and range.
On a GPU, ``nvidia-smi`` samples the GPU's busy share (``utilization.gpu``) every 100 ms while each
pattern runs. The issue's search of CIFAR-10's size, on one GPU::

    KERAS_BACKEND=jax python benchmarks/warm_shards.py --model cnn1m --images 50000 --configs 16 \
        --iterations 10 --fuse 16 --runs 3 --out out/

Generated data is written to a temporary folder and deleted afterwards. ``--out`` keeps the figures
(``warm_shards.json``) and every hop's timestamps and parts (``slots.json``).
"""

from __future__ import annotations

import time

STARTED = time.time()  # a slot process's interpreter start ends here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import example_data, header, machine, one_thread, result, spread, summary  # noqa: E402

SHARDS = int(os.environ.get("MOP_BENCH_SHARDS") or 4)
RATES = [1e-3, 3e-3, 1e-2, 3e-2, 1e-4, 3e-4, 2e-3, 5e-3, 7e-4, 1.5e-3, 4e-3, 6e-3, 8e-3, 2e-4, 5e-4, 2e-2]


# --- the processes --------------------------------------------------------------------------------

def slot_main(args: argparse.Namespace) -> None:
    """One shard slot's train task, as the operator runs it: the whole block, this slot's hops."""
    from mop_airflow.training.devices import place_this_process

    place_this_process()
    import keras  # the task's start-up: Airflow's preloading worker or the task process imports Keras first

    float(keras.ops.sum(keras.ops.ones((8, 8))))  # and the backend starts its device
    from mop_airflow.records import Manifest, RunRecord
    from mop_airflow.records.layout import RunLayout
    from mop_airflow.store import Store
    from mop_airflow.training.model_hop import Where
    from mop_airflow.planning.placement import block_hops
    from mop_airflow.slots.driver import run_slot

    state = json.loads(Path(args.state).read_text())
    store = Store(state["store"])
    run = RunRecord.read(store, state["run"])
    layout = RunLayout(store, run.dag_id, run.run_id)
    shards = run.schedule.shards
    from mop_airflow.planning.fusing import grouping

    hops = block_hops(classes(state), shards=shards, slots=1, start=0, end=run.schedule.iterations * shards,
                      fuse=grouping(run))
    result = run_slot(layout, run, Manifest.read(store, state["manifest"]), hops, block="bench", shard=args.shard,
                      slot=0, cache_dir=state["cache"], where=Where(task_id=f"train_shard_{args.shard}"))
    print("SLOT " + json.dumps({"shard": args.shard, "spawned": args.spawned, "waited": result.waited,
                                "hops": [{"config_id": r.config_id, "t": r.t, "iteration": r.iteration,
                                          "started_at": r.started_at,
                                          "released_at": r.released_at, "saved_at": r.saved_at,
                                          "reused": r.model_reused, "timings": r.timings, "fused": r.fused,
                                          "train": r.timings["train"]} for r in result.trained]}), flush=True)


def classes(state: dict) -> list:
    from mop_airflow.records import Assignment

    return [[Assignment(cid, -1, None) for cid in members] for members in state["classes"]]


def trial_main(args: argparse.Namespace) -> None:
    """One task-parallel trial: a process of its own, the whole data, ``fit`` for every pass."""
    import numpy as np

    from mop_airflow.data.cache import cached_shard, load_shard, manifest_inputs
    from mop_airflow.data.inputs import input_shapes
    from mop_airflow.records import Manifest, RunRecord
    from mop_airflow.store import Store
    from mop_airflow.training.builder import build_model
    from mop_airflow.training.devices import place_this_process

    place_this_process()  # on a GPU: a slot of it, memory grown on demand, as the slots have
    one_thread()
    state = json.loads(Path(args.state).read_text())
    store = Store(state["store"])
    run = RunRecord.read(store, state["run"])
    manifest = Manifest.read(store, state["manifest"])
    config = run.config(args.config)
    x, y = whole_data(state, manifest)
    validation = load_shard(cached_shard(store, manifest.validation, state["cache"], manifest=manifest), manifest)
    began = time.time()
    model = build_model(config, input_shapes=input_shapes(manifest_inputs(manifest)),
                        num_classes=len(manifest.classes), seed=1, task=manifest.task)
    built = time.time()
    epochs = []
    for iteration in range(run.schedule.iterations):
        at = time.time()
        # validated when the slots validate (after each pass by default), in batches as large as theirs:
        # a trial that reports its metric each epoch to its scheduler, as Ray Tune's do
        model.fit(x, y, batch_size=config["batch_size"], epochs=1, shuffle=True, verbose=0,
                  validation_data=validation if run.schedule.evaluates_after(iteration) else None,
                  validation_batch_size=max(config["batch_size"], 256))
        epochs.append(time.time() - at)
    print("TRIAL " + json.dumps({"config_id": args.config, "process": began - STARTED + (STARTED - args.spawned),
                                 "build": built - began, "epochs": epochs, "rows": int(np.shape(y)[0])}), flush=True)


def whole_data(state: dict, manifest) -> tuple:
    """Every shard's rows in one array, as a trial that reads the whole data set holds them."""
    import numpy as np

    from mop_airflow.data.cache import cached_shard, load_shard
    from mop_airflow.store import Store

    store = Store(state["store"])
    parts = [load_shard(cached_shard(store, entry, state["cache"], manifest=manifest), manifest)
             for entry in manifest.shards]
    xs, ys = zip(*parts)
    x = {k: np.concatenate([p[k] for p in xs]) for k in xs[0]} if isinstance(xs[0], dict) else np.concatenate(xs)
    return x, np.concatenate(ys)


def plain_main(args: argparse.Namespace) -> None:
    """Plain Keras in one process: every configuration one after another over the whole data, for the
    same passes (``fit``, one epoch a call, validating when the slots do); each configuration's epochs
    after its first are steady."""
    from mop_airflow.data.cache import cached_shard, load_shard, manifest_inputs
    from mop_airflow.data.inputs import input_shapes
    from mop_airflow.records import Manifest, RunRecord
    from mop_airflow.store import Store
    from mop_airflow.training.builder import build_model
    from mop_airflow.training.devices import place_this_process

    place_this_process()
    one_thread()
    state = json.loads(Path(args.state).read_text())
    store = Store(state["store"])
    run = RunRecord.read(store, state["run"])
    manifest = Manifest.read(store, state["manifest"])
    x, y = whole_data(state, manifest)
    validation = load_shard(cached_shard(store, manifest.validation, state["cache"], manifest=manifest), manifest)
    began = time.time()
    epochs = []
    for config in run.configs:
        model = build_model(config, input_shapes=input_shapes(manifest_inputs(manifest)),
                            num_classes=len(manifest.classes), seed=1, task=manifest.task)
        mine = []
        for iteration in range(run.schedule.iterations):
            at = time.time()
            # validated when the slots validate, in batches as large as theirs: the same work as theirs
            model.fit(x, y, batch_size=config["batch_size"], epochs=1, shuffle=True, verbose=0,
                      validation_data=validation if run.schedule.evaluates_after(iteration) else None,
                      validation_batch_size=max(config["batch_size"], 256))
            mine.append(time.time() - at)
        epochs.append(mine)
    print("PLAIN " + json.dumps({"epochs": epochs, "train_wall": time.time() - began,
                                 "process": time.time() - args.spawned}), flush=True)


# --- the driver -----------------------------------------------------------------------------------

def prepare(work: Path, model: str, configs: int, iterations: int, images: int, shards: int, fuse: int = 1,
            name: str = "state") -> Path:
    """Data, the run record, the shards and the offset classes, in this process (``fuse``: schedule.fuse,
    the classes dealt as the plan task deals them, each fused group whole in one)."""
    from benchmarks.gpu_hops import MODELS, write_images
    from mop_airflow.data.shard import shard_dataset
    from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec
    from mop_airflow.planning.plan import deal_run
    from mop_airflow.planning.resolve import resolve_run
    from mop_airflow.planning.schedule import deal_classes
    from mop_airflow.records.layout import RunLayout
    from mop_airflow.store import Store

    data_name, params = MODELS[model]
    if (work / "data").exists():  # the unfused run's data, for the fused one
        data = json.loads((work / "data.json").read_text())
    elif data_name == "images":
        data = write_images(work / "data" / "images.parquet", images)
    else:
        data = mnist1d_data_spec(example_data(work / "data"))
    (work / "data.json").write_text(json.dumps(data))
    grid = {"model": [params["model"]], "optimizer": "adam", "learning_rate": RATES[:configs],
            "batch_size": [params["batch_size"]], "metrics": ["accuracy"]}
    if params.get("hparams"):
        grid["hparams"] = {name: [value] for name, value in params["hparams"].items()}
    root = f"file://{work / 'store'}"
    spec = {"data": data, "search": {"space": {"method": "grid", "params": grid}, "metric": "val_accuracy"},
            "schedule": {"shards": shards, "iterations": iterations, "seed": 42, **({"fuse": fuse} if fuse > 1 else {})},
            "store": {"root": root, "cache_dir": str(work / "cache")}}
    run = resolve_run(spec, None, dag_id=f"warm_{model}", run_id=name)
    store = Store(root)
    run_uri = run.write(store, RunLayout(store, run.dag_id, run.run_id).run_record_uri)
    manifest = shard_dataset(run.data, store, run.dag_id, shards, run.schedule.seed)
    ids = [c["config_id"] for c in run.configs]
    state = {"store": root, "run": run_uri, "manifest": manifest.write(store, f"{root}/{name}-manifest.json"),
             "cache": str(work / "cache"),
             "classes": deal_run(run, ids, rows=None, seed=42) if fuse > 1 else [
                 list(c) for c in deal_classes(ids, shards=shards, seed=42)]}
    path = work / f"{name}.json"
    path.write_text(json.dumps(state))
    return path


CHILD_ENV: dict[str, str] = {}  # the processes' environment: this one's before it hid the GPU from itself
CHILD_GPUS = [0]  # the GPUs the processes see (counted once, in main)


def gpu_count(environ) -> int:
    """GPUs the processes would see: none where JAX is held on the CPU or no NVIDIA driver answers."""
    if environ.get("JAX_PLATFORMS", "").strip() == "cpu" or not shutil.which("nvidia-smi"):
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def launch(kind: str, state: Path, *extra: str, sharing: int) -> subprocess.Popen:
    """A process of ``kind``; on a GPU it claims one of ``sharing`` slots of it (MOP_GPUS, MOP_SLOTS), so
    processes that share the GPU grow its memory on demand instead of each reserving most of it."""
    env = dict(CHILD_ENV)
    gpus = CHILD_GPUS[0]
    if gpus and "MOP_GPUS" not in env:
        env.update(MOP_GPUS=str(gpus), MOP_SLOTS=str(max(1, -(-sharing // gpus))))
    command = [sys.executable, __file__, kind, "--state", str(state), "--spawned", repr(time.time()), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def collect(processes: list[subprocess.Popen], tag: str) -> list[dict]:
    """Each process's ``tag`` lines; the first process that fails stops the others (a slot left alone
    would wait for its peers' hops up to MOP_SHARD_WAIT_SECONDS)."""
    outputs: dict[int, tuple[str, str]] = {}
    readers = [threading.Thread(target=lambda i=i, p=p: outputs.__setitem__(i, p.communicate()), daemon=True)
               for i, p in enumerate(processes)]
    for reader in readers:
        reader.start()
    while any(reader.is_alive() for reader in readers):
        failed = [i for i, p in enumerate(processes) if p.poll() not in (None, 0)]
        if failed:
            for process in processes:
                process.kill()
            for reader in readers:
                reader.join()
            raise RuntimeError(f"{tag} process failed:\n" + "\n".join(outputs[failed[0]][1].strip().splitlines()[-15:]))
        time.sleep(0.2)
    out = []
    for i in range(len(processes)):
        out += [json.loads(line[len(tag) + 1:]) for line in outputs[i][0].splitlines() if line.startswith(tag + " ")]
    return out


class GpuBusy:
    """The GPU's busy share while a pattern runs: ``nvidia-smi`` prints ``utilization.gpu`` (the share of
    the last sample period in which a kernel ran) every 100 ms; the mean over the pattern. None without
    an NVIDIA GPU (or with JAX held on the CPU)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "GpuBusy":
        if CHILD_GPUS[0]:
            self.process = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                             "-lms", "100"], stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                self.samples.append(float(line.split(",")[0]))
            except ValueError:
                pass

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()

    @property
    def share(self) -> float | None:
        return statistics.mean(self.samples) / 100 if self.samples else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn1m", choices=["mlp", "cnn", "cnn1m"])
    parser.add_argument("--configs", type=int, default=4)
    parser.add_argument("--shards", type=int, default=SHARDS, help="shard slots (processes) sharing the device")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--images", type=int, default=20000, help="rows of generated images (cnn1m)")
    parser.add_argument("--out", default=None, help="folder for warm_shards.json")
    parser.add_argument("--fuse", type=int, default=1, help="also run the slots with schedule.fuse set to this "
                        "(JAX), beside the unfused ones")
    parser.add_argument("--no-trials", action="store_true", help="leave the task-parallel pattern out (a second "
                        "run of the slots, on other code, beside a full one)")
    parser.add_argument("--runs", type=int, default=1, help="every pattern this many times, in turn")
    args = parser.parse_args()
    os.environ["MOP_BENCH_SHARDS"] = str(args.shards)  # the slot processes read it
    os.environ.setdefault("MOP_SHARD_YIELD_SECONDS", "3600")  # the four slots start together here
    CHILD_ENV.update(os.environ)
    CHILD_GPUS[0] = gpu_count(CHILD_ENV)
    header("warm_shards", f"{args.configs} configurations x {args.iterations} iterations of {args.model} on "
           f"{args.shards} shard slots, {CHILD_GPUS[0]} GPU(s)")
    os.environ["JAX_PLATFORMS"] = "cpu"  # preparing the data here must not take the GPU's memory
    work = Path(tempfile.mkdtemp(prefix="mop-warm-"))
    try:
        runs = []
        for k in range(args.runs):
            # runs of their own each round: a slot finds the hops an earlier round committed to its run in the
            # store, as a retry would, and trains none of them again
            at = "" if k == 0 else f"_{k + 1}"
            state = prepare(work, args.model, args.configs, args.iterations, args.images, args.shards,
                            name=f"state{at}")
            fused_state = (prepare(work, args.model, args.configs, args.iterations, args.images, args.shards,
                                   fuse=args.fuse, name=f"fused{at}") if args.fuse > 1 else None)
            # the same data, one shard: the slots' loop over all of it in one process
            alone_state = prepare(work, args.model, args.configs, args.iterations, args.images, 1, name=f"alone{at}")
            runs.append(one_round(args, state, fused_state, alone_state, k))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summarize(args, runs)


def timed(tag: str, processes: Any) -> tuple[list[dict], float, float | None]:
    """Start ``processes()`` and collect their ``tag`` lines: what they printed, the wall, the GPU's busy share."""
    began = time.time()
    with GpuBusy() as busy:
        out = collect(processes(), tag)
    return out, time.time() - began, busy.share


def one_round(args: argparse.Namespace, state: Path, fused_state: Path | None, alone_state: Path, k: int) -> dict:
    """Every pattern once, in turn; its figures (:func:`report`)."""
    print(f"--- run {k + 1} of {args.runs}", flush=True)
    slots, warm_wall, warm_busy = timed("SLOT", lambda: [launch("slot", state, "--shard", str(s), sharing=args.shards)
                                                         for s in range(args.shards)])
    print(f"warm shard slots done in {warm_wall:.1f} s", flush=True)
    fused, fused_wall, fused_busy = [], float("nan"), None
    if fused_state is not None:
        fused, fused_wall, fused_busy = timed("SLOT", lambda: [launch("slot", fused_state, "--shard", str(s),
                                                                      sharing=args.shards) for s in range(args.shards)])
        print(f"fused shard slots done in {fused_wall:.1f} s", flush=True)
    trials, trial_wall, trial_busy = [], float("nan"), None
    if not args.no_trials:
        ids = [c for cls in json.loads(state.read_text())["classes"] for c in cls]
        trials, trial_wall, trial_busy = timed("TRIAL", lambda: [launch("trial", state, "--config", cid,
                                                                        sharing=args.configs) for cid in ids])
        print(f"task-parallel trials done in {trial_wall:.1f} s", flush=True)
    (alone,), alone_wall, alone_busy = timed("SLOT", lambda: [launch("slot", alone_state, "--shard", "0", sharing=1)])
    print(f"one slot alone done in {alone_wall:.1f} s", flush=True)
    (plain,), plain_wall, plain_busy = timed("PLAIN", lambda: [launch("plain", state, sharing=1)])
    figures = report(args, slots, warm_wall, trials, trial_wall, plain, fused, fused_wall)
    steady = figures["plain_keras"]["steady_epoch"]
    alone_hops = [h for h in alone["hops"] if h["iteration"] > 0] or alone["hops"]
    alone_epoch = statistics.median(h["released_at"] - h["started_at"] for h in alone_hops)
    figures["alone"] = {"wall": alone_wall, "config_epoch": alone_epoch,
                        "startup": min(h["started_at"] for h in alone["hops"]) - alone["spawned"]}
    print(f"  one slot alone, 1 process, sequential wall {alone_wall:7.1f} s  (start-up {figures['alone']['startup']:.1f}"
          f" s; its steady configuration-epoch {alone_epoch:.3f} s = {alone_epoch / steady:.2f}x plain Keras's)")
    print(f"  configuration-epoch on the warm slots: {figures['warm']['config_epoch']:.3f} s = "
          f"{figures['warm']['config_epoch'] / alone_epoch:.2f}x the slot alone's")
    walls = {"warm": warm_wall, "fused": fused_wall, "task_parallel": trial_wall, "alone": alone_wall,
             "plain": plain_wall}
    busy = {"warm": warm_busy, "fused": fused_busy, "task_parallel": trial_busy, "alone": alone_busy,
            "plain": plain_busy}
    figures["walls"], figures["gpu_busy"] = walls, busy
    if CHILD_GPUS[0]:
        print("  the GPU's busy share: " + ", ".join(f"{k} {v:.0%}" for k, v in busy.items() if v is not None))
    return figures


PATTERNS = {"warm": "warm shard slots", "fused": "fused shard slots", "task_parallel": "task-parallel trials",
            "alone": "one slot alone (the slots' loop, sequential)", "plain": "plain Keras, sequential"}


def summarize(args: argparse.Namespace, runs: list[dict]) -> None:
    """Each pattern's wall (and GPU busy share) over the runs: median (range); the ratios the issue's goals name."""
    print(f"\n{len(runs)} run(s), {runs[0]['backend']} on {runs[0]['devices']}: {args.configs} configurations x "
          f"{args.iterations} iterations of {args.model} on {args.shards} shards")
    medians = {}
    for key, name in PATTERNS.items():
        walls = [r["walls"][key] for r in runs if r["walls"][key] == r["walls"][key]]  # NaN: not run
        if not walls:
            continue
        medians[key] = statistics.median(walls)
        busy = [r["gpu_busy"][key] for r in runs if r["gpu_busy"][key] is not None]
        print(f"  {name:<46} {spread(walls)}" + (f", GPU busy {statistics.median(busy):.0%}"
                                                   f" ({min(busy):.0%}-{max(busy):.0%})" if busy else ""))
    ratios = [r["warm"]["config_epoch"] / r["plain_keras"]["steady_epoch"] for r in runs]
    print(f"  configuration-epoch on the warm slots / plain Keras's steady epoch {spread(ratios, 'x', 2)}")
    if "fused" in medians:
        print(f"  fused / unfused slots: {medians['fused'] / medians['warm']:.2f}x" +
              (f"; fused / task-parallel: {medians['fused'] / medians['task_parallel']:.2f}x"
               if "task_parallel" in medians else ""))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "runs.json").write_text(json.dumps(runs, indent=2))
    result("warm_shards", {
        "model": args.model, "configs": args.configs, "iterations": args.iterations, "shards": args.shards,
        "fuse": args.fuse, "backend": runs[0]["backend"], "devices": runs[0]["devices"],
        "walls": {key: summary([r["walls"][key] for r in runs]) for key in PATTERNS},
        "config_epoch": summary([r["warm"]["config_epoch"] for r in runs]),
        "plain_steady_epoch": summary([r["plain_keras"]["steady_epoch"] for r in runs]),
        "config_epoch_over_plain": summary(ratios),
        "alone_config_epoch": summary([r["alone"]["config_epoch"] for r in runs]),
        "gpu_busy": {key: summary([r["gpu_busy"][key] for r in runs if r["gpu_busy"][key] is not None])
                     for key in PATTERNS}})


def report(args, slots, warm_wall, trials, trial_wall, plain, fused=(), fused_wall=float("nan")) -> None:
    import keras

    hops = [h for s in slots for h in s["hops"]]

    def per_config_epoch(chosen: list[dict], key=lambda h: h["released_at"] - h["started_at"]) -> float:
        """A configuration's pass over the whole data: its hops' seconds on the slots (start to release;
        the commit runs beside the next hop), per configuration and iteration."""
        passes = len({(h["config_id"], h["iteration"]) for h in chosen})
        return sum(key(h) for h in chosen) / max(1, passes)

    steady_hops = [h for h in hops if h["iteration"] > 0]  # each configuration's first pass builds and traces
    config_epoch = per_config_epoch(steady_hops or hops)
    train_epoch = per_config_epoch(steady_hops or hops, key=lambda h: h["train"])
    steady = statistics.median(e for mine in plain["epochs"] for e in mine[1:]) if args.iterations > 1 else \
        statistics.median(mine[0] for mine in plain["epochs"])
    cores = os.cpu_count() or 1
    figures = {
        "machine": machine(),
        "backend": keras.config.backend(), "devices": f"{CHILD_GPUS[0]} GPU(s)" if CHILD_GPUS[0] else "cpu",
        "model": args.model, "configs": args.configs, "iterations": args.iterations, "shards": args.shards,
        # a slot's start-up: from its process's spawn to its first hop (imports, device, shard, first build)
        "warm": {"wall": warm_wall,
                 "startup": statistics.mean(min(h["started_at"] for h in s["hops"]) - s["spawned"] for s in slots),
                 "waited": statistics.mean(s["waited"] for s in slots), "hops": len(hops),
                 "hop_median": statistics.median(h["released_at"] - h["started_at"] for h in hops),
                 "config_epoch": config_epoch, "config_epoch_training": train_epoch},
        "task_parallel": {"wall": trial_wall, "process": statistics.mean(t["process"] for t in trials),
                          "first_epoch": statistics.mean(t["epochs"][0] for t in trials),
                          "steady_epoch": statistics.mean(t["epochs"][-1] for t in trials)} if trials else None,
        "plain_keras": {"steady_epoch": steady, "sequential_process": plain["process"]},
    }
    print(f"{args.configs} configurations x {args.iterations} iterations of {args.model} on {args.shards} shards "
          f"({figures['backend']}, {figures['devices']}; {figures['machine']})")
    print(f"  warm shard slots, {args.shards} processes    wall {warm_wall:7.1f} s  (start-up to the first hop "
          f"{figures['warm']['startup']:.1f} s, waiting {figures['warm']['waited']:.1f} s a slot, {len(hops)} hops, "
          f"median hop {figures['warm']['hop_median']:.3f} s)")
    if fused:
        fused_hops = [h for s in fused for h in s["hops"]]
        figures["fused"] = {"wall": fused_wall, "limit": args.fuse, "hops": len(fused_hops),
                            "group_median": statistics.median(h["fused"] for h in fused_hops)}
        print(f"  fused shard slots (fuse {args.fuse})        wall {fused_wall:7.1f} s  ({len(fused_hops)} hops, "
              f"median group {figures['fused']['group_median']:.0f}) = {fused_wall / warm_wall:.2f}x the unfused slots")
    if trials:
        print(f"  task-parallel, {args.configs} processes     wall {trial_wall:7.1f} s  (process start "
              f"{figures['task_parallel']['process']:.1f} s, first epoch {figures['task_parallel']['first_epoch']:.2f} s, "
              f"steady {figures['task_parallel']['steady_epoch']:.3f} s)")
    print(f"  plain Keras, 1 process, sequential  wall {plain['process']:7.1f} s  (steady epoch {steady:.3f} s)")
    first = [h for h in hops if h["iteration"] == 0]
    figures["warm"]["first_pass_hops"] = sum(h["released_at"] - h["started_at"] for h in first) / max(1, len(slots))
    figures["warm"]["steady_hop_parts"] = {key: statistics.median(h["timings"][key] for h in steady_hops or hops)
                                           for key in hops[0]["timings"]}
    figures["warm"]["steady_hop_parts"]["release"] = statistics.median(
        h["released_at"] - h["started_at"] for h in steady_hops or hops)
    figures["warm"]["first_hop_parts"] = {key: sum(h["timings"][key] for h in first) / max(1, len(slots))
                                          for key in hops[0]["timings"]}
    print(f"  warm slot's seconds: start-up {figures['warm']['startup']:.1f}, first pass's hops "
          f"{figures['warm']['first_pass_hops']:.1f} (builds and compiles), later hops "
          f"{sum(h['released_at'] - h['started_at'] for h in steady_hops) / max(1, len(slots)):.1f}, waiting "
          f"{figures['warm']['waited']:.1f}; a later hop's median parts: " +
          ", ".join(f"{k} {v:.3f}" for k, v in figures["warm"]["steady_hop_parts"].items() if v >= 0.0005) +
          "; the first pass's parts a slot: " +
          ", ".join(f"{k} {v:.2f}" for k, v in figures["warm"]["first_hop_parts"].items() if v >= 0.005))
    share = (f"; TensorFlow on {cores} CPU cores, one thread in every process: {args.shards} slots, "
             f"{args.configs} trials") if keras.config.backend() == "tensorflow" else (
        f"; JAX's own thread pool in every process ({args.shards} slots" +
        (f", {args.configs} trials" if trials else "") + " share the device)")
    print(f"  configuration-epoch on the warm slots (after each configuration's first): {config_epoch:.3f} s = "
          f"{config_epoch / steady:.2f}x plain Keras's steady epoch (training steps alone {train_epoch:.3f} s = "
          f"{train_epoch / steady:.2f}x){share}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "warm_shards.json").write_text(json.dumps(figures, indent=2))
        # every hop's timestamps and parts, for a timeline of the slots (where they waited, for what)
        (Path(args.out) / "slots.json").write_text(json.dumps({"slots": slots, "trials": trials, "plain": plain}))
    return figures


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("slot", "trial", "plain"):
        sub = argparse.ArgumentParser()
        sub.add_argument("kind")
        sub.add_argument("--state", required=True)
        sub.add_argument("--spawned", type=float, required=True)
        sub.add_argument("--shard", type=int, default=0)
        sub.add_argument("--config", default=None)
        parsed = sub.parse_args()
        {"slot": slot_main, "trial": trial_main, "plain": plain_main}[parsed.kind](parsed)
    else:
        main()
