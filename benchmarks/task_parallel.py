"""MOP against task parallelism as the data grows: Ray Tune's two ways to feed trials, and mop_airflow.

The same 4 configurations of a small MLP (Dense 64, Adam, learning rates 1e-3 and 1e-2, batch sizes
256 and 1024) train one pass over generated float32 data (128 feature columns, 10 classes, ~128 MB
Parquet files, 10 % held out for validation), 2 at a time on this machine's cores, one TensorFlow
thread each:

  ray files     ``tune.Tuner``, 2 trials at a time; each trial reads the Parquet files itself
                (``pyarrow.parquet.read_table``), as a trainable that loads its data does;
  ray params    ``tune.with_parameters(trainable, x=..., y=...)``: the driver reads the files once
                and Ray's object store hands the arrays to every trial (shared memory);
  mop first     the DAG on the embedded Airflow (SQLite, LocalExecutor, 4 one-slot shard pools):
                trigger to the end of the DAG run, validation and sharding included;
  mop again     a second run of the same DAG over the same files: the shards are reused.

For a mop_airflow run it also prints where the run's time went by kind of task (the hop phase is the
train tasks, ``train_shard_<s>``: one per shard slot, each training every hop on its slot in one
process), how busy the cores were in it, and each hop's timings from its hop record.

Each Ray case runs in a child process of its own session, watched: past ``--kill-gb`` above idle
(or what the machine has left) the whole session is killed and the row says "killed: out of
memory", so the OOM killer never picks a process of the machine. Memory is counted as
:mod:`memory_watch` says (machine: processes and shared memory, page cache excluded; tree: PSS).

    python benchmarks/task_parallel.py                    # 1, 2, 4 and 8 GB (about 25 minutes on 2 cores)
    python benchmarks/task_parallel.py --sizes 0.25 0.5   # a quick run

The data is generated into a temporary folder (deleted afterwards, with the store, the shard cache
and Airflow's home); mop_airflow keeps the source, the shards in the store and the worker's cache
copy on disk: about 3x the data, checked before each size (a size the disk cannot hold is skipped
and says so).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import embedded_airflow, header, result, write_dag  # noqa: E402
from benchmarks.memory_watch import MemoryWatch, machine_used_bytes  # noqa: E402

FEATURES = 128
CLASSES = 10
FILE_MB = 128
VALIDATION = 0.1
RATES = (1e-3, 1e-2)
BATCHES = (256, 1024)
UNITS = 64
DAG_ID = "mop_task_parallel"
SHARDS = 4


def configs() -> list[dict]:
    return [{"learning_rate": lr, "batch_size": b} for lr in RATES for b in BATCHES]


def generate(folder: str, gigabytes: float, seed: int = 0) -> tuple[int, int]:
    """~128 MB Parquet files of 128 float32 columns and a label until ``gigabytes``; (rows, bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    # Classes are Gaussian clouds around random centres, close enough to overlap (best ~0.85).
    centres = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32) * 0.2
    rows_per_file = FILE_MB * 1_000_000 // (FEATURES * 4 + 8)
    written = rows = index = 0
    while written < gigabytes * 1e9:
        label = rng.integers(0, CLASSES, rows_per_file)
        x = rng.standard_normal((rows_per_file, FEATURES), dtype=np.float32) + centres[label]
        table = pa.table({**{f"x{i:03d}": x[:, i] for i in range(FEATURES)}, "label": label})
        path = os.path.join(folder, f"part-{index:05d}.parquet")
        # Random floats neither compress nor repeat: plain pages, no dictionary pages beside them.
        pq.write_table(table, path, compression="none", use_dictionary=False)
        written += os.path.getsize(path)
        rows += rows_per_file
        index += 1
    return rows, written


# -- Ray Tune, in a child process --------------------------------------------------------------------

def _read_xy(folder: str) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.parquet as pq

    table = pq.read_table(folder)
    x = np.column_stack([table[f"x{i:03d}"].to_numpy() for i in range(FEATURES)])
    return x, table["label"].to_numpy()


def _train(config: dict, x: np.ndarray, y: np.ndarray) -> float:
    """One configuration as a Keras user trains it: one pass, then accuracy on the last 10 % of rows."""
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(7)
    held = int(len(y) * VALIDATION)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(UNITS, activation="relu"),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(config["learning_rate"]), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x[:-held], y[:-held], batch_size=config["batch_size"], epochs=1, shuffle=True, verbose=0)
    return float(model.evaluate(x[-held:], y[-held:], batch_size=1024, verbose=0, return_dict=True)["accuracy"])


def ray_tune(mode: str, folder: str, scratch: str) -> dict:
    import ray
    from ray import tune

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=os.path.join(scratch, "r"))
    if mode == "files":
        def trainable(config):
            return {"accuracy": _train(config, *_read_xy(folder))}
        bytes_read = "every trial reads all"
    else:
        def trainable(config, x=None, y=None):
            return {"accuracy": _train(config, x, y)}
        trainable = tune.with_parameters(trainable, **dict(zip("xy", _read_xy(folder))))
        bytes_read = "driver reads all once; trials map it"
    space = {"learning_rate": tune.grid_search(list(RATES)), "batch_size": tune.grid_search(list(BATCHES))}
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}), param_space=space,
                       tune_config=tune.TuneConfig(max_concurrent_trials=2),
                       run_config=tune.RunConfig(storage_path=os.path.join(scratch, "ray_results"), verbose=0))
    results = tuner.fit()
    errors = [str(r.error)[:300] for r in results if r.error]
    accuracies = [float(r.metrics["accuracy"]) for r in results if not r.error and "accuracy" in r.metrics]
    return {"best": max(accuracies) if accuracies else None, "errors": errors, "bytes_read": bytes_read}


def _first_to_go() -> None:
    """Should the kernel's OOM killer fire before the watch, it takes this case, not a process of the machine."""
    try:
        with open("/proc/self/oom_score_adj", "w") as handle:
            handle.write("1000")
    except OSError:
        pass


def _end_session(sid: int) -> None:
    """Kill what is left of the Ray case: its processes (raylet, workers) are all in the session it
    started, and a raylet may still be starting workers, so look again until none is left."""
    for _ in range(20):
        left = []
        for name in os.listdir("/proc"):
            try:
                if name.isdigit() and os.getsid(int(name)) == sid:
                    os.kill(int(name), signal.SIGKILL)
                    left.append(name)
            except (ProcessLookupError, PermissionError):
                pass
        if not left:
            return
        time.sleep(0.2)


def run_ray(mode: str, source: str, kill_bytes: float) -> dict:
    # Ray's sockets live in its temp folder, whose path must stay short (AF_UNIX: 107 bytes).
    scratch = tempfile.mkdtemp(prefix="ray-")
    try:
        return _run_ray(mode, source, scratch, kill_bytes)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_ray(mode: str, source: str, scratch: str, kill_bytes: float) -> dict:
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, __file__, "--ray", mode, "--source", source, "--scratch", scratch],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, preexec_fn=_first_to_go)

    def kill() -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    with MemoryWatch([process.pid], kill_above=kill_bytes, on_limit=kill) as watch:
        stdout, stderr = process.communicate()
    wall = time.perf_counter() - started
    _end_session(process.pid)
    out = {"wall": wall, "watch": watch}
    if watch.limited:
        out["outcome"] = f"killed: out of memory (past {kill_bytes / 1e9:.1f} GB above idle)"
    elif process.returncode < 0:  # a signal: the kernel's OOM killer, when the machine ran out
        out["outcome"] = f"killed: out of memory? (by signal {-process.returncode}; see the kernel log)"
    elif "out of memory" in stderr.lower():
        out["outcome"] = "killed: out of memory (Ray's memory monitor ended trials)"
    elif process.returncode != 0:
        out["outcome"] = "failed: " + ((stderr.strip().splitlines() or ["?"])[-1][:200])
    else:
        result = json.loads(stdout.strip().splitlines()[-1])
        out.update(result)
        if result["errors"]:
            oom = any("memory" in e.lower() for e in result["errors"])
            out["outcome"] = ("killed: out of memory (Ray's memory monitor)" if oom else "trial errors: ") + \
                             ("" if oom else result["errors"][0])
    return out


# -- mop_airflow on the embedded Airflow -----------------------------------------------------------------

def mop_spec(source: str) -> dict:
    return {
        "data": {"source": source, "label": "label", "features": "x*", "classes": list(range(CLASSES)),
                 "validation": VALIDATION},
        "search": {"space": {"method": "grid", "params": {
            "model": "mop_airflow.examples.mnist1d_models:mlp", "hparams": {"units": UNITS}, "optimizer": "adam",
            "learning_rate": list(RATES), "batch_size": list(BATCHES), "metrics": ["accuracy"]}},
            "metric": "val_accuracy"},
        "schedule": {"shards": SHARDS, "iterations": 1, "epochs_per_hop": 1, "seed": 7},
    }


def _seconds(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    return (dt.datetime.fromisoformat(b) - dt.datetime.fromisoformat(a)).total_seconds()


class CpuWatch:
    """The machine's busy CPU time (/proc/stat: all but idle and iowait), sampled every 0.5 s, so a
    phase of a run (e.g. its hops) can say how busy the cores were: near 1.0 means the phase was
    bound by computing, and only less computing shortens it."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _read() -> tuple[float, int, int]:
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:]]
        idle = values[3] + values[4]
        return time.time(), sum(values) - idle, sum(values)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.samples.append(self._read())

    def __enter__(self) -> "CpuWatch":
        self.samples.append(self._read())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self._read())

    def busy(self, start: float, end: float) -> float | None:
        """The fraction of all cores' time that was busy between two wall-clock times."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return None
        return (inside[-1][1] - inside[0][1]) / max(1, inside[-1][2] - inside[0][2])


def mop_profile(tis: list[dict], run: dict) -> dict:
    """Where the run's time went: each kind of task, from the run's start, in seconds."""
    start = run["start_date"]
    kinds: dict[str, list[dict]] = {}
    for ti in tis:
        # Skipped tasks count too: publish runs and skips itself when the champion stays, and the
        # run ends only after it.
        if not ti.get("start_date"):
            continue
        task = ti["task_id"].rsplit(".", 1)[-1]
        # train_shard_<s> (one train task per shard slot, training every hop of the block) -> "train"
        kind = task.split("_shard_")[0] if "_shard_" in task else task
        kinds.setdefault(kind, []).append(ti)
    out = {}
    for kind, group in kinds.items():
        first = min(t["start_date"] for t in group)
        last = max(t["end_date"] for t in group if t.get("end_date")) if any(t.get("end_date") for t in group) else None
        out[kind] = {"from": round(_seconds(start, first), 1), "to": round(_seconds(start, last), 1) if last else None,
                     "n": len(group), "longest": round(max(_seconds(t["start_date"], t["end_date"]) or 0 for t in group), 1)}
    return out


def mop_runs(home: Path, source: str, nbytes: int, kill_bytes: float, runs: int) -> list[dict]:
    from mop_airflow.records import HopRecord, Manifest
    from mop_airflow.records.layout import RunLayout
    from mop_airflow.store import Store

    write_dag(home / "dags", DAG_ID, mop_spec(source))
    store = Store("file://" + str(home / "store"))
    out = []
    with embedded_airflow(home, home / "dags", pools_for=DAG_ID) as af:
        for index in range(runs):
            time.sleep(3)  # let the services settle before the idle sample
            airflow_idle = machine_used_bytes()
            roots = [p.pid for p in af.processes.values()]
            aborted = []

            def stop_all() -> None:
                aborted.append(True)
                for proc in af.processes.values():
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

            began = time.perf_counter()
            with MemoryWatch(roots, idle=airflow_idle, kill_above=kill_bytes, on_limit=stop_all) as watch, \
                    CpuWatch() as cpu:
                run_id = af.trigger(DAG_ID)
                try:
                    state = af.wait_for_run(DAG_ID, run_id, timeout=3600, tick=1.0)
                except RuntimeError:
                    state = "killed"
            if aborted:
                out.append({"outcome": f"killed: out of memory (past {kill_bytes / 1e9:.1f} GB above idle)",
                            "watch": watch, "wall": time.perf_counter() - began})
                break
            run = af.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
            tis = af.task_instances(DAG_ID, run_id)
            layout = RunLayout(store, DAG_ID, run_id)
            row = {"wall": _seconds(run["start_date"], run["end_date"]), "watch": watch, "state": state,
                   "task_names": {t["id"]: t["task_id"].rsplit(".", 1)[-1] + (f"[{t['map_index']}]" if t["map_index"] >= 0 else "")
                                  for t in tis if t.get("id")},
                   "profile": mop_profile(tis, run)}
            trains = row["profile"].get("train")
            if trains and trains["to"] is not None:  # how busy the cores were while the train tasks ran
                began_at = dt.datetime.fromisoformat(run["start_date"]).timestamp()
                row["hop_phase"] = {"seconds": round(trains["to"] - trains["from"], 1),
                                    "cpu_busy": cpu.busy(began_at + trains["from"], began_at + trains["to"])}
            if state != "success":
                failed = [t for t in tis if t["state"] == "failed"]
                row["outcome"] = f"run {state}: " + ", ".join(t["task_id"] for t in failed)
                for ti in failed[:2]:  # the logs go with the temporary folder: show why here
                    log = af.task_log(DAG_ID, run_id, ti["task_id"], try_number=max(1, ti.get("try_number") or 1))
                    print(f"--- {ti['task_id']}, last lines of its log:\n" + "\n".join(log.splitlines()[-15:]))
                out.append(row)
                break
            board = store.read_json(layout.report_uri("leaderboard.json"))
            row["best"] = max(r.get("val_accuracy") or 0 for r in board["leaderboard"])
            hops = [HopRecord.from_dict(store.read_json(u)) for u in store.glob(f"{layout.run_uri}/hops/*/*.json")]
            manifest = Manifest.read(store, store.glob(f"{store.uri(DAG_ID, 'shards')}/*/manifest.json")[0])
            per_shard = {}
            for hop in hops:
                per_shard.setdefault(hop.shard, {"data": 0, "checkpoint": 0})
                per_shard[hop.shard]["data"] += hop.bytes_read.get("data", 0)
                per_shard[hop.shard]["checkpoint"] += hop.bytes_read.get("checkpoint", 0)
            row["bytes_read"] = {"shard (staged once)": max(e.bytes for e in manifest.shards),
                                 "validation set": manifest.validation.bytes,
                                 "checkpoints per worker": max(v["checkpoint"] for v in per_shard.values()),
                                 "of all source": nbytes, "reused": bool(index)}
            row["hop_timings"] = {k: round(float(np.mean([h.timings[k] for h in hops if h.timings])), 2)
                                  for k in (hops[0].timings or {})}
            # Each hop from its record: taken by its slot's warm process (started_at) to the slot free
            # again (released_at); the hops' own window, from the run's start.
            began_at = dt.datetime.fromisoformat(run["start_date"]).timestamp()
            row["hops"] = {"n": len(hops), "slot_seconds_mean": round(float(np.mean(
                               [h.released_at - h.started_at for h in hops])), 2),
                           "from": round(min(h.started_at for h in hops) - began_at, 1),
                           "to": round(max(h.saved_at for h in hops) - began_at, 1)}
            out.append(row)
    return out


# -- the table ---------------------------------------------------------------------------------------

def _gb(value: float) -> str:
    return f"{value / 1e9:.2f}"


def _named(cmd: str, names: dict) -> str:
    """A task process's command line names its task instance's id: show the task id instead."""
    for ti_id, task in names.items():
        if ti_id in cmd:
            return cmd.replace(ti_id, task)
    return cmd


def print_row(size: float, name: str, row: dict) -> None:
    watch = row["watch"]
    outcome = row.get("outcome") or f"best {row['best']:.4f}"
    print(f"{size:5g} GB  {name:<12} {row['wall']:7.1f} s  machine +{_gb(watch.peak_machine)} GB  "
          f"tree PSS +{_gb(watch.peak_tree_pss - watch.idle_tree_pss)} GB  largest process RSS {_gb(watch.peak_process_rss)} GB  "
          f"{outcome}", flush=True)
    names = row.get("task_names", {})
    idle = [p for p in watch.at_peak if p[2].endswith("<idle>")]
    above = [f"{_gb(rss)}/{_gb(pss)} {_named(cmd, names)[:70]}" for rss, pss, cmd in watch.at_peak if
             not cmd.endswith("<idle>")]
    print(f"{'':9}   at the tree's peak, processes > 200 MB (RSS/PSS GB): {len(above) + len(idle)}")
    for line in above:
        print(f"{'':12}{line}")
    if idle:
        print(f"{'':12}and {len(idle)} idle LocalExecutor workers: RSS {_gb(sum(p[0] for p in idle))} GB in all, "
              f"PSS {_gb(sum(p[1] for p in idle))} GB")
    if "bytes_read" in row:
        print(f"{'':12}bytes read: {json.dumps(row['bytes_read'])}")
    if "profile" in row:
        print(f"{'':12}profile (s from the run's start): {json.dumps(row['profile'])}")
    if row.get("hop_phase"):
        busy = row["hop_phase"]["cpu_busy"]
        print(f"{'':12}hop phase (the train tasks, one per shard slot): {row['hop_phase']['seconds']} s, the "
              f"machine's cores busy {'?' if busy is None else format(busy, '.0%')} of it")
    if "hops" in row:
        hops = row["hops"]
        print(f"{'':12}hops (records): {hops['n']}, first taken {hops['from']} s and last committed {hops['to']} s "
              f"from the run's start; a hop holds its slot {hops['slot_seconds_mean']} s on average")
    if "hop_timings" in row:
        print(f"{'':12}hop timings (mean s, hop records): {json.dumps(row['hop_timings'])}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0], help="source sizes in GB")
    parser.add_argument("--cases", nargs="+", default=["ray-files", "ray-params", "mop"],
                        choices=["ray-files", "ray-params", "mop"])
    parser.add_argument("--mop-runs", type=int, default=2, help="runs of the DAG per size (the 2nd reuses shards)")
    parser.add_argument("--kill-gb", type=float, default=20.0, help="kill a case past this many GB above idle")
    parser.add_argument("--tmp", default=None, help="where to generate (default: the system temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, store) and say where")
    parser.add_argument("--ray", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ray:
        print(json.dumps(ray_tune(args.ray, args.source, args.scratch)))
        return 0

    header("task_parallel")
    summary: list[tuple[float, str, dict]] = []
    for size in args.sizes:
        root = tempfile.mkdtemp(prefix="mop-task-parallel-", dir=args.tmp)
        try:
            free = shutil.disk_usage(root).free
            if free < 3.5 * size * 1e9:
                print(f"{size:5g} GB  skipped: {free / 1e9:.0f} GB free on disk, the case needs ~{3.5 * size:.0f}")
                continue
            source = os.path.join(root, "source")
            rows, nbytes = generate(source, size)
            print(f"{size:5g} GB  {rows} rows, {nbytes / 1e9:.2f} GB in {len(os.listdir(source))} files", flush=True)
            # What the machine has left is the limit too: other work may hold memory.
            kill = min(args.kill_gb * 1e9, _available() - 2.5e9)
            for case in args.cases:
                if case.startswith("ray"):
                    mode = case.split("-")[1]
                    row = run_ray(mode, source, kill)
                    print_row(size, case, row)
                    summary.append((size, case, row))
                else:
                    for index, row in enumerate(mop_runs(Path(root) / "mop", source, nbytes, kill, args.mop_runs)):
                        print_row(size, "mop first" if index == 0 else "mop again", row)
                        summary.append((size, "mop first" if index == 0 else "mop again", row))
        finally:
            if args.keep:
                print(f"kept {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
    print("\n| data | case | wall s | machine GB above idle | tree PSS GB above idle | largest process RSS GB | "
          "best val. accuracy |\n|---|---|---|---|---|---|---|")
    for size, case, row in summary:
        watch = row["watch"]
        print(f"| {size:g} GB | {case} | {row['wall']:.1f} | {_gb(watch.peak_machine)} | "
              f"{_gb(watch.peak_tree_pss - watch.idle_tree_pss)} | {_gb(watch.peak_process_rss)} | "
              f"{row.get('outcome') or format(row['best'], '.4f')} |")
    first = None
    for size, case, row in summary:  # each second run against the first run of its size
        if case == "mop first":
            first = row if "best" in row else None
        elif case == "mop again" and first and "best" in row:
            hops = [r.get("hops", {}).get("from") for r in (first, row)]
            print(f"{size:g} GB: the second run is {first['wall'] / row['wall']:.2f}x faster than the first; "
                  f"trigger to first hop {hops[0]} s, then {hops[1]} s")
    result("task_parallel", {"rows": [
        {"gb": size, "case": case, "wall": round(row["wall"], 1), "best": row.get("best"), "outcome": row.get("outcome"),
         "machine_gb": round(row["watch"].peak_machine / 1e9, 2),
         "tree_pss_gb": round((row["watch"].peak_tree_pss - row["watch"].idle_tree_pss) / 1e9, 2)}
        for size, case, row in summary]})
    return 0


def _available() -> float:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0.0


if __name__ == "__main__":
    sys.exit(main())
