"""What a process that trains on a GPU pays before its training: the start of a train task (once a
block) with and without the preload, memory on demand and JAX's compilation cache, and two slots
sharing one GPU against one: measured without Airflow, hop by hop.

Prepares the runs in this process on the CPU (data, resolve, shard), then trains hops each in a
fresh Python process that claims a slot of the machine (``mop_airflow.training.devices``,
``MOP_GPUS``/``MOP_SLOTS``) and calls ``run_hop`` on the shard: every hop pays what a train task
pays once at its start. Per hop it prints:

  process     the interpreter's start (spawn to the script's first line)
  imports     mop_airflow's hop modules, Keras and its backend
  device      the backend's first op on the device (CUDA context, libraries)
  shard       reading the shard (local cache)
  build       building and compiling the Keras model
  restore     restoring the checkpoint (weights and optimizer state)
  train       one pass over the shard; the first call of the train step compiles it
  save        writing the checkpoint and the hop record

and the steady training time of the same pass in a process whose model already ran (the
difference to ``train`` is the step's compilation). Sections:

  fresh       a chain of hops of one configuration, each in its own process: with the JAX
              compilation cache off and on (MOP_COMPILATION_CACHE), and on with the GPU's memory
              reserved when the backend starts (MOP_GPU_RESERVE=1) instead of grown on demand
  preload     the fresh chain forked from a worker that imported Keras and the hop modules, as
              Airflow's task-forking processes do with the preload
  steady      the same chain in one process: training without compilation or start-up
  slots       two chains on one GPU at once (MOP_SLOTS=2, memory growth) against the same two
              chains one after the other (one slot)
  cpu         the fresh chain on the same machine's CPU (JAX_PLATFORMS=cpu)
  crowd       two hop processes on one GPU without any placement (each backend's default reservation)
  warm        the warm shard loop (benchmarks/warm_shards.py): a process per shard slot trains a whole
              block of 4 configurations x 10 iterations, 4 slots sharing the device, beside the
              task-parallel pattern and plain Keras's steady epoch, in the same run

Models: ``mlp`` and ``cnn``, the demo grid's MNIST-1D models (batch 32); ``cnn1m``, a 2-D CNN of
1.06 M weights on 32x32x3 images (generated, batch 128), the size of MADlib's CIFAR-10 example.

    KERAS_BACKEND=jax python benchmarks/gpu_hops.py [--out DIR] [--sections fresh,preload,steady,slots,cpu,crowd,warm]
                                                    [--fresh off,on,reserve]
                                                    [--models mlp,cnn,cnn1m] [--hops 3] [--images 20000]
"""

from __future__ import annotations

import time

MAIN_AT = time.time()  # before any import: a hop process's interpreter start ends here

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import REPO, example_data, header, machine, result  # noqa: E402

SHARDS = 4
MODELS = {
    "mlp": ("mnist1d", {"model": "mop_airflow.examples.mnist1d_models:mlp", "batch_size": 32}),
    "cnn": ("mnist1d", {"model": "mop_airflow.examples.mnist1d_models:cnn", "batch_size": 32}),
    "cnn1m": ("images", {"model": "mop_airflow.examples.image_models:cnn2d", "batch_size": 128,
                         "hparams": {"filters": 32, "units": 128, "rescale": 1 / 255}}),
}
RATES = [1e-3, 3e-3, 1e-2, 3e-2]  # four configurations of each model
HOP_ENV: dict[str, str] = {}  # the hop processes' environment: this one's before prepare() hid the GPU
STEPS = ("process", "imports", "device", "shard", "build", "restore", "train", "save")


# --- the hop process ------------------------------------------------------------------------------

def hop_main(args: argparse.Namespace) -> None:
    """One hop task: claim a slot, start the backend, run the hop(s), print one JSON line per hop."""
    from mop_airflow.training.devices import place_this_process

    placement = place_this_process()
    from mop_airflow.records import Assignment, Manifest, RunRecord
    from mop_airflow.records.layout import RunLayout
    from mop_airflow.store import Store
    from mop_airflow.training.model_hop import run_hop
    from mop_airflow.training.session import TaskSession, compilation_cache

    import keras

    imported = time.time()
    state = json.loads(Path(args.state).read_text())
    store = Store(state["store"])
    run = RunRecord.read(store, state["runs"][args.run])
    manifest = Manifest.read(store, state["manifests"][args.model])
    layout = RunLayout(store, run.dag_id, run.run_id)
    cache_dir = state["cache_dirs"][args.cache]
    compilation_cache(cache_dir)  # before the first op, as the hop's own call would be
    float(keras.ops.sum(keras.ops.ones((8, 8))))  # the backend's first op: the device starts here
    device = time.time()
    common = {"process": MAIN_AT - args.spawned, "imports": imported - MAIN_AT, "device": device - imported,
              "gpu": placement.gpu if placement else None, "slots_sharing": placement.slots_sharing if placement else 0}
    session = TaskSession(run, manifest, cache_dir)
    assignments = [Assignment.from_dict(a) for a in json.loads(args.assignments)]
    for k in range(args.chain):
        t = assignments[0].t + 1
        began = time.time()
        record, out = run_hop(layout, run, manifest, assignments[0], t=t, shard=t % SHARDS, cache_dir=cache_dir,
                              session=session)
        records, assignments, wall = [record], [out], time.time() - began
        for record in records:
            steps = {"shard": record.timings["shard_read"], "build": record.timings["imports"] + record.timings["build"],
                     "restore": record.timings["checkpoint_load"], "train": record.timings["train"],
                     # save: from the end of evaluation to the checkpoint written (taking, packing, writing)
                     "save": record.timings["save"] + record.timings["evaluate"]}
            line = {"t": t, "k": k, "config_id": record.config_id, "reused": record.model_reused, **steps,
                    "loss": record.train_metrics.get("loss"), "hop_wall": wall, "pid": os.getpid(),
                    **(common if k == 0 else {"process": 0.0, "imports": 0.0, "device": 0.0})}
            line["total"] = sum(line[s] for s in STEPS)
            print("HOP " + json.dumps(line), flush=True)
    memory = _device_memory()
    print("END " + json.dumps({"assignments": [a.to_dict() for a in assignments], "memory": memory,
                               "platform": keras.config.backend(), "devices": memory.get("device")}), flush=True)


def _device_memory() -> dict:
    """The JAX device's allocator figures: its pool (what it reserved) and its peak use."""
    try:
        import jax

        device = jax.devices()[0]
        stats = device.memory_stats() or {}
        return {"device": f"{device.platform}:{getattr(device, 'device_kind', '')}",
                "pool_bytes": stats.get("bytes_limit") or stats.get("pool_bytes"),
                "peak_bytes": stats.get("peak_bytes_in_use")}
    except Exception as exc:  # another backend, or a CPU without allocator statistics
        return {"device": None, "error": type(exc).__name__}


def worker_main(parser: argparse.ArgumentParser) -> None:
    """A preloaded task-forking process: imports what the preload imports (no op runs, so no device
    starts), then forks one hop process per request line on stdin, as Airflow forks its tasks."""
    global MAIN_AT  # a forked hop's "process" step ends when its child starts
    import keras  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import mop_airflow.data.cache  # noqa: F401
    import mop_airflow.training.builder  # noqa: F401
    import mop_airflow.slots.driver  # noqa: F401
    import mop_airflow.training.checkpoint  # noqa: F401
    import mop_airflow.training.hop  # noqa: F401

    print(f"imports took {time.time() - MAIN_AT:.2f} s", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            MAIN_AT = time.time()
            os.environ.update(request["env"])
            with open(request["log"], "w") as log:
                os.dup2(log.fileno(), 1)
                os.dup2(log.fileno(), 2)
            code = 0
            try:
                hop_main(parser.parse_args(request["argv"]))
            except BaseException:  # noqa: BLE001 - reported through the log and the exit code
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)


class Forked:
    """One hop process forked by the preloaded worker, with what ``Driver.finish`` reads of a Popen."""

    def __init__(self, driver: "Driver", *, env: dict, **hop) -> None:
        self.log = driver.work / f"forked-{time.time_ns()}.log"
        request = {"argv": driver.hop_argv(**hop), "env": env, "log": str(self.log)}
        driver.worker.stdin.write(json.dumps(request) + "\n")
        driver.worker.stdin.flush()
        self.returncode = json.loads(driver.worker.stdout.readline())["code"]

    def communicate(self) -> tuple[str, str]:
        text = self.log.read_text()
        return text, text


# --- the driver -----------------------------------------------------------------------------------

class Driver:
    def __init__(self, work: Path, out: Path, images: int) -> None:
        self.work, self.out = work, out
        self.state_path = work / "state.json"
        self.state: dict = {"store": f"file://{work / 'store'}", "runs": {}, "manifests": {}, "cache_dirs": {}}
        self.images = images
        self.lines: list[dict] = []
        self.variants = list(FRESH)
        self.worker: subprocess.Popen | None = None

    # preparing: data, runs and shards, on the CPU, in this process
    def prepare(self, models: list[str], run_names: list[str]) -> None:
        os.environ["JAX_PLATFORMS"] = "cpu"  # this process must not take the GPU's memory (hops get HOP_ENV)
        from mop_airflow.data.shard import shard_dataset
        from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec
        from mop_airflow.planning.resolve import resolve_run
        from mop_airflow.records.layout import RunLayout
        from mop_airflow.store import Store

        began = time.time()
        datasets = {"mnist1d": None, "images": None}
        if any(MODELS[m][0] == "mnist1d" for m in models):
            datasets["mnist1d"] = mnist1d_data_spec(example_data(self.work / "data"))
        if any(MODELS[m][0] == "images" for m in models):
            datasets["images"] = write_images(self.work / "data" / "images.parquet", self.images)
        store = Store(self.state["store"])
        for model in models:
            data_name, params = MODELS[model]
            grid = {"model": [params["model"]], "optimizer": "adam", "learning_rate": RATES,
                    "batch_size": [params["batch_size"]], "metrics": ["accuracy"]}
            if params.get("hparams"):
                grid["hparams"] = {name: [value] for name, value in params["hparams"].items()}
            spec = {"data": datasets[data_name], "search": {"space": {"method": "grid", "params": grid},
                                                            "metric": "val_accuracy"},
                    "schedule": {"shards": SHARDS, "iterations": 2, "seed": 42},
                    "store": {"root": self.state["store"], "cache_dir": str(self.work / "cache" / "shards")}}
            for name in run_names:
                run = resolve_run(spec, None, dag_id=f"gpu_{model}", run_id=name)
                layout = RunLayout(store, run.dag_id, run.run_id)
                uri = run.write(store, layout.run_record_uri)
                self.state["runs"][f"{model}/{name}"] = uri
            manifest = shard_dataset(run.data, store, f"gpu_{model}", SHARDS, run.schedule.seed)
            self.state["manifests"][model] = manifest.write(store, f"{self.state['store']}/manifests/{model}.json")
        for name in ("off", "on", "cpu", "shared"):
            self.state["cache_dirs"][name] = str(self.work / "cache" / name)
        self.state_path.write_text(json.dumps(self.state))
        print(f"prepared {models} in {time.time() - began:.1f} s", flush=True)

    def configs(self, model: str, run: str) -> list[str]:
        from mop_airflow.records import RunRecord
        from mop_airflow.store import Store

        record = RunRecord.read(Store(self.state["store"]), self.state["runs"][f"{model}/{run}"])
        return [c["config_id"] for c in record.configs]

    # one hop process (or a chain of hops in one process)
    def hop_argv(self, *, model: str, run: str, config_ids: list[str], t: int, cache: str,
                 chain: int = 1, starts: list[dict] | None = None) -> list[str]:
        from mop_airflow.records import Assignment

        assignments = starts or [Assignment(cid, t - 1, None).to_dict() for cid in config_ids]
        return ["hop", "--state", str(self.state_path), "--model", model, "--run", f"{model}/{run}", "--cache", cache,
                "--assignments", json.dumps(assignments), "--chain", str(chain),
                "--spawned", repr(time.time())]

    def spawn(self, *, env: dict, **hop) -> subprocess.Popen:
        command = [sys.executable, __file__, *self.hop_argv(**hop)]
        return subprocess.Popen(command, env={**HOP_ENV, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def finish(self, process: subprocess.Popen, tags: dict) -> tuple[list[dict], dict]:
        stdout, stderr = process.communicate()
        if process.returncode != 0:
            tail = "\n".join((stderr or "").strip().splitlines()[-15:])
            raise RuntimeError(f"hop process failed ({tags}):\n{tail}")
        hops = [{**tags, **json.loads(line[4:])} for line in stdout.splitlines() if line.startswith("HOP ")]
        end = next(json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("END "))
        for hop in hops:
            hop["memory"] = end["memory"]
            self.record(hop)
        return hops, end

    def record(self, line: dict) -> None:
        self.lines.append(line)
        with open(self.out / "gpu_hops.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    def chain(self, *, model: str, run: str, config_id: str, hops: int, cache: str, env: dict,
              tags: dict, fork: bool = False) -> list[dict]:
        """``hops`` hops of one configuration, each in a fresh process (``fork``: forked from the
        preloaded worker), one after the other."""
        starts, out = None, []
        for t in range(hops):
            spawn = self.fork if fork else self.spawn
            process = spawn(model=model, run=run, config_ids=[config_id], t=t, cache=cache, env=env, starts=starts)
            hops_done, end = self.finish(process, {**tags, "model": model})
            starts, out = end["assignments"], out + hops_done
        return out

    def fork(self, **kwargs) -> "Forked":
        if self.worker is None:
            self.worker = subprocess.Popen([sys.executable, __file__, "worker"], env=HOP_ENV, text=True,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            print(f"preloaded worker ready: {self.worker.stdout.readline().strip()}", flush=True)
        return Forked(self, **kwargs)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stdin.close()
            self.worker.wait(timeout=30)


def write_images(path: Path, rows: int, seed: int = 0) -> dict:
    """Synthetic 32x32x3 images (uint8): a class template plus noise, as a list column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    templates = rng.normal(size=(10, 32 * 32 * 3)).astype("float32")
    labels = rng.integers(0, 10, size=rows)
    pixels = np.clip(128 + 30 * templates[labels] + 60 * rng.normal(size=(rows, 32 * 32 * 3)), 0, 255).astype("uint8")
    path.parent.mkdir(parents=True, exist_ok=True)
    image = pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), 32 * 32 * 3)
    pq.write_table(pa.table({"image": image, "label": labels.astype("int64")}), path, row_group_size=2048)
    return {"source": str(path), "label": "label", "features": {"image": {"shape": [32, 32, 3]}},
            "classes": list(range(10)), "validation": 0.1}


# --- the sections ---------------------------------------------------------------------------------

def gpu_env(slots: int = 1, **extra: str) -> dict:
    return {"MOP_GPUS": "1", "MOP_SLOTS": str(slots), "MOP_SLOT_WAIT_SECONDS": "5", **extra}


FRESH = {  # variant: (compilation cache, environment)
    "off": ("off", {"MOP_COMPILATION_CACHE": "0"}),
    "on": ("on", {"MOP_COMPILATION_CACHE": "1"}),
    "reserve": ("on", {"MOP_COMPILATION_CACHE": "1", "MOP_GPU_RESERVE": "1"}),  # the backend's default reservation
}


def section_fresh(d: Driver, models: list[str], hops: int) -> None:
    for model in models:
        cid = d.configs(model, "fresh_off")[0]
        for variant in d.variants:
            cache, env = FRESH[variant]
            d.chain(model=model, run=f"fresh_{variant}", config_id=cid, hops=hops, cache=cache, env=gpu_env(**env),
                    tags={"section": "fresh", "cache": variant})


def section_preload(d: Driver, models: list[str], hops: int) -> None:
    """The fresh chain forked from a worker that imported Keras and the hop modules first, as the
    preload does in Airflow's task-forking processes (``mop_airflow.deployment.preload``)."""
    for model in models:
        cid = d.configs(model, "preload")[0]
        d.chain(model=model, run="preload", config_id=cid, hops=hops, cache="on", env=gpu_env(),
                tags={"section": "preload", "cache": "on"}, fork=True)


def section_steady(d: Driver, models: list[str], hops: int) -> None:
    for model in models:
        cid = d.configs(model, "steady")[0]
        process = d.spawn(model=model, run="steady", config_ids=[cid], t=0, cache="on", env=gpu_env(), chain=hops)
        d.finish(process, {"section": "steady", "model": model, "cache": "on"})


def section_slots(d: Driver, models: list[str], hops: int) -> None:
    for model in models:
        a, b = d.configs(model, "one_slot")[1:3]
        began = time.time()
        for cid in (a, b):
            d.chain(model=model, run="one_slot", config_id=cid, hops=hops, cache="on", env=gpu_env(slots=1),
                    tags={"section": "slots", "slots": 1})
        d.record({"section": "slots", "model": model, "slots": 1, "wall": time.time() - began, "summary": True})
        lock_dir = tempfile.mkdtemp(prefix="mop-slots-")
        env = gpu_env(slots=2, MOP_SLOT_LOCK_DIR=lock_dir)
        watch = GpuWatch()
        began = time.time()
        lanes = [threading.Thread(target=d.chain, kwargs=dict(
            model=model, run="two_slots", config_id=cid, hops=hops, cache="on", env=env,
            tags={"section": "slots", "slots": 2})) for cid in (a, b)]
        for lane in lanes:
            lane.start()
        for lane in lanes:
            lane.join()
        d.record({"section": "slots", "model": model, "slots": 2, "wall": time.time() - began, "summary": True,
                  "gpu_memory_peak_mib": watch.stop()})


def section_cpu(d: Driver, models: list[str], hops: int) -> None:
    for model in models:
        cid = d.configs(model, "cpu")[0]
        d.chain(model=model, run="cpu", config_id=cid, hops=hops, cache="cpu", env={"JAX_PLATFORMS": "cpu"},
                tags={"section": "cpu", "cache": "on"})


def section_crowd(d: Driver, models: list[str], hops: int) -> None:
    """Two hop processes on one GPU without placement: each backend keeps its default reservation."""
    for model in models[:1]:
        ids = d.configs(model, "crowd")[:2]
        processes = [d.spawn(model=model, run="crowd", config_ids=[cid], t=0, cache="on", env={}) for cid in ids]
        for process in processes:
            try:
                hops_done, _ = d.finish(process, {"section": "crowd", "model": model, "cache": "on"})
                d.record({"section": "crowd", "model": model, "summary": True, "ok": True,
                          "pool_mib": (hops_done[0]["memory"].get("pool_bytes") or 0) / 2**20})
            except RuntimeError as exc:
                d.record({"section": "crowd", "model": model, "summary": True, "ok": False, "error": str(exc)[-600:]})


class GpuWatch:
    """The GPU's used memory (nvidia-smi) every 0.2 s while two slots share it; the peak in MiB."""

    def __init__(self) -> None:
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        if shutil.which("nvidia-smi"):
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                text = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                      capture_output=True, text=True, timeout=5).stdout
                used = int(text.split()[0])
                self.peak = max(self.peak or 0, used)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return

    def stop(self) -> int | None:
        self._stop.set()
        return self.peak


def section_warm(d: Driver, models: list[str], hops: int) -> None:
    """The warm shard loop (benchmarks/warm_shards.py): 4 shard slots sharing the device, 4
    configurations x WARM_ITERATIONS iterations, beside the task-parallel pattern and plain Keras, in
    one run; its data and processes of its own. Once with the slots compiling each step on their own
    (MOP_SHARED_COMPILE=0) and once compiling it once between them (the default), one after the other."""
    for model in models:
        for shared in ("0", "1"):
            print(f"warm shard loop, {model}, MOP_SHARED_COMPILE={shared}", flush=True)
            command = [sys.executable, str(REPO / "benchmarks" / "warm_shards.py"), "--model", model, "--configs",
                       "4", "--iterations", str(WARM_ITERATIONS), "--images", str(d.images),
                       "--out", str(d.out / f"{model}-shared-compile-{shared}")]
            # its figures print as they come
            done = subprocess.run(command, env={**HOP_ENV, "MOP_SHARED_COMPILE": shared})
            if done.returncode != 0:
                raise RuntimeError(f"warm_shards.py failed (exit {done.returncode}), its error above")


WARM_ITERATIONS = 10
SECTIONS = {"fresh": section_fresh, "preload": section_preload, "steady": section_steady, "slots": section_slots,
            "cpu": section_cpu, "crowd": section_crowd, "warm": section_warm}
RUNS = ["fresh_off", "fresh_on", "fresh_reserve", "preload", "steady", "one_slot", "two_slots", "cpu", "crowd"]


# --- the report -----------------------------------------------------------------------------------

def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(lines: list[dict]) -> str:
    hops = [h for h in lines if not h.get("summary")]
    out = []
    header = f"{'section':<8} {'model':<6} {'cache':<5} {'hop':>3} " + " ".join(f"{s:>8}" for s in STEPS) + f" {'total':>8}"
    out.append(header)
    for h in hops:
        if h["section"] in ("fresh", "preload", "cpu", "steady"):
            out.append(f"{h['section']:<8} {h['model']:<6} {h.get('cache', ''):<5} {h['t']:>3} "
                       + " ".join(f"{h[s]:8.3f}" for s in STEPS) + f" {h['total']:8.3f}")
    out.append("")
    out.append("per model, medians (s): a fresh hop's fixed cost = its total - steady training")
    for model in sorted({h["model"] for h in hops}):
        mine = [h for h in hops if h["model"] == model]

        def pick(section: str, cache: str | None = None, restored: bool = True) -> list[dict]:
            return [h for h in mine if h["section"] == section and (cache is None or h.get("cache") == cache)
                    and (not restored or h["t"] > 0)]

        steady = median([h["train"] for h in pick("steady") if h["k"] > 0])
        row = {"steady train": steady}
        for variant in FRESH:
            fresh = pick("fresh", variant)
            row[f"fresh total ({variant})"] = median([h["total"] for h in fresh])
            row[f"compile in train ({variant})"] = median([h["train"] for h in fresh]) - steady
            row[f"device start ({variant})"] = median([h["device"] for h in pick("fresh", variant, restored=False)])
        preload = pick("preload")
        if preload:
            row["preloaded fork: total"] = median([h["total"] for h in preload])
            row["preloaded fork: imports"] = median([h["imports"] for h in preload])
        cpu = pick("cpu")
        if cpu:
            row["cpu: fresh total"] = median([h["total"] for h in cpu])
            row["cpu: train"] = median([h["train"] for h in cpu])
        out.append(f"  {model}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if v == v))
    for s in [h for h in lines if h.get("summary") and h["section"] == "crowd"]:
        out.append(f"  crowd {s['model']} (no placement): " + (f"ran, pool {s['pool_mib']:.0f} MiB" if s["ok"]
                                                                else "failed: " + s["error"].splitlines()[-1]))
    for s in [h for h in lines if h.get("summary") and h["section"] == "slots"]:
        out.append(f"  slots {s['model']}: {s['slots']} slot(s), two chains in {s['wall']:.1f} s"
                   + (f", GPU memory peak {s['gpu_memory_peak_mib']} MiB" if s.get("gpu_memory_peak_mib") else ""))
    memory = {(h["section"], h["model"]): h.get("memory") for h in hops if h.get("memory", {}).get("peak_bytes")}
    for (section, model), m in sorted(memory.items()):
        out.append(f"  memory {section} {model}: pool {m['pool_bytes'] / 2**20:.0f} MiB, peak {m['peak_bytes'] / 2**20:.0f} MiB")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    hop = sub.add_parser("hop")
    for name in ("--state", "--model", "--run", "--cache", "--assignments"):
        hop.add_argument(name, required=True)
    hop.add_argument("--chain", type=int, default=1)
    hop.add_argument("--spawned", type=float, required=True)
    sub.add_parser("worker")
    parser.add_argument("--out", default=None, help="folder for gpu_hops.jsonl and the report (default: a temp folder)")
    parser.add_argument("--sections", default="fresh,preload,steady,slots,cpu,crowd")
    parser.add_argument("--models", default="mlp,cnn,cnn1m")
    parser.add_argument("--slot-models", default="mlp,cnn1m", help="models of the slots and cpu sections")
    parser.add_argument("--hops", type=int, default=3)
    parser.add_argument("--fresh", default="off,on,reserve", help="the fresh section's variants: " + ",".join(FRESH))
    parser.add_argument("--images", type=int, default=20000, help="rows of generated 32x32x3 images")
    args = parser.parse_args()
    if args.command == "hop":
        hop_main(args)
        return 0
    if args.command == "worker":
        worker_main(parser)
        return 0
    os.environ.setdefault("KERAS_BACKEND", "jax")
    HOP_ENV.update(os.environ)
    out = Path(args.out or tempfile.mkdtemp(prefix="mop-gpu-out-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mop-gpu-"))
    models = args.models.split(",")
    driver = Driver(work, out, args.images)
    driver.variants = args.fresh.split(",")
    try:
        driver.prepare(models, RUNS)
        header("gpu_hops")
        for name in args.sections.split(","):
            began = time.time()
            chosen = ([m for m in args.slot_models.split(",") if m in models] if name in ("slots", "cpu", "crowd")
                      else [m for m in models if m == "cnn1m"] or models if name == "warm" else models)
            try:
                SECTIONS[name](driver, chosen, args.hops)
            except Exception as exc:  # keep the other sections' figures
                print(f"section {name} failed: {exc}", flush=True)
            print(f"section {name}: {time.time() - began:.1f} s", flush=True)
        text = report(driver.lines)
        (out / "report.txt").write_text(machine() + "\n" + text + "\n")
        print(text)
        result("gpu_hops", {"sections": args.sections.split(","), "models": models, "out": str(out)})
    finally:
        driver.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
