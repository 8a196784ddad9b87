"""DAG scale: how big MOP DAGs get, and where parsing, serialization, the scheduler and the UI give out.

For each shape (plain MOP: ``shards x iterations``; adaptive: Hyperband R=81, eta=3 on p shards)
the script prints:

1. size: tasks in the DAG (counted from the task plan the DAG renders: one train task per shard slot
   in each block, a stage task per shard, a few control tasks), and the task instances a run creates.
2. parsing: seconds to import the DAG file in a fresh interpreter after ``import airflow.sdk``
   (what the dag-processor pays per parse, bounded by ``[core] dagbag_import_timeout``, 30 s by
   default), and ``build_task_plan`` alone (the plain-data plan, no Airflow).
3. serialization: ``DagSerialization.to_dict`` (what the dag-processor does after the import, in the
   same process, all of it bounded by ``[dag_processor] dag_file_processor_timeout``, 50 s by
   default), the JSON size stored in the metadata database (and zlib-compressed, as with
   ``[core] compress_serialized_dags``), and ``DagSerialization.from_dict`` (what the scheduler and
   the API server pay to load a new DAG version).
4. scheduler: a real embedded Airflow (SQLite + LocalExecutor) runs the shape's DAG on a tiny
   generated dataset (two classes, one configuration per offset class in a plain search, the
   plan's configurations in an adaptive one), so hops train almost nothing and the scheduler's
   bookkeeping dominates. CPU seconds are read from /proc (via psutil) once a second for every
   process of each service; a process that ended keeps its last reading. Scheduler CPU is the
   scheduler process itself; LocalExecutor workers (the task supervisors, its children) and task
   processes (their children) are reported separately. The steady window starts once every shard
   is staged and lasts ``--window`` seconds; the task instances that reached a terminal state in
   it (by end_date, through the REST API) give scheduler CPU seconds per 1000 task instances, raw
   and minus the idle rate measured before the trigger. The scheduler's own loop timings come from
   its log ("Ran scheduling loop in ... ms", logged at DEBUG for that one logger only). The
   dag-processor's CPU over the window shows the cost of re-parsing the file every
   ``min_file_process_interval`` (30 s by default).
5. UI: the endpoints the Airflow 3 UI calls for the grid view (/ui/grid/structure, /ui/grid/runs,
   /ui/grid/ti_summaries) and the graph view (/ui/structure/structure_data), and the DAG details,
   timed cold and warm with payload sizes, on the running DAG run. With Chromium installed, the
   grid and graph pages are rendered headless through the DevTools protocol: time until the
   view is first drawn (and until its DOM stops changing), DOM nodes, JS heap, and how long a
   trivial script waits for the main thread afterwards (is the page usable?).

Ends with "limits": where each of these becomes the bottleneck, in tasks and task instances, and
what a user does past it. Every figure there is computed from measurements printed above: a
quadratic fit of parse and parse+serialize time against task count (the quadratic part is the
SDK hashing the whole DAG for every dependency it sets; each shape prints the hash's cost), and a
model of the scheduling loop as milliseconds per unfinished task instance of the run. The
embedded Airflow runs on SQLite, as ``mop-airflow demo`` does: one writer at a time, so a "database
is locked" in another service during a long scheduling loop is SQLite's part of the picture;
``--postgres HOST:PORT`` runs it on a throw-away PostgreSQL database instead. ``--parallelism`` (default: what the
shape's blocks need, shards x 1 slot + a control task, the least the preflight accepts) caps the
LocalExecutor so a small machine stays usable; the scheduler still examines every waiting task
instance of the run in each loop.

Shapes: demo (4 shards x 3 iterations), 8x10, 16x20, hb81-p4 and hb81-p16 (Hyperband R=81,
eta=3 on 4 and 16 shards; see ``mop-airflow plan --R 81 --eta 3 --shards 16``), asha256-p16 (ASHA
n=256, r=1, R=81, eta=3 on 16 shards), asha-budget-p16 (the same with n=512 and Hyperband's 1,581
iterations as its budget), 256x16x10 and 256x64 (256 configurations on 64 shards, one
iteration), plus 16x40 and 16x80, parsed and serialized only, so the fit has measured points near the timeouts. A shape
whose file cannot be parsed and serialized within the dag-processor's timeout never reaches the
scheduler and is not run.

    python benchmarks/dag_scale.py [--shapes demo,16x20] [--window 240] [--skip-scheduler]
                                   [--skip-ui] [--skip-browser] [--parallelism N] [--blocks K]
                                   [--postgres 127.0.0.1:5432]

Everything lives in a temporary folder that is deleted at the end (``--keep`` keeps it); every
wait is bounded and every Airflow started here is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import header, result  # noqa: E402

from mop_airflow.search.adaptive import adaptive_plan  # noqa: E402
from mop_airflow.config import MopSpec  # noqa: E402
from mop_airflow.planning.run_chain import next_run_id  # noqa: E402
from mop_airflow.search.asha import AshaPlan  # noqa: E402
from mop_airflow.planning.task_plan import build_task_plan, spec_task_plan  # noqa: E402

IMPORT_TIMEOUT = 30.0  # [core] dagbag_import_timeout default
PROCESSOR_TIMEOUT = 50.0  # [dag_processor] dag_file_processor_timeout default
REPARSE_INTERVAL = 30.0  # [dag_processor] min_file_process_interval default
TERMINAL = ("success", "failed", "skipped", "upstream_failed", "removed")
HYPERBAND = {"method": "hyperband", "R": 81, "eta": 3}
ASHA = {"method": "asha", "n": 256, "r": 1, "R": 81, "eta": 3}
ASHA_BUDGET = {"method": "asha", "n": 512, "r": 1, "R": 81, "eta": 3, "budget": 1581}  # Hyperband's iterations
MODEL = "mop_airflow.examples.mnist1d_models:mlp"


@dataclass(frozen=True)
class Shape:
    name: str
    shards: int
    iterations: int = 1
    adaptive: dict | None = None
    parse_only: bool = False  # measured for the parse / serialize fit; too big to schedule here
    configs: int | None = None  # a plain search's configurations (default: one per offset class)

    @property
    def label(self) -> str:
        if self.adaptive and self.adaptive["method"] == "asha":
            a = self.adaptive
            budget = f" budget={a['budget']}" if "budget" in a else ""
            return f"ASHA n={a['n']} r={a['r']} R={a['R']} eta={a['eta']}{budget} on {self.shards} shards"
        if self.adaptive:
            return f"Hyperband R={self.adaptive['R']} eta={self.adaptive['eta']} on {self.shards} shards"
        return f"{self.shards} shards x {self.iterations} iterations"

    @property
    def dag_id(self) -> str:
        return "scale_" + re.sub(r"[^a-z0-9]+", "_", self.name.lower())


SHAPES = {s.name: s for s in (
    Shape("demo", 4, 3),
    Shape("8x10", 8, 10),
    Shape("16x20", 16, 20),
    Shape("16x40", 16, 40, parse_only=True),
    Shape("16x80", 16, 80, parse_only=True),
    Shape("256x16x10", 16, 10, configs=256),  # the size of the systems we compare with, in bundles
    Shape("hb81-p4", 4, adaptive=HYPERBAND),
    Shape("hb81-p16", 16, adaptive=HYPERBAND),
    Shape("asha256-p16", 16, adaptive=ASHA),
    Shape("asha-budget-p16", 16, adaptive=ASHA_BUDGET),  # one configuration per slot, 98 blocks at most
    # a 64-GPU cluster: a block shorter than an iteration keeps a run within 16 shards' budget
    Shape("256x64", 64, 1, configs=256),
)}


# -- output helpers --------------------------------------------------------------------------------
def say(text: str = "") -> None:
    print(text, flush=True)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min)"


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def fmt_s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}s"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# -- shape arithmetic (plain data, no Airflow) -------------------------------------------------------
def plan_of(shape: Shape):
    """The task plan the shape's DAG renders (its chains per class included), and the time it took."""
    adaptive = adaptive_plan(shape.adaptive, shape.shards) if shape.adaptive else None
    spec = MopSpec.from_dict(spec_for(shape, Path(tempfile.gettempdir())))
    started = time.perf_counter()
    plan = spec_task_plan(spec)
    return plan, adaptive, time.perf_counter() - started


def expected_instances(shape: Shape, configs: int | None = None) -> dict[str, int]:
    """Task instances of one DAG run: every task once; a block is one train task per shard slot,
    whatever its hops. A search split over ``runs`` DAG runs (``schedule.iterations_per_run`` set by
    hand) has that many per run. ``hop_instances`` are the train tasks, ``model_hops`` the hops they
    train; ``empty`` stays 0 (no task is rendered for a hop any more)."""
    plan, adaptive, _ = plan_of(shape)
    control = len(plan.tasks) - plan.train_tasks
    runs = 1
    if adaptive is None:
        n = configs
        hops_per_class = shape.iterations * shape.shards
        trains = [t for t in plan.tasks if t.kind == "train"]
        per_run = trains[0].args["end"]
        runs = hops_per_class // per_run
        model_hops = n * per_run
    else:
        n = adaptive.total_configurations
        # ASHA's promotions depend on the metrics, so only its synchronous-halving guide is known ahead
        model_hops = (adaptive.expected_iterations() * shape.shards if isinstance(adaptive, AshaPlan)
                      else adaptive.total_hops)
    return {"configs": n, "control": control, "model_hops": model_hops, "hop_instances": plan.train_tasks,
            "empty": 0, "total": control + plan.train_tasks, "runs": runs}


# -- the DAG file ----------------------------------------------------------------------------------
def spec_for(shape: Shape, home: Path) -> dict:
    """The example DAGs' kind of spec, made tiny: 8 features, 2 classes, a small MLP."""
    space: dict[str, Any] = {"method": "random", "seed": 7, "params": {
        "model": MODEL, "optimizer": "adam",
        "learning_rate": {"distribution": "log_uniform", "low": 1e-3, "high": 3e-2},
        "batch_size": 16, "hparams": {"units": 8}, "metrics": ["accuracy"]}}
    if not shape.adaptive:
        space["num_samples"] = shape.configs or shape.shards  # default: one configuration per offset class
    schedule: dict[str, Any] = {"shards": shape.shards, "seed": 42}
    if not shape.adaptive:
        schedule["iterations"] = shape.iterations
    return {
        "data": {"source": str(home / "data" / "train.parquet"), "label": "y", "features": "x*",
                 "classes": [0, 1], "validation": 0.2},
        "search": {"space": space, "metric": "val_accuracy",
                   **({"adaptive": dict(shape.adaptive)} if shape.adaptive else {})},
        "schedule": schedule,
        "store": {"root": "file://" + str(home / "store")},
    }


def write_dag_file(shape: Shape, home: Path) -> Path:
    folder = home / "dags"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{shape.dag_id}.py"
    spec = json.dumps(spec_for(shape, home), indent=1)
    path.write_text(textwrap.dedent(f'''\
        """mop_airflow DAG-scale benchmark: {shape.label}."""
        import json

        from mop_airflow import build_mop_dag

        spec = json.loads({spec!r})
        dag = build_mop_dag(spec, dag_id={shape.dag_id!r}, tags=["mop_airflow", "benchmark"])
        '''))
    return path


def write_tiny_data(folder: Path, rows: int = 800) -> Path:
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415
    from sklearn.datasets import make_classification  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    x, y = make_classification(n_samples=rows, n_features=8, n_informative=4, random_state=0)
    columns = {f"x{i}": pa.array(x[:, i].astype("float32")) for i in range(x.shape[1])}
    columns["y"] = pa.array(y.astype("int64"))
    path = folder / "train.parquet"
    pq.write_table(pa.table(columns), path)
    return path


# -- 2 + 3: parse and serialize in a fresh interpreter -----------------------------------------------
PARSE_CODE = r"""
import json, resource, sys, time, zlib
import importlib.util as u
import airflow.sdk
def out(**kw):
    kw["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("@@" + json.dumps(kw), flush=True)
t = time.perf_counter()
s = u.spec_from_file_location("scale_dag", sys.argv[1]); m = u.module_from_spec(s); s.loader.exec_module(m)
parse = time.perf_counter() - t
edges = sum(len(task.upstream_task_ids) for task in m.dag.tasks)
t = time.perf_counter(); hash(m.dag); one_hash = time.perf_counter() - t
out(step="parse", seconds=parse, tasks=len(m.dag.tasks), edges=edges, hash_seconds=one_hash)
from mop_airflow.config import MopSpec
from mop_airflow.planning.task_plan import build_task_plan
spec = MopSpec.from_dict(m.spec)
t = time.perf_counter(); build_task_plan(spec.schedule.shards, spec.schedule.iterations, spec.adaptive_plan())
out(step="task_plan", seconds=time.perf_counter() - t)
from airflow.serialization.serialized_objects import DagSerialization
t = time.perf_counter(); data = DagSerialization.to_dict(m.dag); ser = time.perf_counter() - t
t = time.perf_counter(); text = json.dumps(data); dumps = time.perf_counter() - t
out(step="serialize", seconds=ser, json_seconds=dumps, bytes=len(text.encode()),
    zlib_bytes=len(zlib.compress(text.encode())))
t = time.perf_counter(); DagSerialization.from_dict(json.loads(text))
out(step="deserialize", seconds=time.perf_counter() - t)
"""


def measure_parse(dag_file: Path, timeout: float) -> dict[str, Any]:
    """Parse, plan, serialize, deserialize; steps not reached within ``timeout`` are missing."""
    result: dict[str, Any] = {"timeout": timeout}
    errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed below, after the child's exit
    proc = subprocess.Popen([sys.executable, "-c", PARSE_CODE, str(dag_file)], stdout=subprocess.PIPE,
                            stderr=errors, text=True, start_new_session=True)
    started = time.time()
    timer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    try:
        for line in proc.stdout:
            if line.startswith("@@"):
                step = json.loads(line[2:])
                result[step.pop("step")] = step
        proc.wait()
    finally:
        timer.cancel()
    result["wall"] = time.time() - started
    result["timed_out"] = "deserialize" not in result and result["wall"] >= timeout - 1
    if "deserialize" not in result and not result["timed_out"]:
        errors.seek(0)
        lines = [line for line in errors.read().splitlines() if line.strip() and "Warning" not in line]
        result["error"] = lines[-1][:300] if lines else f"exit code {proc.returncode}"
    errors.close()
    return result


# -- 4: CPU of the Airflow services -----------------------------------------------------------------
class CpuSampler(threading.Thread):
    """Once a second: own user+system CPU of every process under each service, by role.

    Roles: ``<service>`` (the service's own process), ``<service>/children`` and, for the
    scheduler, ``executor workers`` (its children named like a worker: the LocalExecutor task
    supervisors), ``tasks`` (their children) and ``scheduler/other`` (e.g. the log server).
    A process that ended keeps its last reading, so totals only grow.
    """

    def __init__(self, roots: dict[str, int], interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.interval = interval
        self.last: dict[tuple[int, float], tuple[str, float]] = {}
        self.series: list[tuple[float, dict[str, float]]] = []
        self.titles: dict[str, set[str]] = {}
        self.stop_event = threading.Event()
        self.lock = threading.Lock()

    def role(self, service: str, proc, depth: int) -> str:
        if depth == 0:
            return service
        if service != "scheduler":
            return f"{service}/children"
        if depth >= 2:
            return "tasks"
        try:
            title = " ".join(proc.cmdline())[:60]
        except Exception:  # noqa: BLE001 - gone
            title = ""
        return "executor workers" if "worker" in title.lower() else "scheduler/other"

    def sample(self) -> None:
        import psutil  # noqa: PLC0415

        for service, pid in self.roots.items():
            try:
                root = psutil.Process(pid)
                stack = [(root, 0)]
                while stack:
                    proc, depth = stack.pop()
                    try:
                        key = (proc.pid, proc.create_time())
                        if key not in self.last:
                            role = self.role(service, proc, depth)
                            try:
                                self.titles.setdefault(role, set()).add(" ".join(proc.cmdline())[:70])
                            except Exception:  # noqa: BLE001, S110 - the process is gone: no title
                                pass
                        else:
                            role = self.last[key][0]
                        times = proc.cpu_times()
                        self.last[key] = (role, times.user + times.system)
                        stack.extend((child, depth + 1) for child in proc.children())
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        continue
            except psutil.NoSuchProcess:
                continue
        totals: dict[str, float] = {}
        for role, cpu in self.last.values():
            totals[role] = totals.get(role, 0.0) + cpu
        with self.lock:
            self.series.append((time.time(), totals))

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.sample()
            self.stop_event.wait(self.interval)

    def at(self, when: float) -> dict[str, float]:
        """Totals at the last sample taken at or before ``when``."""
        with self.lock:
            best = self.series[0][1] if self.series else {}
            for t, totals in self.series:
                if t > when:
                    break
                best = totals
            return dict(best)

    def delta(self, start: float, end: float) -> dict[str, float]:
        a, b = self.at(start), self.at(end)
        return {role: b.get(role, 0.0) - a.get(role, 0.0) for role in set(a) | set(b)}


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat()


def count_tis(af, dag_id: str, run_id: str, **filters: Any) -> int:
    params: list[tuple[str, Any]] = [("limit", 1)]
    for key, value in filters.items():
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            params.append((key, v))
    return af.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params=params)["total_entries"]


LOOP_RE = re.compile(r"Ran scheduling loop in ([0-9.]+) ms")
STAMP_RE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)")


def loop_timings(log_file: Path, start: float, end: float) -> list[float]:
    """Scheduler loop durations (ms) logged between ``start`` and ``end``."""
    out = []
    if not log_file.exists():
        return out
    with open(log_file, errors="replace") as fh:
        for line in fh:
            match = LOOP_RE.search(line)
            if not match:
                continue
            stamp = STAMP_RE.search(line)
            if stamp:
                try:
                    when = dt.datetime.fromisoformat(stamp.group(1).replace("Z", "+00:00"))
                    if when.tzinfo is None:
                        when = when.replace(tzinfo=dt.timezone.utc)
                    if not start <= when.timestamp() <= end:
                        continue
                except ValueError:
                    pass
            out.append(float(match.group(1)))
    return out


def processor_durations(log_file: Path, dag_file: Path) -> list[float]:
    """"Last Duration" of the file in the dag-processor's stats table (printed every print_stats_interval)."""
    if not log_file.exists():
        return []
    out, column = [], None
    for line in log_file.read_text(errors="replace").splitlines():
        if "Last Duration" in line:
            column = line.index("Last Duration")
        elif column is not None and dag_file.name in line:
            match = re.match(r"\s*(\d+(?:\.\d+)?)s", line[column:column + 16])
            if match:
                out.append(float(match.group(1)))
    return out


def last_error(log_file: Path) -> str | None:
    """The last exception line of a service's log (why it exited)."""
    if not log_file.exists():
        return None
    found = None
    for line in log_file.read_text(errors="replace").splitlines():
        if re.match(r"^[\w.]+(Error|Exception|Timeout)\b.*?:", line):
            found = line.strip()[:160]
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- 5: UI endpoints and pages ---------------------------------------------------------------------
def ui_endpoints(dag_id: str, run_id: str) -> list[tuple[str, str, list[tuple[str, Any]]]]:
    return [
        ("grid: structure", f"/ui/grid/structure/{dag_id}", [("limit", 10), ("order_by", "-run_after")]),
        ("grid: runs", f"/ui/grid/runs/{dag_id}", [("limit", 10), ("order_by", "-run_after")]),
        ("grid: ti_summaries", f"/ui/grid/ti_summaries/{dag_id}", [("run_ids", run_id)]),
        ("graph: structure_data", "/ui/structure/structure_data", [("dag_id", dag_id)]),
        ("dag details", f"/api/v2/dags/{dag_id}/details", []),
        ("run: 50 task instances", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", [("limit", 50)]),
    ]


def measure_endpoints(af, dag_id: str, run_id: str, repeats: int = 3) -> list[dict[str, Any]]:
    token = af.client.get("/auth/token").json()["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    rows = []
    for name, path, params in ui_endpoints(dag_id, run_id):
        times, size, status = [], None, None
        for _ in range(1 + repeats):
            started = time.perf_counter()
            try:
                response = af.client.get(path, params=params, headers=headers, timeout=300.0)
                body = response.content
                status, size = response.status_code, len(body)
            except Exception as exc:  # noqa: BLE001 - a timeout is a result
                status, size = type(exc).__name__, None
            times.append(time.perf_counter() - started)
        rows.append({"name": name, "path": path, "status": status, "bytes": size, "cold": times[0],
                     "warm": statistics.median(times[1:]) if len(times) > 1 else None})
    return rows


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """Headless Chromium driven through the DevTools protocol (no extra client library needed)."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
             f"--remote-debugging-port={self.port}", "--window-size=1600,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.ws = None
        self.stack = contextlib.ExitStack()
        self.next_id = 0
        import httpx  # noqa: PLC0415

        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                targets = httpx.get(f"http://127.0.0.1:{self.port}/json/list", timeout=2).json()
                page = next(t for t in targets if t.get("type") == "page")
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.3)
        else:
            self.close()
            raise RuntimeError("headless Chromium did not start within 90 s")
        from websockets.sync.client import connect  # noqa: PLC0415

        self.ws = self.stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10))
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Performance.enable")

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict:
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        deadline = time.time() + timeout
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError(f"{method} got no answer within {timeout:.0f}s")
            message = json.loads(self.ws.recv(timeout=left))
            if message.get("id") == my_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str, timeout: float = 60.0) -> Any:
        result = self.call("Runtime.evaluate", timeout=timeout, expression=expression, returnByValue=True,
                           awaitPromise=True)
        return result.get("result", {}).get("value")

    def close(self) -> None:
        try:
            self.stack.close()
        except Exception:  # noqa: BLE001, S110 - the browser is killed next anyway
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


COUNT_JS = ("(() => ({dom: document.getElementsByTagName('*').length,"
            " flow: document.querySelectorAll('.react-flow__node').length,"
            " links: document.querySelectorAll('a[href*=\"/tasks/\"]').length,"
            " text: (document.body ? document.body.innerText.length : 0)}))()")


def render_page(browser: Browser, url: str, view: str, budget: float) -> dict[str, Any]:
    """Load ``url`` with the DAG view set to ``view``: when the view is first drawn (task links in the grid,
    React Flow nodes in the graph), and when the DOM then stops changing for 3 s (a page of a running run
    refreshes itself, so it may never settle within the budget)."""
    browser.evaluate(f"localStorage.setItem('default_dag_view', JSON.stringify({view!r})); 1")
    started = time.perf_counter()
    browser.call("Page.navigate", url=url)
    last, stable_since, settled, first_drawn, probe_waits = None, None, None, None, []
    while time.perf_counter() - started < budget:
        time.sleep(0.5)
        asked = time.perf_counter()
        try:
            counts = browser.evaluate(COUNT_JS, timeout=max(1.0, budget - (asked - started)))
        except TimeoutError:
            break
        probe_waits.append(time.perf_counter() - asked)
        key = (counts or {}).get("dom")
        drawn = counts and (counts.get("flow", 0) if view == "graph" else counts.get("links", 0)) > 0
        if drawn and first_drawn is None:
            first_drawn = asked - started
        if first_drawn is not None and asked - started > first_drawn + 30:
            break  # drawn, and still changing 30 s later: a live page
        if drawn and key == (last or {}).get("dom"):
            if stable_since is None:
                stable_since = asked
            elif asked - stable_since >= 3.0:
                settled = stable_since - started
                break
        else:
            stable_since = None
        last = counts
    responsive = []
    for _ in range(3):
        asked = time.perf_counter()
        try:
            browser.evaluate("1", timeout=30)
            responsive.append(time.perf_counter() - asked)
        except TimeoutError:
            responsive.append(float("inf"))
    metrics = {m["name"]: m["value"] for m in browser.call("Performance.getMetrics").get("metrics", [])}
    shown = ""
    if first_drawn is None:
        try:
            shown = browser.evaluate("(document.querySelector('main') || document.body).innerText", timeout=30) or ""
        except Exception:  # noqa: BLE001
            shown = ""
    return {"view": view, "drawn": first_drawn, "settled": settled, "budget": budget, "counts": last or {},
            "shown": " ".join(shown.split())[:160],
            "heap_mb": metrics.get("JSHeapUsedSize", 0) / 2**20, "script_s": metrics.get("ScriptDuration"),
            "layout_s": metrics.get("LayoutDuration"), "probe_max": max(probe_waits, default=None),
            "responsive": max(responsive)}


def measure_pages(base_url: str, dag_id: str, run_id: str, profile: Path, budget: float) -> list[dict[str, Any]]:
    binary = find_chromium()
    if binary is None:
        return []
    rows = []
    for view in ("grid", "graph"):
        # A fresh browser per view: one view's heap or a hung main thread must not spill into the other.
        try:
            browser = Browser(binary, profile / view)
        except Exception as exc:  # noqa: BLE001 - report and go on
            rows.append({"view": view, "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        try:
            browser.call("Page.navigate", url=f"{base_url}/")
            time.sleep(3)
            rows.append(render_page(browser, f"{base_url}/dags/{dag_id}/runs/{run_id}", view, budget))
        except Exception as exc:  # noqa: BLE001 - report and go on
            rows.append({"view": view, "error": f"{type(exc).__name__}: {exc}"[:200]})
        finally:
            browser.close()
    return rows


# -- 4 + 5: one shape on a real Airflow ---------------------------------------------------------------
@dataclass
class RunResult:
    skipped: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)


def hops_saved(home: Path, dag_id: str, run_id: str, begin: float, end: float) -> int:
    """The run's hops saved between ``begin`` and ``end``: a hop is not a task instance (a train task
    trains every hop of its block on its shard slot), so they are counted from the store's hop records."""
    from mop_airflow.errors import StoreError  # noqa: PLC0415
    from mop_airflow.results.runs import load_hop_records, run_layout  # noqa: PLC0415

    try:
        records = load_hop_records(run_layout("file://" + str(home / "store"), dag_id, run_id))
    except StoreError:  # the run record was never written (the run failed in its first task)
        return 0
    return sum(1 for r in records if r.saved_at is not None and begin <= r.saved_at <= end)


def run_on_airflow(shape: Shape, home: Path, dag_file: Path, args: argparse.Namespace) -> RunResult:
    from mop_airflow.deployment.local import LocalAirflow, throwaway_postgres  # noqa: PLC0415
    from mop_airflow.hooks.pools import least_parallelism  # noqa: PLC0415

    # the preflight refuses a LocalExecutor that cannot run a block at once: that is the least a shape gets
    fig: dict[str, Any] = {"parallelism": args.parallelism or least_parallelism(shape.shards, 1)}
    extra = {
        "MOP_HOME": str(home),
        "MOP_PRELOAD": "1",
        "AIRFLOW__CORE__PARALLELISM": str(fig["parallelism"]),
        "AIRFLOW__LOGGING__NAMESPACE_LEVELS": "airflow.jobs.scheduler_job_runner=DEBUG",
        "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "30",
        "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": str(int(args.processor_timeout)),
    }
    notes: list[str] = []
    t0 = time.time()
    host, _, port = (args.postgres or "").partition(":")
    database = (throwaway_postgres(host, int(port or 5432), prefix="mop_dag_scale") if args.postgres
                else contextlib.nullcontext(None))
    with database as sql_alchemy_conn, LocalAirflow(home / "airflow", dag_file.parent, extra_env=extra,
                                                    log=lambda m: None, sql_alchemy_conn=sql_alchemy_conn) as af:
        fig["startup"] = time.time() - t0
        t1 = time.time()
        af.wait_for_dag(shape.dag_id, timeout=args.parse_timeout + 120)
        fig["dag_visible"] = time.time() - t1
        sync = subprocess.run([sys.executable, "-m", "mop_airflow.cli.main", "pools", "sync", "--shards",
                               str(shape.shards), "--slots", "1"], env=af.env, capture_output=True, text=True,
                              timeout=120, check=False)
        if sync.returncode != 0:
            raise RuntimeError(f"pools sync failed: {sync.stderr[-2000:]}")
        sampler = CpuSampler({name: proc.pid for name, proc in af.processes.items()})
        sampler.start()
        try:
            time.sleep(2)
            idle_start = time.time()
            time.sleep(args.baseline)
            idle_end = time.time()
            idle = sampler.delta(idle_start, idle_end)
            fig["idle_rate"] = {role: cpu / (idle_end - idle_start) for role, cpu in idle.items()}
            triggered = time.time()
            run_id = af.trigger(shape.dag_id)
            fig["run_id"] = run_id
            # setup: preflight .. stage_shard_<s>; bounded
            setup_deadline = time.time() + args.setup_timeout
            state = "running"
            while time.time() < setup_deadline:
                staged = count_tis(af, shape.dag_id, run_id, operator="MopStageShardOperator", state=list(TERMINAL))
                state = af.run_state(shape.dag_id, run_id)
                if staged >= shape.shards or state in ("success", "failed"):
                    break
                time.sleep(2)
            setup_done = time.time()
            fig["setup_seconds"] = setup_done - triggered
            fig["setup_tis"] = count_tis(af, shape.dag_id, run_id, state=list(TERMINAL))
            fig["setup_cpu"] = sampler.delta(triggered, setup_done)
            if state == "failed":
                notes.append("the run failed during setup")
            if staged < shape.shards:
                notes.append(f"setup did not finish within {args.setup_timeout:.0f}s")
            # steady window: hops (and, adaptively, deal/promote) only
            dead: set[str] = set()
            for name, ok in af.alive().items():
                if not ok:
                    dead.add(name)
                    notes.append(f"{name} exited during setup: "
                                 f"{last_error(af.home / 'logs' / f'{name}.log') or 'no error in its log'}")
            unfinished_start = count_tis(af, shape.dag_id, run_id) - count_tis(af, shape.dag_id, run_id,
                                                                               state=list(TERMINAL))
            end = setup_done + args.window
            while time.time() < end:
                if af.run_state(shape.dag_id, run_id) in ("success", "failed"):
                    notes.append("the run ended inside the window")
                    break
                for name, ok in af.alive().items():
                    if not ok and name not in dead:
                        dead.add(name)
                        notes.append(f"{name} exited during the window: "
                                     f"{last_error(af.home / 'logs' / f'{name}.log') or 'no error in its log'}")
                if "scheduler" in dead:
                    break
                time.sleep(min(5.0, max(0.1, end - time.time())))
            window_end = time.time()
            time.sleep(1.5)  # let the sampler take a reading past the window's end
            fig["window"] = window_end - setup_done
            fig["window_cpu"] = sampler.delta(setup_done, window_end)
            fig["run_cpu"] = sampler.delta(triggered, window_end)
            between = {"end_date_gte": iso(setup_done), "end_date_lte": iso(window_end)}
            fig["window_tis"] = count_tis(af, shape.dag_id, run_id, state=list(TERMINAL), **between)
            fig["window_hops"] = hops_saved(home, shape.dag_id, run_id, setup_done, window_end)
            fig["window_failed"] = count_tis(af, shape.dag_id, run_id, state=["failed", "upstream_failed"])
            fig["run_tis_terminal"] = count_tis(af, shape.dag_id, run_id, state=list(TERMINAL))
            fig["run_ti_rows"] = count_tis(af, shape.dag_id, run_id)
            fig["run_state"] = af.run_state(shape.dag_id, run_id)
            fig["dag_stale"] = af.api("GET", f"/dags/{shape.dag_id}").get("is_stale")
            fig["retried"] = count_tis(af, shape.dag_id, run_id, try_number=[2, 3, 4, 5])
            log_lines = (af.home / "logs" / "scheduler.log").read_text(errors="replace").splitlines()
            fig["orphan_resets"] = sum(1 for line in log_lines if "Reset the following" in line)
            fig["self_failed"] = sum(1 for line in log_lines if "SchedulerJob instances as failed" in line)
            fig["loops"] = loop_timings(af.home / "logs" / "scheduler.log", setup_done, window_end)
            fig["setup_loops"] = loop_timings(af.home / "logs" / "scheduler.log", triggered, setup_done)
            fig["unfinished"] = (unfinished_start + fig["run_ti_rows"] - fig["run_tis_terminal"]) / 2
            fig["titles"] = {role: sorted(t)[:3] for role, t in sampler.titles.items()}
            import psutil  # noqa: PLC0415

            if args.blocks:
                fig["blocks"] = follow_blocks(af, shape.dag_id, run_id, args.blocks, args.block_timeout)
            fig["rss_mb"] = {}
            for name, proc in af.processes.items():
                try:
                    fig["rss_mb"][name] = psutil.Process(proc.pid).memory_info().rss / 2**20
                except psutil.NoSuchProcess:
                    pass
            if not args.skip_ui:
                ui_started = time.time()
                try:
                    fig["endpoints"] = measure_endpoints(af, shape.dag_id, run_id)
                except Exception as exc:  # noqa: BLE001 - the scheduler figures above still count
                    fig["endpoints"] = []
                    notes.append(f"UI endpoints failed: {type(exc).__name__}: {str(exc)[:200]}")
                if args.skip_browser:
                    fig["pages_note"] = "skipped (--skip-browser)"
                elif find_chromium() is None:
                    fig["pages_note"] = "skipped: no Chromium on this machine (apt-get install -y chromium)"
                else:
                    fig["pages"] = measure_pages(af.base_url, shape.dag_id, run_id, home / "browser",
                                                 args.page_budget)
                fig["ui_cpu"] = sampler.delta(ui_started, time.time())
                fig["ui_seconds"] = time.time() - ui_started
        finally:
            sampler.stop_event.set()
            sampler.join(5)
        fig["processor_rows"] = processor_durations(af.home / "logs" / "dag-processor.log", dag_file)
    fig["notes"] = notes
    return RunResult(figures=fig)


def follow_blocks(af, dag_id: str, first: str, blocks: int, timeout: float) -> list[dict[str, Any]]:
    """The first ``blocks`` DAG runs of a search that goes on over runs (``<first>__block_<k>``): each
    run's wall time and train task instances, and the hand-over before it: from the end of the run
    before's last train task to the start of its own first (the decide task, the trigger, the
    scheduler starting the run and its control tasks). Stops at the run that reports, fails, or is not there within ``timeout``."""
    def stamp(value: str) -> float:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()

    rows: list[dict[str, Any]] = []
    for k in range(blocks):
        run_id = first if k == 0 else next_run_id(first, k)
        deadline, state = time.time() + timeout, None
        while time.time() < deadline:
            try:
                state = af.run_state(dag_id, run_id)
            except RuntimeError:  # not triggered yet: the run before is still deciding
                state = None
            if state in ("success", "failed"):
                break
            time.sleep(2)
        if state not in ("success", "failed"):
            break
        tis = af.task_instances(dag_id, run_id)
        # the block's train tasks (one per shard slot): the hand-over is the gap with none of them running
        trains = [ti for ti in tis if ti.get("operator") == "MopTrainShardOperator" and ti["state"] == "success"]
        ended = [stamp(ti["end_date"]) for ti in tis if ti.get("end_date")]
        started = [stamp(ti["start_date"]) for ti in tis if ti.get("start_date")]
        row = {"run_id": run_id, "state": state, "train_tasks": len(trains), "task_instances": len(tis),
               "wall": max(ended) - min(started) if ended and started else None,
               "first_hop": min((stamp(ti["start_date"]) for ti in trains), default=None),
               "last_hop": max((stamp(ti["end_date"]) for ti in trains), default=None),
               "reported": any(ti["task_id"].endswith("report") and ti["state"] == "success" for ti in tis)}
        if rows and rows[-1]["last_hop"] and row["first_hop"]:
            row["handover"] = row["first_hop"] - rows[-1]["last_hop"]
        rows.append(row)
        if state == "failed" or row["reported"]:
            break
    return rows


# -- printing --------------------------------------------------------------------------------------
def print_size(shape: Shape, configs: list[int]) -> dict[str, Any]:
    configs = sorted({*configs, *([shape.configs] if shape.configs else [])})
    plan, adaptive, plan_seconds = plan_of(shape)
    p = shape.shards
    blocks = len({t.task_id.rpartition(".")[0] for t in plan.tasks if t.kind == "train"})
    say(f"  tasks in the DAG: {len(plan.tasks)}  (train tasks {plan.train_tasks}: one per shard slot in each of "
        f"{blocks} block(s); other {len(plan.tasks) - plan.train_tasks})")
    if adaptive is None:
        hops = shape.iterations * p
        runs = expected_instances(shape, max(configs))["runs"]
        split = (f"; split over {runs} DAG runs of {hops // runs} hops each (schedule.iterations_per_run)"
                 if runs > 1 else "; all in one run")
        say(f"  hops per configuration T = iterations x shards = {hops}{split}")
        for n in configs:
            e = expected_instances(shape, n)
            times = f" x {e['runs']} runs" if e["runs"] > 1 else ""
            say(f"  task instances per run for {n:>4} configurations: {e['total']:>7}  (= {e['control']} control + "
                f"{e['hop_instances']} train tasks for {n} x {hops // e['runs']} model hops){times}")
    else:
        e = expected_instances(shape)
        say(f"  the plan draws {e['configs']} configurations and trains {e['model_hops']} model hops "
            f"(promoted configurations resume)")
        say(f"  task instances of a run: {e['total']}  (= {e['control']} control + {e['hop_instances']} train tasks, "
            f"in which {e['model_hops']} model hops train over the search's runs)")
    return {"tasks": len(plan.tasks), "train_tasks": plan.train_tasks, "plan_seconds_inproc": plan_seconds}


def print_parse(parse: dict[str, Any]) -> None:
    p = parse.get("parse")
    if parse.get("error"):
        say(f"  parse failed: {parse['error']}")
        if p is None:
            return
    if p is None:
        say(f"  parse (fresh interpreter, after `import airflow.sdk`): did not finish within {parse['timeout']:.0f}s"
            f" -> over dagbag_import_timeout ({IMPORT_TIMEOUT:.0f}s); the dag-processor would record an import error")
        return
    say(f"  parse (fresh interpreter, after `import airflow.sdk`): {fmt_s(p['seconds'])}   peak RSS {p['rss_mb']:.0f} MB")
    if "task_plan" in parse:
        say(f"  build_task_plan alone: {parse['task_plan']['seconds'] * 1000:.1f} ms")
    say(f"  one hash of the finished DAG (the SDK hashes it, all task ids included, twice for every dependency it "
        f"sets): {p['hash_seconds'] * 1000:.2f} ms x {p['edges']} edges = ~{p['hash_seconds'] * p['edges']:.1f}s of the "
        f"parse (the DAG is half its final size on average)")
    s = parse.get("serialize")
    if s is None:
        say(f"  serialization: did not finish within the {parse['timeout']:.0f}s budget")
        return
    say(f"  DagSerialization.to_dict: {fmt_s(s['seconds'])} (+ json.dumps {fmt_s(s['json_seconds'])});"
        f" serialized DAG {human_bytes(s['bytes'])} ({s['bytes'] / max(1, p['tasks']):.0f} B per task),"
        f" zlib {human_bytes(s['zlib_bytes'])}; peak RSS {s['rss_mb']:.0f} MB")
    d = parse.get("deserialize")
    if d:
        say(f"  DagSerialization.from_dict (scheduler / API server loading a new version): {fmt_s(d['seconds'])}")
    processor = p["seconds"] + s["seconds"]
    risk = lambda value, limit: ("OVER" if value > limit else "at risk (>50%)" if value > limit / 2  # noqa: E731
                                 else "ok")
    say(f"  dagbag_import_timeout {IMPORT_TIMEOUT:.0f}s vs parse {p['seconds']:.1f}s: {risk(p['seconds'], IMPORT_TIMEOUT)};"
        f"  dag_file_processor_timeout {PROCESSOR_TIMEOUT:.0f}s vs parse+serialize {processor:.1f}s: "
        f"{risk(processor, PROCESSOR_TIMEOUT)}")
    say(f"  re-parsed {REPARSE_INTERVAL:.0f}s after each parse (min_file_process_interval): parse+serialize keeps "
        f"{processor / (processor + REPARSE_INTERVAL):.0%} of a core busy in the dag-processor (from this measurement)")


def print_run(shape: Shape, result: RunResult, args: argparse.Namespace) -> None:
    if result.skipped:
        say(f"  scheduler: not run ({result.skipped})")
        return
    f = result.figures
    say(f"  Airflow up in {f['startup']:.0f}s; DAG visible through the API {f['dag_visible']:.0f}s later; "
        f"LocalExecutor parallelism {f['parallelism']}")
    idle = f["idle_rate"]
    say(f"  idle before the trigger ({args.baseline:.0f}s): scheduler {idle.get('scheduler', 0):.3f} CPU s/s, "
        f"dag-processor {idle.get('dag-processor', 0) + idle.get('dag-processor/children', 0):.3f} CPU s/s")
    sc = f["setup_cpu"]
    say(f"  setup (trigger -> every shard staged): {f['setup_seconds']:.0f}s, {f['setup_tis']} task instances done; "
        f"scheduler {sc.get('scheduler', 0):.1f} CPU s (run creation and expansion included)")
    w, tis, hops = f["window"], f["window_tis"], f["window_hops"]
    wc = f["window_cpu"]
    sched = wc.get("scheduler", 0.0)
    net = sched - idle.get("scheduler", 0.0) * w
    say(f"  steady window {w:.0f}s: {tis} task instances reached a terminal state ({hops} model hops saved in the store), "
        f"{tis / w * 60:.1f} per minute")
    if tis:
        say(f"  scheduler CPU {sched:.1f}s = {sched / w:.2f} of a core -> {1000 * sched / tis:.0f} CPU s per 1000 task "
            f"instances ({1000 * net / tis:.0f} minus the idle rate)")
    else:
        say(f"  scheduler CPU {sched:.1f}s; no task instance finished in the window")
    say(f"  alongside: executor workers {wc.get('executor workers', 0):.1f} CPU s, task processes "
        f"{wc.get('tasks', 0):.1f} CPU s, dag-processor {wc.get('dag-processor', 0) + wc.get('dag-processor/children', 0):.1f} "
        f"CPU s ({(wc.get('dag-processor', 0) + wc.get('dag-processor/children', 0)) / w:.2f} of a core), api-server "
        f"{wc.get('api-server', 0) + wc.get('api-server/children', 0):.1f} CPU s")
    loops = f["loops"]
    if loops:
        say(f"  scheduler loops in the window: {len(loops)}, median {statistics.median(loops):.0f} ms, "
            f"p90 {pct(loops, 0.9):.0f} ms, max {max(loops):.0f} ms, sum {sum(loops) / 1000:.1f}s of {w:.0f}s")
    else:
        say("  scheduler loop timings: none found in its log for the window")
    setup_loops = f.get("setup_loops") or []
    if setup_loops:
        say(f"  scheduler loops during setup: {len(setup_loops)}, median {statistics.median(setup_loops):.0f} ms, "
            f"max {max(setup_loops):.0f} ms")
    every = loops or setup_loops
    if every and f.get("unfinished"):
        say(f"  ~{f['unfinished']:.0f} unfinished task instances in the run -> {statistics.median(every) / f['unfinished']:.1f} ms "
            f"of scheduler loop per unfinished task instance (median loop / unfinished)")
    if f.get("retried") or f.get("orphan_resets") or f.get("self_failed"):
        say(f"  {f['retried']} task instances needed another try; the scheduler marked scheduler jobs failed "
            f"{f['self_failed']} time(s) and reset orphaned task instances {f['orphan_resets']} time(s) (a job whose "
            f"heartbeat is older than scheduler_health_check_threshold, 30 s, counts as dead: the scheduler heartbeats "
            f"once per loop)")
    say(f"  run so far: {f['run_tis_terminal']} of {f['run_ti_rows']} task instance rows terminal, state "
        f"{f['run_state']}, {f['window_failed']} failed; RSS "
        + ", ".join(f"{k} {v:.0f} MB" for k, v in sorted(f["rss_mb"].items())))
    blocks = f.get("blocks") or []
    if blocks:
        say(f"  runs of the search followed (--blocks {args.blocks}): {len(blocks)}")
        for row in blocks:
            handover = f", hand-over {row['handover']:.1f}s" if row.get("handover") is not None else ""
            say(f"    {row['run_id']}: {row['state']}, {row['task_instances']} task instances, {row['train_tasks']} train tasks, "
                f"wall {fmt_s(row['wall'], 0)}{handover}{', reported' if row['reported'] else ''}")
        handovers = [row["handover"] for row in blocks if row.get("handover") is not None]
        if handovers:
            say(f"  hand-over between blocks (last hop of a run -> first hop of the next): median "
                f"{statistics.median(handovers):.1f}s over {len(handovers)}")
    durations = f["processor_rows"]
    if durations:
        say(f"  the dag-processor's own stats table: last parse of the file took {durations[-1]:.2f}s "
            f"(max {max(durations):.2f}s over {len(durations)} stats rows)")
    titles = f.get("titles", {})
    if titles:
        say("  process roles seen under the scheduler: " + "; ".join(
            f"{role}: {names[0][:40]!r}" for role, names in sorted(titles.items())
            if role in ("executor workers", "tasks", "scheduler/other") and names))
    if f.get("dag_stale"):
        say("  the DAG was marked stale (deactivated) by the end of the window: the dag-processor stopped refreshing it")
    for note in f["notes"]:
        say(f"  note: {note}")
    if "endpoints" in f:
        say("  UI endpoints (cold = first request after the run started; warm = median of 3):")
        for r in f["endpoints"]:
            say(f"    {r['name']:<24} {r['status']!s:>4}  cold {fmt_s(r['cold'])}  warm {fmt_s(r['warm'])}  "
                f"{human_bytes(r['bytes'])}")
        if f.get("pages_note"):
            say(f"  UI pages: {f['pages_note']}")
        for r in f.get("pages", []):
            if "error" in r:
                say(f"    page {r['view']}: {r['error']}")
                continue
            c = r["counts"]
            drawn = f"drawn {r['drawn']:.1f}s" if r["drawn"] is not None else f"not drawn within {r['budget']:.0f}s"
            settled = (f"DOM settled {r['settled']:.1f}s" if r["settled"] is not None
                       else "DOM still changing (live run)" if r["drawn"] is not None else "")
            say(f"    page {r['view']:<5}: {drawn}, {settled}; {c.get('dom', 0)} elements, "
                f"{c.get('flow', 0)} graph nodes, {c.get('links', 0)} task links; JS heap {r['heap_mb']:.0f} MB, "
                f"script {r['script_s'] or 0:.1f}s, layout {r['layout_s'] or 0:.1f}s; main thread answered within "
                f"{r['responsive']:.2f}s afterwards (slowest probe while loading {fmt_s(r['probe_max'])})")
            if r.get("shown"):
                say(f"      the page showed: {r['shown']!r}")


def fit_quadratic(points: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Non-negative least squares y = a + b n + c n^2 through (n, y) points (relative errors weighted
    equally, so the small shapes count as much as the big ones)."""
    if len(points) < 3:
        return None
    import numpy as np  # noqa: PLC0415
    from scipy.optimize import nnls  # noqa: PLC0415

    n = np.array([x for x, _ in points], dtype=float)
    y = np.array([v for _, v in points], dtype=float)
    design = np.vstack([np.ones_like(n), n, n * n]).T / y[:, None]
    coeffs, _ = nnls(design, np.ones_like(y))
    return tuple(float(c) for c in coeffs)


def predict(fit: tuple[float, float, float], n: float) -> float:
    return fit[0] + fit[1] * n + fit[2] * n * n


def solve(fit: tuple[float, float, float], target: float) -> float | None:
    a, b, c = fit
    if abs(c) < 1e-15:
        return (target - a) / b if b > 0 else None
    disc = b * b - 4 * c * (a - target)
    if disc < 0:
        return None
    root = (-b + math.sqrt(disc)) / (2 * c)
    return root if root > 0 else None


def print_limits(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    say("\n== limits ==")
    parsed = [(r["tasks"], r["parse"]) for r in results.values() if r.get("parse", {}).get("parse")]
    # parsing
    if parsed:
        say("parsing (dag-processor, per parse, one core):")
        for tasks, parse in sorted(parsed, key=lambda x: x[0]):
            ser = parse.get("serialize", {}).get("seconds")
            say(f"  {tasks:>7} tasks: parse {parse['parse']['seconds']:6.1f}s = {1000 * parse['parse']['seconds'] / tasks:.2f} ms/task"
                + (f", + serialize {ser:6.1f}s = {1000 * ser / tasks:.2f} ms/task" if ser else ""))
        over = [(name, r) for name, r in results.items() if r.get("parse") and r["parse"].get("timed_out")]
        for name, r in over:
            say(f"  {r['tasks']:>7} tasks ({name}): not parsed within {r['parse']['timeout']:.0f}s")
        pts = [(t, p["parse"]["seconds"]) for t, p in parsed]
        both = [(t, p["parse"]["seconds"] + p["serialize"]["seconds"]) for t, p in parsed if p.get("serialize")]
        fit, fit2 = fit_quadratic(pts), fit_quadratic(both)
        if fit:
            say(f"  fit (non-negative least squares over the measured shapes): parse ~ {fit[0]:.2f}s + "
                f"{fit[1] * 1000:.3f} ms x n + {fit[2] * 1e6:.4f} us x n^2 (n = tasks; the n^2 term is the SDK hashing the "
                f"whole DAG for every dependency, see the hash figures above)")
            for name, r in over:
                say(f"  the fit says {predict(fit, r['tasks']):.0f}s for {name} ({r['tasks']} tasks); measured: more than "
                    f"{r['parse']['timeout']:.0f}s at load {r.get('load', '?')}")
            n30 = solve(fit, IMPORT_TIMEOUT)
            if n30:
                say(f"  -> parse reaches dagbag_import_timeout ({IMPORT_TIMEOUT:.0f}s) near {n30:,.0f} tasks on this machine")
        if fit2:
            say(f"  fit: parse + serialize ~ {fit2[0]:.2f}s + {fit2[1] * 1000:.3f} ms x n + {fit2[2] * 1e6:.4f} us x n^2")
            n50 = solve(fit2, PROCESSOR_TIMEOUT)
            if n50:
                say(f"  -> parse + serialize reaches dag_file_processor_timeout ({PROCESSOR_TIMEOUT:.0f}s) near {n50:,.0f} tasks")
            n_half = solve(fit2, REPARSE_INTERVAL)
            if n_half:
                say(f"  -> above ~{n_half:,.0f} tasks parse + serialize takes longer than min_file_process_interval "
                    f"({REPARSE_INTERVAL:.0f}s): the dag-processor spends over half a core on this one file")
        seen = [(name, r["run"].figures["processor_rows"]) for name, r in results.items()
                if r.get("run") and r["run"].figures.get("processor_rows")]
        if seen:
            say("  inside the running Airflow (CPU shared with the scheduler and tasks), the dag-processor's own stats: "
                + "; ".join(f"{name} max {max(rows):.1f}s" for name, rows in seen)
                + f" (dag_file_processor_timeout {PROCESSOR_TIMEOUT:.0f}s)")
    sizes = [(r["tasks"], r["parse"]["serialize"]) for r in results.values() if r.get("parse", {}).get("serialize")]
    if sizes:
        per_task = statistics.median(s["bytes"] / t for t, s in sizes)
        biggest = max(sizes, key=lambda x: x[0])
        say(f"serialization: ~{per_task / 1024:.1f} KB per task (median over shapes; the trigger form's params "
            f"are the DAG's alone, never copied into tasks); {biggest[0]} tasks -> "
            f"{human_bytes(biggest[1]['bytes'])} per DAG version row, {human_bytes(biggest[1]['zlib_bytes'])} compressed; "
            f"loading it back takes {fmt_s(results_deser(results, biggest[0]))}")
    # scheduler
    runs = [(name, r) for name, r in results.items() if r.get("run") and not r["run"].skipped and r["run"].figures]
    if runs:
        say("scheduler:")
        per_unfinished = []
        for name, r in runs:
            f = r["run"].figures
            tis, w = f["window_tis"], f["window"]
            sched = f["window_cpu"].get("scheduler", 0.0)
            loops = f["loops"] or f.get("setup_loops") or []
            text = f"  {name:<9} {r['tasks']:>6} tasks: "
            if tis:
                per_ti = sched / tis
                text += (f"{1000 * per_ti:5.0f} scheduler CPU s per 1000 task instances, {sched / w:.2f} of a core for "
                         f"{tis / w * 60:.0f} task instances/min (at most ~{60 / per_ti:.0f}/min per scheduler core at "
                         f"this size)")
            else:
                text += f"no task instance finished in {w:.0f}s of window ({sched:.0f} scheduler CPU s spent)"
            if loops and f.get("unfinished"):
                each = statistics.median(loops) / f["unfinished"]
                per_unfinished.append((f["unfinished"], each))
                text += (f"; loop median {statistics.median(loops) / 1000:.1f}s with ~{f['unfinished']:.0f} unfinished "
                         f"task instances = {each:.1f} ms each")
            say(text)
            say(f"  {'':<9} setup of one run (trigger -> shards staged, run creation included): "
                f"{f['setup_cpu'].get('scheduler', 0):.0f} scheduler CPU s, {f['setup_seconds']:.0f}s wall")
        say("  each time the scheduler examines a run it loads all of the run's task instances and checks the "
            "dependencies of every one still waiting (DagRun.task_instance_scheduling_decisions); a MOP run's task "
            "instances are its blocks' train tasks and control tasks, whatever its hops, so the loop grows with "
            "shards x slots x blocks, not with configurations or iterations")
        if per_unfinished:
            big = [e for n, e in per_unfinished if n >= 500] or [e for _, e in per_unfinished]
            each = statistics.median(big)
            say(f"  model from the runs with >= 500 unfinished task instances (small runs' loops are mostly fixed "
                f"cost): loop ~ {each:.1f} ms x unfinished task instances. Hops are not task instances: a slot "
                "takes its next hop itself, so the loop delays only a block's start and end (hand-over between "
                "blocks); a loop of 1 s would take this many:")
            say(f"    ~{1000 / each:,.0f} unfinished task instances")
    # UI
    ui = [(name, r) for name, r in results.items() if r.get("run") and r["run"].figures.get("endpoints")]
    if ui:
        say("UI:")
        for name, r in ui:
            eps = {e["name"]: e for e in r["run"].figures["endpoints"]}
            grid = [eps[k] for k in ("grid: structure", "grid: runs", "grid: ti_summaries") if k in eps]
            graph = eps.get("graph: structure_data")
            g_time = sum((e["warm"] or e["cold"]) for e in grid)
            g_bytes = sum(e["bytes"] or 0 for e in grid)
            text = f"  {name:<9} {r['tasks']:>6} tasks: grid endpoints {g_time:.2f}s warm / {human_bytes(g_bytes)}"
            if graph:
                text += f"; graph structure_data {fmt_s(graph['warm'] or graph['cold'])} / {human_bytes(graph['bytes'])}"
            for page in r["run"].figures.get("pages", []):
                if "error" in page:
                    text += f"; {page['view']} page: {page['error'][:60]}"
                else:
                    drawn = f"{page['drawn']:.0f}s" if page["drawn"] is not None else f">{page['budget']:.0f}s"
                    text += f"; {page['view']} page drawn {drawn}, {page['counts'].get('dom', 0)} DOM elements"
            say(text)
    # past the limits
    say("past the limits (tasks = a train task per shard slot per block, plus the control tasks; a run has one "
        "task instance per task, each train task training every hop of its block on its shard slot):")
    alternatives = [("16 shards x 20 iterations, epochs_per_hop=1", 16, 20, None),
                    ("16 shards x 5 iterations, epochs_per_hop=4 (same 20 passes)", 16, 5, None),
                    ("8 shards x 20 iterations, epochs_per_hop=1 (bigger shards)", 8, 20, None),
                    ("8 shards x 5 iterations, epochs_per_hop=4", 8, 5, None),
                    ("Hyperband R=81 eta=3, 16 shards", 16, 1, {"method": "hyperband", "R": 81, "eta": 3}),
                    ("Hyperband R=27 eta=3, 16 shards, epochs_per_hop=3 (same 81-pass top rung)", 16, 1,
                     {"method": "hyperband", "R": 27, "eta": 3}),
                    ("Hyperband R=81 eta=3, 4 shards", 4, 1, {"method": "hyperband", "R": 81, "eta": 3}),
                    ("Hyperband R=27 eta=3, 4 shards, epochs_per_hop=3", 4, 1, {"method": "hyperband", "R": 27, "eta": 3})]
    fit = fit_quadratic([(t, p["parse"]["seconds"] + p.get("serialize", {}).get("seconds", 0.0))
                         for t, p in parsed if p.get("serialize")]) if parsed else None
    for label, p, iterations, adaptive in alternatives:
        plan = build_task_plan(p, iterations, adaptive_plan(adaptive, p) if adaptive else None)
        guess = ""
        if fit:
            guess = f"; parse+serialize ~{predict(fit, len(plan.tasks)):.0f}s by the fit"
        say(f"  {label:<78} {len(plan.tasks):>7} tasks{guess}")
    say("  what to do: keep a DAG file within the measured budget above; fewer, larger shards (tasks grow with "
        "shards x slots, one train task each a block); epochs_per_hop > 1 with proportionally fewer iterations (same "
        "passes over the data, fewer hops); metrics_every > 1 makes each hop cheaper (validation "
        "every k iterations) but does not shrink the DAG; an adaptive search too large to draw goes on over DAG "
        "runs by itself (search.adaptive.between_runs); if a big DAG must stay, raise [core] dagbag_import_timeout, [dag_processor] "
        "dag_file_processor_timeout and min_file_process_interval (the file only changes when you edit it)")
    say("  for the scheduler: a run's task instances are its blocks' train tasks (shards x slots each) and control "
        "tasks, whatever the number of configurations and hops; a block's train tasks must all run at once, so "
        "[core] parallelism (or the workers' concurrency) must cover shards x slots; an adaptive search past 600 "
        "class-hops is decided between blocks of one iteration, one block a run")
    notes = [n for r in results.values() if r.get("run") and r["run"].figures for n in r["run"].figures.get("notes", [])]
    if any("database is locked" in n for n in notes):
        say("  the SQLite metadata database (one writer at a time) locked other services out during long scheduling "
            "loops (see the notes above): big DAGs need a server database such as PostgreSQL")


def results_deser(results: dict[str, dict[str, Any]], tasks: int) -> float | None:
    for r in results.values():
        if r["tasks"] == tasks and r.get("parse", {}).get("deserialize"):
            return r["parse"]["deserialize"]["seconds"]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated subset of {', '.join(SHAPES)}")
    parser.add_argument("--window", type=float, default=240.0, help="seconds of steady-state scheduler measurement")
    parser.add_argument("--baseline", type=float, default=30.0, help="seconds of idle measurement before the trigger")
    parser.add_argument("--setup-timeout", type=float, default=600.0, help="bound on trigger -> every shard staged")
    parser.add_argument("--parse-timeout", type=float, default=300.0, help="bound on parse + serialize per shape")
    parser.add_argument("--parallelism", type=int, default=0,
                        help="LocalExecutor slots ([core] parallelism); default: the shape's shards + 1, the least "
                             "its blocks run with")
    parser.add_argument("--processor-timeout", type=float, default=PROCESSOR_TIMEOUT,
                        help="[dag_processor] dag_file_processor_timeout of the embedded Airflow (Airflow's default: 50)")
    parser.add_argument("--blocks", type=int, default=0,
                        help="after the window, follow a search that goes on over DAG runs for this many runs "
                             "(each run's wall time and hops, the hand-over between runs)")
    parser.add_argument("--block-timeout", type=float, default=900.0, help="bound on waiting for one run of --blocks")
    parser.add_argument("--configs", default="16,64,256", help="configuration counts for the task-instance table")
    parser.add_argument("--page-budget", type=float, default=120.0, help="bound on rendering one UI page")
    parser.add_argument("--skip-scheduler", action="store_true")
    parser.add_argument("--skip-ui", action="store_true")
    parser.add_argument("--skip-browser", action="store_true", help="time the UI endpoints but render no page")
    parser.add_argument("--postgres", metavar="HOST:PORT", default=None,
                        help="run Airflow on a throw-away PostgreSQL database on that server instead of SQLite")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, data, Airflow home)")
    args = parser.parse_args()
    names = [n.strip() for n in args.shapes.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; choose from {list(SHAPES)}")
    configs = [int(c) for c in args.configs.split(",")]
    root = Path(tempfile.mkdtemp(prefix="mop-dag-scale-"))
    header("dag_scale")
    say(f"shapes: {', '.join(names)}; window {args.window:.0f}s; parse budget {args.parse_timeout:.0f}s")
    results: dict[str, dict[str, Any]] = {}
    started = time.time()
    try:
        # the data check asks for a batch of 16 rows on every shard after holding out 20 %: 64 shards need
        # more than the 800 rows the small shapes use
        widest = max(SHAPES[name].shards for name in names)
        data = write_tiny_data(root / "shared" / "data", rows=max(800, 2 * math.ceil(widest * 16 / 0.8)))
        for name in names:
            shape = SHAPES[name]
            home = root / name
            (home / "data").mkdir(parents=True, exist_ok=True)
            shutil.copy(data, home / "data" / "train.parquet")
            dag_file = write_dag_file(shape, home)
            say(f"\n== {name}: {shape.label} ==  ({load()})")
            entry: dict[str, Any] = print_size(shape, configs)
            entry["parse"] = parse = measure_parse(dag_file, args.parse_timeout)
            entry["load"] = f"{os.getloadavg()[0]:.1f}"
            print_parse(parse)
            results[name] = entry
            if args.skip_scheduler:
                continue
            if shape.parse_only:
                entry["run"] = RunResult(skipped="a parse-only shape, for the parse / serialize fit (16x20 already "
                                                 "shows the scheduler's limit)")
            elif not parse.get("serialize"):
                entry["run"] = RunResult(skipped="the file is not parsed and serialized within the budget, so the "
                                                 "dag-processor would time out and the scheduler would never see it")
            elif parse["parse"]["seconds"] + parse["serialize"]["seconds"] > args.processor_timeout:
                entry["run"] = RunResult(skipped="parse + serialize exceeds dag_file_processor_timeout "
                                                 f"({args.processor_timeout:.0f}s; raise it with --processor-timeout)")
            else:
                say(f"  scheduler: starting Airflow; steady window {args.window:.0f}s ...")
                try:
                    entry["run"] = run_on_airflow(shape, home, dag_file, args)
                except Exception as exc:  # noqa: BLE001 - report and go on with the next shape
                    entry["run"] = RunResult(skipped=f"failed: {type(exc).__name__}: {str(exc)[:300]}")
            print_run(shape, entry["run"], args)
            say(f"  ({load()})")
        print_limits(results, args)
        # a run whose tasks failed measured a failure, not the scheduler: say so and exit 1
        failed = [name for name, entry in results.items() if entry.get("run") and (
            entry["run"].figures.get("window_failed") or (entry["run"].skipped or "").startswith("failed"))]
        if failed:
            say(f"\nFAILED: the DAG run of {', '.join(failed)} failed or had failed task instances; its figures "
                "measure that failure (see the task logs: --keep)")
        result("dag_scale", {name: {"tasks": entry["tasks"], "train_tasks": entry["train_tasks"],
                                    "parse": entry["parse"]} for name, entry in results.items()})
    finally:
        if args.keep:
            say(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    say(f"\ndone in {time.time() - started:.0f}s; {load()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
