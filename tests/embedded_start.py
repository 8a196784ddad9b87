"""Where an embedded Airflow's start goes (the tests' and `mop-airflow up`'s): wall time per phase, CPU per service.

    python tests/embedded_start.py --repeat 3
    python tests/embedded_start.py --repeat 3 --variant nopreload:MOP_PRELOAD=0
    python tests/embedded_start.py --repeat 3 --variant before:PYTHONPATH=/path/to/an/older/checkout

Each start is a process of its own with the variant's environment (``PYTHONPATH`` pointing at another
checkout compares its code), and LocalAirflow's own ``start()``, timed where its steps return: the
metadata database (a copy of one migrated before, as the tests do), the api-server answering, the
task execution API warm, every service healthy (phases overlap where the start overlaps them: each
time is from the start). CPU seconds are those of each service's process tree when the start ends
(user + system, children included): on a shared, loaded machine they move far less than wall time.
Variants run interleaved, one start of each per round, so that each sees the same load; each line is
one start, the summary the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def one_start(work: Path) -> dict:
    from mop_airflow.deployment.local import LocalAirflow

    home = Path(tempfile.mkdtemp(dir=work))
    (home / "dags").mkdir()
    af = LocalAirflow(home / "airflow", home / "dags", extra_env={"MOP_HOME": str(home / "mop")},
                      log=lambda *a: None)
    marks: dict[str, float] = {}
    steps = {"migrate": "database", "wait_api": "api answers", "warm_execution_api": "execution api warm",
             "wait_healthy": "all healthy"}
    for method, label in steps.items():
        if hasattr(af, method):
            def timed(*args, _real=getattr(af, method), _label=label, **kwargs):
                result = _real(*args, **kwargs)
                marks[_label] = time.time()
                return result
            setattr(af, method, timed)
    started = time.time()
    with af:
        ended = time.time()
        cpu = {name: round(cpu_seconds(proc.pid), 1) for name, proc in af.processes.items()}
    phases = {label: round(t - started, 1) for label, t in sorted(marks.items(), key=lambda kv: kv[1])}
    return {"phases": {**phases, "total": round(ended - started, 1)}, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:KEY=VALUE,KEY=VALUE (the environment of its starts); 'default' always runs")
    parser.add_argument("--one", metavar="WORK", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_start(Path(args.one))))
        return
    variants = {"default": {}}
    for text in args.variant:
        name, _, pairs = text.partition(":")
        variants[name] = dict(p.split("=", 1) for p in pairs.split(",") if p)
    work = Path(tempfile.mkdtemp(prefix="embedded-start-"))
    base = {**os.environ, "MOP_MIGRATED_DB_DIR": str(work / "migrated")}

    def run(extra: dict[str, str]) -> dict:
        out = subprocess.run([sys.executable, __file__, "--one", str(work)], env={**base, **extra},
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    run({})  # migrates the database template once; not counted
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for round_ in range(args.repeat):
        for name, extra in variants.items():
            result = run(extra)
            results[name].append(result)
            print(json.dumps({"variant": name, "round": round_, "load1": round(os.getloadavg()[0], 1), **result}),
                  flush=True)
    for name, runs in results.items():
        phases = {k: statistics.median(r["phases"][k] for r in runs) for k in runs[-1]["phases"]}
        cpu = {k: statistics.median(r["cpu"][k] for r in runs) for k in runs[-1]["cpu"]}
        print(f"median of {len(runs)} {name}: wall {phases} cpu {cpu}")


if __name__ == "__main__":
    main()
