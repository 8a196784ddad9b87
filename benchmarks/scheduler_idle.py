"""What the embedded Airflow's scheduler costs while nothing runs, for each ``scheduler_idle_sleep_time``.

The embedded Airflow (``mop-airflow up``, ``make demo``, the tests) sleeps 0.2 s between idle
scheduler loops instead of Airflow's 1 s: every hand-off (a task ends, the next is queued) waits for
the next loop, and a MOP run hands off after every hop. This prints the price of that: the
scheduler's CPU while idle, with the example DAGs loaded and no run, measured from /proc (psutil)
over ``--seconds`` after a settling minute, for each value side by side in one run.

    python benchmarks/scheduler_idle.py [--values 1.0,0.2] [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import REPO, header, result  # noqa: E402


def scheduler_cpu(value: str, seconds: float, settle: float) -> float:
    """CPU seconds of the scheduler process and its children (the LocalExecutor's workers) over ``seconds``."""
    import psutil  # noqa: PLC0415

    from mop_airflow.deployment.local import LocalAirflow  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="mop-idle-") as tmp:
        home = Path(tmp)
        env = {"AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": value}
        with LocalAirflow(home / "airflow", REPO / "dags", extra_env=env, log=lambda *a: None) as af:
            af.wait_healthy()
            time.sleep(settle)  # the dag-processor's first parses, the api-server's warm-up
            root = psutil.Process(af.processes["scheduler"].pid)

            def cpu() -> float:
                total = 0.0
                for proc in [root, *root.children(recursive=True)]:
                    try:
                        times = proc.cpu_times()
                        total += times.user + times.system
                    except psutil.NoSuchProcess:
                        pass
                return total

            before = cpu()
            time.sleep(seconds)
            return cpu() - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", default="1.0,0.2", help="comma-separated scheduler_idle_sleep_time values")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=60.0)
    args = parser.parse_args(argv)
    header("scheduler_idle")
    share = {}
    for value in args.values.split(","):
        used = scheduler_cpu(value.strip(), args.seconds, args.settle)
        share[value.strip()] = round(100 * used / args.seconds, 1)
        print(f"scheduler_idle_sleep_time {value.strip():>4} s: scheduler CPU {used:.2f} s over {args.seconds:.0f} s "
              f"idle = {share[value.strip()]:.1f} % of one core; load average {os.getloadavg()[0]:.2f}",
              flush=True)
    result("scheduler_idle", {"seconds": args.seconds, "percent_of_a_core": share})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
