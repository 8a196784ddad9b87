"""What the benchmarks share: the repository on the import path, the machine, date and load a figure
was measured on, median (range) of several runs, the example data, a DAG file from a spec, the
embedded Airflow, a side run in a process of its own, and the JSON line every benchmark ends with.

A benchmark prints ``header(name)`` first and ``result(name, figures)`` last: one JSON line holding
the benchmark, the date (UTC), the machine, the load average and the command line beside its figures,
so a row of ``docs/performance.md`` can be checked against the run that produced it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# What a figure depends on, by distribution name: the versions are read without importing them.
PACKAGES = ("apache-airflow", "keras", "tensorflow", "jax", "ray")


# -- the machine, the date, the load -----------------------------------------------------------------

def utc_now() -> str:
    return f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"


def load() -> str:
    """The load average over 1, 5 and 15 minutes: how busy the machine was around a figure."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def gpus() -> list[str]:
    """The NVIDIA GPUs ``nvidia-smi`` lists (name, memory, driver); none without its driver."""
    if not shutil.which("nvidia-smi"):
        return []
    listed = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout
    return [line.strip() for line in listed.splitlines() if line.strip()]


def cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as info:
        return int(info.readline().split()[1]) / 2**20
    return None


def machine() -> str:
    """The machine in one line: cores and CPU, memory, OS, Python, the versions that matter, the GPUs."""
    memory = memory_gib()
    installed = ", ".join(f"{name.removeprefix('apache-')} {v}" for name in PACKAGES if (v := version(name)))
    return (f"{os.cpu_count()} cores ({cpu_model()}){f', {memory:.0f} GiB' if memory else ''}, {platform.platform()}; "
            f"Python {platform.python_version()}, {installed}; backend {os.environ.get('KERAS_BACKEND', 'tensorflow')}; "
            f"GPU: {'; '.join(gpus()) or 'none'}")


def header(name: str, what: str = "") -> None:
    """The first lines a benchmark prints: what it runs, when, where, and how loaded the machine was."""
    print(f"{name}{': ' + what if what else ''}\ndate: {utc_now()}\nmachine: {machine()}\nload average: {load()}",
          flush=True)


def result(name: str, figures: dict[str, Any]) -> dict[str, Any]:
    """The last line a benchmark prints: its figures as JSON, with the date, machine, load and command."""
    line = {"benchmark": name, "date": utc_now(), "machine": machine(), "load": load(),
            "command": " ".join(["python", f"benchmarks/{name}.py", *sys.argv[1:]]), **figures}
    print(json.dumps(line, default=str), flush=True)
    return line


# -- timing ----------------------------------------------------------------------------------------

def spread(values: Sequence[float], unit: str = " s", digits: int = 1) -> str:
    """``median (min-max)`` of several runs, as the performance page gives them."""
    values = [v for v in values if v == v]  # NaN: not run
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}{unit}"
    return f"{statistics.median(values):.{digits}f}{unit} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def summary(values: Sequence[float]) -> dict[str, float | int]:
    """Median, range and count of several runs, for the JSON line."""
    values = [v for v in values if v == v]
    if not values:
        return {"runs": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    out = fn()
    return time.perf_counter() - began, out


def timed_process(script: str, *args: str, env: dict[str, str] | None = None) -> tuple[float, Any]:
    """Run ``script *args`` in a fresh Python process: its wall time and the JSON of its last line
    (a side of a comparison that must pay its own imports, as a user's process would)."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{Path(script).name} {' '.join(args[:1])} failed:\n{done.stderr[-3000:]}")
    return wall, json.loads(done.stdout.strip().splitlines()[-1])


def one_thread() -> None:
    """TensorFlow's thread pools as a train task's (``threads_per_hop: 1``), so no side of a comparison
    gets more cores; on Keras's JAX backend nothing to set (JAX keeps its own pool everywhere)."""
    import keras  # noqa: PLC0415

    if keras.config.backend() == "tensorflow":
        import tensorflow as tf  # noqa: PLC0415

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)


# -- data, DAG files, the embedded Airflow ------------------------------------------------------------

def example_data(folder: str | Path) -> str:
    """MNIST-1D as ``mop-airflow example-data`` writes it (16,000 training rows, 4,000 to validate)."""
    from mop_airflow.examples.mnist1d_data import write_mnist1d  # noqa: PLC0415

    write_mnist1d(str(folder))
    return str(folder)


def write_dag(folder: Path, dag_id: str, spec: dict[str, Any]) -> Path:
    """A DAG file that builds ``dag_id`` from ``spec`` with ``build_mop_dag``, as a user's would."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dag_id}.py"
    path.write_text("import json\nfrom mop_airflow import build_mop_dag\n"
                    f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={dag_id!r})\n")
    return path


@contextlib.contextmanager
def embedded_airflow(home: Path, dags: Path, *, env: dict[str, str] | None = None, quiet: bool = True,
                     pools_for: str | None = None, **kwargs: Any) -> Iterator[Any]:
    """The embedded Airflow (``mop-airflow up``: SQLite, LocalExecutor) on ``dags``, its home and the
    runs' store under ``home``; the DAG files are parsed once (no re-parse while a run goes). With
    ``pools_for``, waits for that DAG and syncs its shard pools, as ``mop-airflow demo`` does."""
    from mop_airflow.deployment.local import LocalAirflow  # noqa: PLC0415

    settings = {"MOP_HOME": str(home), "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
                **(env or {})}
    log = (lambda *a, **k: None) if quiet else print
    with LocalAirflow(home / "airflow", dags, extra_env=settings, log=log, **kwargs) as af:
        if pools_for:
            from mop_airflow.cli.demo import sync_pools_for  # noqa: PLC0415

            af.wait_for_dag(pools_for)
            sync_pools_for(af)
        yield af


def run_seconds(af: Any, dag_id: str, first: str, last: str | None = None) -> float:
    """From the start of DAG run ``first`` to the end of ``last`` (itself by default), as Airflow records them."""
    start = af.api("GET", f"/dags/{dag_id}/dagRuns/{first}")["start_date"]
    end = af.api("GET", f"/dags/{dag_id}/dagRuns/{last or first}")["end_date"]
    return (dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds()
