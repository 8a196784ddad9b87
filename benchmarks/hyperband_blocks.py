"""A whole Hyperband search in blocks to the rung ends, on a real Airflow: how long, and how close to the bound.

Hyperband (``--R``, ``--eta``) on ``--shards`` one-slot shards is one DAG run of one block per rung
end (R=81, eta=3: iterations 1, 3, 9, 27 and 81, so 5 blocks). A block is one train task per shard
slot (``train_shard_<s>``, ``block_<k>.train_shard_<s>``) that trains every hop the block puts on its
slot in one warm process, then a decide step (``block_<k>.decide``, the last one ``decide``) ranks what
ended there and writes the next block's decision (``<run>/blocks/``, a BlockDecision record).

Workload: configurations of ``mop_airflow.examples.timed_models:sleepy`` drawn at random (learning
rate and width vary), all with the same ``seconds_per_batch``; every shard has exactly ``--batches``
batches, so every hop trains ``batches x seconds_per_batch`` seconds while its process sleeps, and a
2-core machine runs 16 such hops side by side. The DAG runs on the embedded Airflow (SQLite,
LocalExecutor with ``[core] parallelism`` of shards + 1: a block's train tasks all at once, beside a
control task).

measured  per block: its configurations and hops (hop records), its wall from its first hop taken
          (``started_at``) to its last hop committed (``saved_at``), and the hand-over from the block
          before: that block's last commit to this block's first hop taken (its train tasks ending,
          the decide step, the next block's deal tasks, the new train tasks' start-up).
          search wall = the first task's start to the report's end; hop window = the first hop taken
          to the last hop committed.
bound     hops x hop seconds / slots: every slot training all the time, nothing else (unreachable
          where a block has fewer configurations than slots: R=81's last block trains 10 on 16, each a
          chain of 864 hops). "With the blocks": the simulator with every hop the set training time and
          nothing else, the blocks one after another and each configuration's hops one after another.
estimate  :func:`~mop_airflow.planning.simulation.estimate_seconds` for the same plan, every task paying
          the measured median train task start-up (its start -> its first hop taken, where that hop was
          ready at once), every hop taking
          A  the measured median slot time (taken -> released)
          B  the mean slot time
          C  the mean slot time + the mean commit after release + the mean hand-off (the hop could
             start -> its slot took it): a configuration's step from one hop to the next
          D  the set training time alone (``batches x seconds_per_batch``), the a-priori figure;
          its hop window against the measured one.

    python benchmarks/hyperband_blocks.py [--R 81] [--eta 3] [--shards 16] [--seconds-per-batch 0.05]
                                          [--batches 2] [--repeats 1] [--home DIR] [--keep]
    python benchmarks/hyperband_blocks.py --R 9 --shards 4          # a quick check, about a minute
    python benchmarks/hyperband_blocks.py --reanalyze DIR           # report again from a kept run

Exits 0 when every run succeeded, 1 when one failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import embedded_airflow, header, result, summary, write_dag  # noqa: E402
from benchmarks.sim_vs_airflow import FEATURES, write_data  # noqa: E402  (the same two-class data)
from mop_airflow.config import MopSpec  # noqa: E402
from mop_airflow.records import BlockDecision, HopRecord, Plan, RunRecord  # noqa: E402
from mop_airflow.records.layout import RunLayout  # noqa: E402
from mop_airflow.store import Store  # noqa: E402

MODEL = "mop_airflow.examples.timed_models:sleepy"
DAG_ID = "mop_hyperband_blocks"
BATCH_SIZE = 32
SAVED = "airflow_run.json"
GOAL_BOUND = 3.0      # the search's wall within 3x the bound
GOAL_ESTIMATE = 0.15  # the estimate within 15 % of the measured hop window


# -- setup ---------------------------------------------------------------------------------------

def make_spec(args: argparse.Namespace, train: str, validation: str, store_root: str) -> dict[str, Any]:
    return {
        "data": {"source": train, "validation": validation, "label": "label", "features": "x*", "classes": [0, 1]},
        "search": {
            "space": {"method": "random", "seed": args.seed, "params": {
                "model": [MODEL], "learning_rate": {"distribution": "log_uniform", "low": 1e-3, "high": 3e-2},
                "batch_size": [BATCH_SIZE],
                "hparams": {"seconds_per_batch": [args.seconds_per_batch],
                            "units": {"distribution": "choice", "values": [8, 16, 32]}},
            }},
            "metric": "val_accuracy",
            "adaptive": {"method": "hyperband", "R": args.R, "eta": args.eta},
        },
        "schedule": {"shards": args.shards, "slots_per_shard": 1, "epochs_per_hop": 1, "seed": args.seed},
        "store": {"root": store_root},
    }


def mem_available_gib() -> float | None:
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


class Sampler:
    """The 1-minute load average and the memory available every few seconds while the run goes on."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self.load: list[float] = []
        self.memory: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.load.append(os.getloadavg()[0])
            available = mem_available_gib()
            if available is not None:
                self.memory.append(available)
            self._stop.wait(self.every)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def wait_quietly(af: Any, layout: RunLayout, run_id: str, *, timeout: float, began: float) -> str:
    """Wait for the run, a line a minute: reads no hop records (25,000 of them every few seconds would
    take the cores the hops need), only the run's state and its block decisions."""
    deadline, last = time.time() + timeout, 0.0
    while time.time() < deadline:
        state = af.run_state(DAG_ID, run_id)
        if state in ("success", "failed"):
            return state
        dead = [name for name, ok in af.alive().items() if not ok]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited during the run; see {af.home / 'logs'}")
        if time.time() - last >= 60:
            last = time.time()
            decided = len(layout.store.glob(layout.block_decision_uri("*")))
            print(f"  [{time.time() - began:6.0f} s] {state}; block decisions written: {decided}; load average "
                  f"{fmt_load(os.getloadavg())}; memory available {mem_available_gib() or 0:.1f} GiB", flush=True)
        time.sleep(5)
    return "timed out"


def run_on_airflow(args: argparse.Namespace, home: Path, data: tuple[str, str], began: float) -> dict[str, Any]:
    """Run the search once on a fresh embedded Airflow; what the report needs, saved in ``home``."""
    from mop_airflow.deployment.local import EMBEDDED_PARALLELISM  # noqa: PLC0415

    store = Store("file://" + str(home / "store"))
    write_dag(home / "dags", DAG_ID, make_spec(args, *data, store.root))
    env = {"MOP_HOME": str(home / "mop"),
           # a block's train tasks (shards x 1 slot) run at once, beside a control task
           "AIRFLOW__CORE__PARALLELISM": os.environ.get("AIRFLOW__CORE__PARALLELISM",
                                                        str(max(EMBEDDED_PARALLELISM, args.shards + 1)))}
    load_at_start = os.getloadavg()
    with Sampler() as sampler, embedded_airflow(home, home / "dags", env=env, pools_for=DAG_ID) as af:
        run_id = af.trigger(DAG_ID)
        print(f"  triggered {DAG_ID} run {run_id} (parallelism {env['AIRFLOW__CORE__PARALLELISM']}; logs under "
              f"{af.home / 'logs'})", flush=True)
        state = wait_quietly(af, RunLayout(store, DAG_ID, run_id), run_id, timeout=args.timeout, began=began)
        load_at_end = os.getloadavg()
        runs = list(af.rest.paged(f"/dags/{DAG_ID}/dagRuns", "dag_runs"))
        tis = {run["dag_run_id"]: af.task_instances(DAG_ID, run["dag_run_id"]) for run in runs}
        if state != "success":
            failed = [ti["task_id"] for ti in tis.get(run_id, []) if ti["state"] == "failed"]
            print(f"  run {run_id} {state}; failed tasks: {failed}; logs under {af.home / 'logs'}", flush=True)
    saved = {"run_id": run_id, "state": state, "dag_runs": runs, "task_instances": tis,
             "load": {"start": load_at_start, "end": load_at_end, "samples": sampler.load},
             "memory_available_gib": sampler.memory}
    (home / SAVED).write_text(json.dumps(saved))
    return saved


# -- measurement ---------------------------------------------------------------------------------

def ts(value: str | None) -> float | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def block_of(task_id: str) -> int:
    """The block a task belongs to: ``block_<k>.`` prefixed, or the first block's (no prefix)."""
    head, _, _ = task_id.rpartition(".")
    return int(head.split("_")[1]) if head.startswith("block_") else 0


def analyze(home: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """The figures of one run, printed; None when it did not succeed."""
    from mop_airflow.planning.simulation import estimate_seconds, stand_in_blocks  # noqa: PLC0415
    from mop_airflow.planning.task_plan import build_task_plan  # noqa: PLC0415

    saved = json.loads((home / SAVED).read_text())
    if saved["state"] != "success":
        print(f"run {saved['run_id']} {saved['state']}: no figures (logs under {home / 'airflow' / 'logs'})")
        return None
    store = Store("file://" + str(home / "store"))
    run_id = saved["run_id"]
    layout = RunLayout(store, DAG_ID, run_id)
    plan_record = Plan.read(store, layout.plan_uri)
    run_record = RunRecord.read(store, layout.run_record_uri)
    spec = MopSpec.from_dict(run_record.spec)
    adaptive = spec.adaptive_plan()
    shards, slots = plan_record.shards, spec.schedule.slots_per_shard
    manifest = store.read_json(layout.manifest_pointer_uri)
    batches = sorted({-(-entry["rows"] // BATCH_SIZE) for entry in manifest["shards"]})
    spb = sorted({float(c["hparams"]["seconds_per_batch"]) for c in run_record.configs})
    hop_seconds = max(batches) * max(spb)

    all_tis = [ti for tis in saved["task_instances"].values() for ti in tis]
    tis = saved["task_instances"][run_id]
    decisions = sorted((BlockDecision.read(store, uri) for uri in store.glob(layout.block_decision_uri("*"))),
                       key=lambda d: d.block)
    blocks = [d for d in decisions if d.training and not d.finished]
    records = [HopRecord.read(store, uri) for uri in store.glob(layout.hops_glob)]
    failed = [r for r in records if r.status != "ok"]
    hops = [r for r in records if r.status == "ok"]

    # Each hop's block, from the decisions' spans of the search's hops; checked against its train task.
    spans = [(d.block, d.start, d.start + d.length(shards)) for d in blocks]

    def span_of(t: int) -> int:
        return next(k for k, start, end in spans if start <= t < end)

    by_block: dict[int, list[HopRecord]] = {}
    for r in hops:
        by_block.setdefault(span_of(r.t), []).append(r)
    misplaced = sum(block_of(r.task_id or "") != span_of(r.t) for r in hops)

    trains = {ti["task_id"]: ti for ti in tis
              if ti["task_id"].rsplit(".", 1)[-1].startswith("train_shard_") and ti["state"] == "success"}
    first_hop: dict[str, HopRecord] = {}
    for r in hops:
        if r.task_id not in first_hop or r.started_at < first_hop[r.task_id].started_at:
            first_hop[r.task_id] = r
    startup_all = {task: first_hop[task].started_at - ts(ti["start_date"]) for task, ti in trains.items()
                   if task in first_hop}
    # A task's start-up: only where its first hop was ready at once (its configuration's first hop of the
    # block); otherwise the task also waited for that configuration's hop on another shard.
    block_start = {d.block: d.start for d in blocks}
    startup = {task: v for task, v in startup_all.items()
               if first_hop[task].t == block_start[span_of(first_hop[task].t)]} or startup_all
    task_seconds = statistics.median(startup.values())
    slot_time = [r.released_at - r.started_at for r in hops]
    commit_after = [r.saved_at - r.released_at for r in hops]
    fixed = [r.released_at - r.started_at - r.timings.get("train", 0.0) for r in hops]
    handoff = hand_offs(hops, span_of)

    named = {ti["task_id"]: ti for ti in tis}
    rows = []
    for d in blocks:
        own = by_block.get(d.block, [])
        first, last = min(r.started_at for r in own), max(r.saved_at for r in own)
        row = {"block": d.block, "configurations": len(d.training), "hops": len(own),
               "slot time": statistics.median(r.released_at - r.started_at for r in own),
               "hand-off": statistics.median([handoff[id(r)] for r in own if id(r) in handoff] or [0.0]),
               "expected hops": len(d.training) * d.length(shards), "start": d.start, "length": d.length(shards),
               "first": first, "last": last, "wall": last - first, "ends": len(d.ends), "jobs": len(d.jobs),
               "train tasks": sum(block_of(t) == d.block for t in trains)}
        if rows:
            before = rows[-1]
            row["hand-over"] = first - before["last"]
            prefix = f"block_{d.block}."
            prev_trains = [ti for t, ti in trains.items() if block_of(t) == before["block"]]
            gate = named.get(f"{prefix}decide")
            deals = [ti for t, ti in named.items() if t.startswith(f"{prefix}deal_")]
            own_trains = [ti for t, ti in trains.items() if block_of(t) == d.block]
            marks = [("train tasks of the block before ended", max(ts(ti["end_date"]) for ti in prev_trains)),
                     ("decide started", ts(gate["start_date"]) if gate else None),
                     ("decide ended", ts(gate["end_date"]) if gate else None),
                     ("deal tasks ended", max(ts(ti["end_date"]) for ti in deals) if deals else None),
                     ("first train task started", min(ts(ti["start_date"]) for ti in own_trains)),
                     ("last train task started", max(ts(ti["start_date"]) for ti in own_trains)),
                     ("first hop taken", first)]
            row["hand-over parts"] = [(name, None if at is None else at - before["last"]) for name, at in marks]
        rows.append(row)

    first_task = min(ts(ti["start_date"]) for ti in all_tis if ti.get("start_date"))
    report = named.get("report")
    report_end = ts(report["end_date"]) if report and report.get("end_date") else None
    search_wall = (report_end or max(ts(ti["end_date"]) for ti in all_tis if ti.get("end_date"))) - first_task
    hop_first, hop_last = min(r.started_at for r in hops), max(r.saved_at for r in hops)
    hop_window = hop_last - hop_first
    run = next(r for r in saved["dag_runs"] if r["dag_run_id"] == run_id)
    dag_wall = ts(run["end_date"]) - ts(run["start_date"])
    bound = len(hops) * hop_seconds / (shards * slots)

    # The simulator on the same plan: the DAG's own task plan, Hyperband's stand-in blocks.
    task_plan = build_task_plan(shards, 0, adaptive, slots=slots)
    ids = [f"c{i:04d}" for i in range(adaptive.total_configurations)]
    stand_in = stand_in_blocks(adaptive, ids, shards=shards)
    starts = list(itertools.accumulate((length for length, _ in stand_in), initial=0))

    def estimate(seconds_per_hop: float, task: float) -> dict[str, Any]:
        sim = estimate_seconds(task_plan, adaptive.total_configurations, seconds_per_hop=seconds_per_hop,
                               slots=slots, adaptive=adaptive, task_seconds=task)
        window = max(e.end for e in sim.events) - min(e.start for e in sim.events)
        per_block = []
        for k, (length, _) in enumerate(stand_in):
            events = [e for e in sim.events if starts[k] <= e.t < starts[k] + length]
            per_block.append((min(e.start for e in events), max(e.end for e in events), len(events)))
        return {"window": window, "makespan": sim.makespan, "hops": len(sim.events), "per_block": per_block,
                "busy": sim.busy_fraction}

    median_slot, mean_slot = statistics.median(slot_time), statistics.mean(slot_time)
    step = mean_slot + statistics.mean(commit_after) + statistics.mean(handoff.values())
    est = estimate(median_slot, task_seconds)
    est_mean = estimate(mean_slot, task_seconds)
    est_step = estimate(step, task_seconds)
    est_set = estimate(hop_seconds, task_seconds)
    floor = estimate(hop_seconds, 0.0)  # the blocks one after another, a configuration's hops too: nothing else
    trouble = airflow_trouble(home)

    # -- report ----------------------------------------------------------------------------------
    load = saved["load"]
    print(f"\nrun {run_id}: {len(saved['dag_runs'])} DAG run(s) of {DAG_ID}, {len(all_tis)} task instances "
          f"({len(trains)} train tasks), {len(blocks)} blocks, {len(hops)} hops ({len(failed)} failed); "
          f"{len(run_record.configs)} configurations; batches per shard {batches}, seconds_per_batch {spb}")
    print(f"load average (1/5/15 min): at start {fmt_load(load['start'])}, at the end {fmt_load(load['end'])}; "
          f"1-min samples during the run: {summarize(load['samples'])}; memory available: "
          f"{summarize(saved.get('memory_available_gib', []), 'GiB')}")
    if misplaced:
        print(f"  !! {misplaced} hops trained by a train task of another block than their decision's span")
    if trouble:
        print(f"  !! the Airflow logs: {trouble}")
    print(f"\n{'block':>5} {'configs':>7} {'hops':>6} {'iterations':>11} {'ends':>5} {'wall':>8} {'hand-over':>10}"
          f" {'slot time':>10} {'hand-off':>9} {'sim A':>8} {'sim C':>8}")
    for k, row in enumerate(rows):
        sims = [f"{e['per_block'][k][1] - e['per_block'][k][0]:7.1f}s" if k < len(e["per_block"]) else ""
                for e in (est, est_step)]
        iters = f"{row['start'] / shards:g}-{(row['start'] + row['length']) / shards:g}"
        hand = f"{row['hand-over']:9.1f}s" if "hand-over" in row else ""
        print(f"{row['block']:>5} {row['configurations']:>7} {row['hops']:>6} {iters:>11} {row['ends']:>5} "
              f"{row['wall']:7.1f}s {hand:>10} {row['slot time']:9.3f}s {row['hand-off']:8.3f}s {sims[0]:>8} {sims[1]:>8}"
              + ("" if row["hops"] == row["expected hops"] else f"  (expected {row['expected hops']} hops)"))
    sim_hand = [e["per_block"][k][0] - e["per_block"][k - 1][1] for e in (est,) for k in range(1, len(e["per_block"]))]
    print("  wall: the block's first hop taken -> its last hop committed; hand-over: the block before's last commit "
          "-> this block's first hop taken; slot time, hand-off: medians over the block's hops (hand-off: the hop "
          "could start, its configuration's previous hop committed and its slot free -> taken); sim A, C: the "
          "block's hop window in the estimates below"
          + (f"; their hand-overs {min(sim_hand):.1f}-{max(sim_hand):.1f}s" if sim_hand else ""))
    for row in rows[1:]:
        parts = ", ".join(f"{name} +{at:.1f}s" for name, at in row["hand-over parts"] if at is not None)
        print(f"  hand-over to block {row['block']}: {parts}")
    print("\nper hop: slot time (taken -> released) " + describe(slot_time))
    print("         fixed cost (slot time - training) " + describe(fixed))
    print("         commit after release " + describe(commit_after))
    print("         hand-off (could start -> taken) " + describe(list(handoff.values())))
    print("per train task: start-up (its start -> its first hop taken, where that hop was ready at once) "
          + describe(list(startup.values())))
    print("                the same, every train task " + describe(list(startup_all.values())))
    print(f"\nsearch wall {search_wall:.1f}s (first task started -> report ended); DAG run {dag_wall:.1f}s; "
          f"hop window {hop_window:.1f}s (first hop taken -> last committed)")
    print(f"  before the first hop {hop_first - first_task:.1f}s (preflight, data, plan, stage tasks, the first train "
          f"tasks' start-up); after the last commit {search_wall - (hop_last - first_task):.1f}s (decide, report); "
          f"between blocks {sum(r.get('hand-over', 0.0) for r in rows):.1f}s; in blocks {sum(r['wall'] for r in rows):.1f}s")
    print(f"bound: {len(hops)} hops x {hop_seconds:g}s / {shards * slots} slots = {bound:.1f}s; search wall / bound "
          f"{search_wall / bound:.2f}x, hop window / bound {hop_window / bound:.2f}x (goal: within {GOAL_BOUND:g}x: "
          f"{'yes' if search_wall <= GOAL_BOUND * bound else 'no'})")
    print(f"  with the blocks: {floor['window']:.1f}s (the simulator, every hop {hop_seconds:g}s and nothing else: the "
          f"blocks one after another, each configuration's hops one after another); search wall / that "
          f"{search_wall / floor['window']:.2f}x")
    error = est["window"] / hop_window - 1
    print(f"estimate A (estimate_seconds, median slot time {median_slot:.3f}s a hop, {task_seconds:.2f}s a task): hop "
          f"window {est['window']:.1f}s ({est['hops']} hops), {error:+.1%} against the measured {hop_window:.1f}s "
          f"(goal: within {GOAL_ESTIMATE:.0%}: {'yes' if abs(error) <= GOAL_ESTIMATE else 'no'}); makespan "
          f"{est['makespan']:.1f}s; slots busy {est['busy']:.1%}")
    for name, e, what in (("B", est_mean, f"the mean slot time ({mean_slot:.3f}s)"),
                          ("C", est_step, f"the mean slot time + commit + hand-off ({step:.3f}s)"),
                          ("D", est_set, f"the set training time alone ({hop_seconds:g}s)")):
        print(f"  {name}: with {what}: {e['window']:.1f}s ({e['window'] / hop_window - 1:+.1%})")
    return {"DAG runs": len(saved["dag_runs"]), "task instances": len(all_tis), "blocks": len(blocks),
            "hops": len(hops), "search wall": search_wall, "hop window": hop_window, "bound": bound,
            "wall / bound": search_wall / bound, "window / bound": hop_window / bound,
            "wall / bound with the blocks": search_wall / floor["window"],
            "estimate": est["window"], "estimate / measured": est["window"] / hop_window,
            "estimate C / measured": est_step["window"] / hop_window,
            "hand-over (median)": statistics.median(r["hand-over"] for r in rows[1:]) if len(rows) > 1 else 0.0,
            "task start-up (median)": task_seconds, "slot time (median)": median_slot}


def hand_offs(hops: list[HopRecord], span_of: Any) -> dict[int, float]:
    """For each hop with something before it in its block: from when it could have started (its
    configuration's previous hop committed, its slot free) to when its slot took it (keyed by ``id``)."""
    by_key = {(r.config_id, r.t): r for r in hops}
    on_slot: dict[str | None, list[HopRecord]] = {}
    for r in sorted(hops, key=lambda r: r.started_at):
        on_slot.setdefault(r.task_id, []).append(r)
    out = {}
    for rs in on_slot.values():
        for k, r in enumerate(rs):
            before = []
            previous = by_key.get((r.config_id, r.t - 1))
            if previous is not None and span_of(previous.t) == span_of(r.t):
                before.append(previous.saved_at)
            if k:
                before.append(rs[k - 1].released_at)
            if before:
                out[id(r)] = r.started_at - max(before)
    return out


def airflow_trouble(home: Path) -> str:
    """Tasks Airflow rescheduled at their start (their DAG file failed to import), from its log."""
    log = home / "airflow" / "logs" / "scheduler.log"
    if not log.exists():
        return ""
    rescheduled, errors = 0, []
    with open(log, errors="replace") as lines:
        for line in lines:
            if "Rescheduling task during startup" in line:
                rescheduled += 1
            elif "Error loading DAG from" in line and len(errors) < 1:
                errors.append(line.split("Error loading DAG from", 1)[1].split(" [airflow", 1)[0].strip())
    if not rescheduled and not errors:
        return ""
    return (f"{rescheduled} task(s) rescheduled at their start"
            + (f" (the DAG file failed to import: {errors[0]})" if errors else ""))


def describe(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return (f"median {statistics.median(values):.3f}s, p90 {p90:.3f}s, min {values[0]:.3f}s, max {values[-1]:.3f}s "
            f"({len(values)})")


def summarize(samples: list[float], unit: str = "") -> str:
    if not samples:
        return "no samples"
    return (f"min {min(samples):.2f}{unit}, mean {statistics.mean(samples):.2f}{unit}, max {max(samples):.2f}{unit} "
            f"({len(samples)} samples)")


def fmt_load(values: Any) -> str:
    return "/".join(f"{v:.2f}" for v in values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--R", type=int, default=81, help="Hyperband's R: iterations of the longest rung")
    parser.add_argument("--eta", type=int, default=3)
    parser.add_argument("--shards", type=int, default=16, help="one-slot shards")
    parser.add_argument("--seconds-per-batch", type=float, default=0.05, help="every configuration's sleep a batch")
    parser.add_argument("--batches", type=int, default=2, help="batches of %d rows per shard" % BATCH_SIZE)
    parser.add_argument("--repeats", type=int, default=1, help="runs, each on a fresh Airflow")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a run may take")
    parser.add_argument("--home", default=None, help="working folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders (Airflow logs, store)")
    parser.add_argument("--reanalyze", metavar="DIR", nargs="+", help="report again from kept runs' folders")
    args = parser.parse_args()

    began = time.time()
    header("hyperband_blocks", f"R={args.R}, eta={args.eta} on {args.shards} shards x 1 slot")
    if args.reanalyze:
        results = [analyze(Path(folder).absolute(), args) for folder in args.reanalyze]
        return finish(results, began, None, [])
    print(f"Hyperband R={args.R}, eta={args.eta} on {args.shards} shards x 1 slot; {MODEL} with "
          f"{args.seconds_per_batch:g}s a batch, {args.batches} batches a shard: {args.batches * args.seconds_per_batch:g}s "
          f"of training a hop; {args.repeats} repeat(s)", flush=True)
    root = Path(args.home or tempfile.mkdtemp(prefix="mop-hyperband-blocks-")).absolute()
    made = [] if args.home else [root]
    root.mkdir(parents=True, exist_ok=True)
    data_folder = root / "data"
    made.append(data_folder)
    train_rows = args.shards * args.batches * BATCH_SIZE
    data = write_data(data_folder, train_rows=train_rows, validation_rows=1000, seed=args.seed)
    results = []
    homes = []
    for k in range(args.repeats):
        home = root / f"run-{k}"
        homes.append(home)
        made.append(home)
        print(f"\nrepeat {k + 1} of {args.repeats}: {train_rows} training rows on {args.shards} shards "
              f"(load average {fmt_load(os.getloadavg())})", flush=True)
        run_on_airflow(args, home, data, time.time())
        results.append(analyze(home, args))
    return finish(results, began, None if args.keep else made, homes)


def finish(results: list[dict[str, Any] | None], began: float, remove: list[Path] | None, homes: list[Path]) -> int:
    good = [r for r in results if r]
    if len(good) > 1:
        print(f"\nover {len(good)} runs: median (min-max)")
        for key in good[0]:
            values = [r[key] for r in good]
            print(f"  {key:<24} {statistics.median(values):10.3f} ({min(values):.3f}-{max(values):.3f})")
    if good:
        result("hyperband_blocks", {"runs": len(good), **{key: summary([r[key] for r in good]) for key in good[0]}})
    print(f"\nload average at the end {fmt_load(os.getloadavg())}; benchmark took {time.time() - began:.0f}s; "
          + ("working folders removed" if remove is not None else
             "working folders kept" + (f": {', '.join(str(h) for h in homes)}" if homes else "")))
    for path in remove or []:
        shutil.rmtree(path, ignore_errors=True)
    return 0 if len(good) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
