"""What a host fault costs a search across hosts: runs with a shard host cut off, or lost and replaced,
against clean runs, on the hosts tests/test_hosts.py makes.

The hosts and their deployment are tests/host_search.py's (network namespaces from tests/hosts.py; needs
root): a control host (PostgreSQL, Redis, the Airflow services, the default queue's worker), a storage
host (moto's S3 server, the only thing shared) and four shard hosts with one Celery worker each,
configured by the files ``mop-airflow celery config`` writes, copied to each host as
docs/how-to/celery.md says. The demo's grid (8 configurations x 4 shards x 3 iterations) with its data
and store on S3 is triggered again and again, each run after the previous one ended, in rounds of

  clean   trigger, wait for the run to succeed;
  cut     trigger; once shard 1's train task has run 3 s, shard host 1's link goes down for 60 s, then up;
  lost    trigger; once shard 2's train task has run 3 s, shard host 2 is lost (every process killed, its
          folder removed); 20 s later a new, empty host starts a worker on its queue.

A warm-up clean run goes first (the first run shards the data and publishes the champion, which later
runs reuse); it is printed, in no median. Prints each run's seconds (trigger to success, as the client
sees it), whether every leaderboard equals the first clean run's to every digit and whether anything
(hop record, checkpoint) was written twice; then the median of each kind and its seconds over the
median clean run. Exits non-zero if a run fails, a leaderboard differs or something was written twice.

    sudo python benchmarks/host_faults.py [--runs 3] [--warmup 1] [--cut-off 60] [--replace-after 20] [--home DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import header, result  # noqa: E402

CUT_SHARD, LOST_SHARD = 1, 2
KINDS = ("clean", "cut", "lost")


def one_run(search, kind: str, round_: int, args: argparse.Namespace) -> dict[str, Any]:
    from tests.host_search import DAG_ID, wait_mid_block  # noqa: PLC0415

    af = search.af
    began = time.time()
    run_id = af.trigger(DAG_ID)
    facts: dict[str, Any] = {"kind": kind, "run_id": run_id}
    if kind == "cut":
        wait_mid_block(af, run_id, CUT_SHARD)
        facts["fault_at_s"] = round(time.time() - began, 1)
        host = search.shards[CUT_SHARD]
        host.cut()
        try:
            time.sleep(args.cut_off)
        finally:
            host.restore()
    elif kind == "lost":
        wait_mid_block(af, run_id, LOST_SHARD)
        facts["fault_at_s"] = round(time.time() - began, 1)
        search.shards[LOST_SHARD].lose()
        time.sleep(args.replace_after)
        search.add_shard_host(LOST_SHARD, f"shard{LOST_SHARD}new{round_}")
    facts["state"] = af.wait_for_run(DAG_ID, run_id, timeout=1800, tick=1.0)
    facts["seconds"] = round(time.time() - began, 1)
    tis = af.task_instances(DAG_ID, run_id)
    facts["ran_again"] = [f"{ti['task_id']} (try {ti['try_number']})" for ti in tis if (ti["try_number"] or 0) > 1]
    if facts["state"] == "success":
        facts["leaderboard"] = search.leaderboard(run_id)
        twice = search.written_twice(run_id)
        facts["written_twice"] = twice["checkpoints"] + twice["records"] + twice["rewritten"] + twice["unmarked"]
    return facts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds of a clean, a cut and a lost run (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="clean runs first, in no median (default 1)")
    parser.add_argument("--cut-off", type=float, default=60.0, help="seconds shard host 1 stays cut off")
    parser.add_argument("--replace-after", type=float, default=20.0, help="seconds from the loss to the new host")
    parser.add_argument("--home", help="keep the hosts' folders and logs here (default: a temporary folder, deleted)")
    args = parser.parse_args(argv)
    from tests.host_search import HostSearch  # noqa: PLC0415
    from tests.hosts import can_make_hosts  # noqa: PLC0415

    why = can_make_hosts()
    if why:
        print(f"cannot make hosts here: {why}", file=sys.stderr)
        return 2
    header("host_faults", f"the demo DAG across 6 hosts (network namespaces), {args.runs} rounds of a clean run, "
                          f"shard host {CUT_SHARD} cut off {args.cut_off:g} s and shard host {LOST_SHARD} lost and "
                          f"replaced {args.replace_after:g} s later; {args.warmup} warm-up")
    base = Path(args.home or tempfile.mkdtemp(prefix="mop-host-faults-")).absolute()
    runs: list[dict[str, Any]] = []
    plan = [("warm-up", 0)] * args.warmup + [(kind, i) for i in range(args.runs) for kind in KINDS]
    try:
        with HostSearch(base, log=lambda *a, **k: None, replacements=max(1, args.runs)) as search:
            print("hosts ready", flush=True)
            for kind, round_ in plan:
                run = one_run(search, "clean" if kind == "warm-up" else kind, round_, args)
                run["kind"] = kind
                runs.append(run)
                print(f"{kind:<8} {run['seconds']:7.1f} s  {run['state']}  fault at {run.get('fault_at_s', '-')} s; "
                      f"ran again: {', '.join(run['ran_again']) or 'nothing'}; written twice: "
                      f"{', '.join(run.get('written_twice', [])) or 'nothing'}", flush=True)
                if run["state"] != "success":
                    break
    finally:
        if not args.home:
            shutil.rmtree(base, ignore_errors=True)
    seconds = {kind: [r["seconds"] for r in runs if r["kind"] == kind and r["state"] == "success"] for kind in KINDS}
    reference = next((r for r in runs if r["kind"] == "clean" and r["state"] == "success"), None)
    differ = [r["run_id"] for r in runs if r["state"] == "success" and reference
              and r["leaderboard"] != reference["leaderboard"]]
    twice = {r["run_id"]: r["written_twice"] for r in runs if r.get("written_twice")}
    print()
    medians = {kind: statistics.median(s) for kind, s in seconds.items() if s}
    for kind in KINDS:
        if kind in medians:
            over = "" if kind == "clean" or "clean" not in medians else f", {medians[kind] - medians['clean']:+.1f} s over clean"
            print(f"{kind:<6} runs: {', '.join(f'{s:.1f}' for s in seconds[kind])} s; median {medians[kind]:.1f} s{over}")
    if reference:
        print(f"leaderboards: {'every run equals' if not differ else 'DIFFER from'} the first clean run's"
              + (f": {', '.join(differ)}" if differ else ""))
    print("written once in every run: " + ("yes" if not twice else f"NO: {twice}"))
    result("host_faults", {
        "runs": [{k: v for k, v in r.items() if k != "leaderboard"} for r in runs],
        "seconds": seconds, "medians": medians,
        "over_clean_s": {k: round(v - medians["clean"], 1) for k, v in medians.items() if "clean" in medians},
        "leaderboards_equal": bool(reference) and not differ, "written_once": not twice,
    })
    ok = all(r["state"] == "success" for r in runs) and len(runs) == len(plan)
    return 0 if ok and reference and not differ and not twice else 1


if __name__ == "__main__":
    sys.exit(main())
