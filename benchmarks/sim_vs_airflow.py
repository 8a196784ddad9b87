"""Does a real Airflow run take as long as the simulator predicts? Runs one and compares.

Workload: configurations of ``mop_airflow.examples.timed_models:sleepy``, whose training step
sleeps ``seconds_per_batch`` per batch; every shard has exactly ``--batches`` batches, so a hop's
controlled training time is ``batches * seconds_per_batch``, spread evenly from ``--min-hop`` to
``--max-hop`` seconds over the configurations. Hops sleep rather than compute, so four shards
run side by side on two cores without competing for CPU. The DAG (``--shards`` shards,
``--slots`` slots each, ``--iterations`` iterations) runs on a real embedded Airflow (SQLite,
LocalExecutor). A block is one train task per shard slot (``train_shard_<s>``, or
``train_shard_<s>_slot_<k>``) that trains every hop of the block falling on its slot in one warm
process (:mod:`mop_airflow.slots.driver`), so a hop is not a task instance: each hop's place
and time come from its hop record, the train tasks' from the task instances.

measured   per hop: ``started_at`` (its slot's process took it) -> ``released_at`` (the slot free for
           its next hop; the commit, ``saved_at``, may end later on a writer thread); makespan = the
           first hop taken -> the last hop committed (the hop window); busy fraction = the hops' slot
           time / (makespan * shards * slots).
task start-up per train task = its first hop taken - the task instance's start_date: the task
           process's start and the shard loop's set-up, paid once per slot per block.
fixed cost per hop = slot time - ``timings["train"]``: building (or reusing) the model, loading the
           checkpoint, evaluating, serializing, and whatever set-up the process had not done yet.
training overhead per hop = ``timings["train"]`` - controlled training time: Keras tracing the
           train step (once per compiled model in a process) and the steps' own compute, CPU work.
hand-off   per hop, ``started_at`` - the moment it could have started: its configuration's previous
           hop committed (``saved_at``), and its slot free (the slot's previous hop released). A
           slot's first hop with nothing before it has none. It is the slot's polling of the store
           and the commit of the previous hop, not Airflow's scheduler any more.
predicted  :func:`~mop_airflow.planning.simulation.simulate` on the same task plan with the run's own
           offset classes (plan.json), one unit per configuration in the block's order, on the slots
           the train tasks put them on (:func:`~mop_airflow.planning.placement.block_hops` with the
           run's :func:`~mop_airflow.planning.placement.slot_rules`: by model key, fused groups whole),
           each train task paying ``task_seconds`` once:
           A  hop seconds = controlled training time + median fixed cost per hop, task_seconds =
              median task start-up
           B  A with the median training overhead added to every hop
           C  B with the median hand-off added to every hop
           D  C with means instead of medians (a makespan sums durations; they are skewed)
replay     E  the simulator fed each hop's measured slot time (task_seconds 0): isolates the
              scheduling semantics (which hop a slot takes next) from the duration model
           F  E with the median hand-off added to every hop
bound      :func:`~mop_airflow.planning.simulation.lower_bound` and efficiency = bound / makespan.
order      hops at the same position of their shard slot's sequence (its train task), real against
           simulated: a hop on another slot than simulated never counts.

    python benchmarks/sim_vs_airflow.py [--shards 4] [--iterations 2] [--configs 8] [--batches 20]
                                        [--min-hop 1] [--max-hop 8] [--home DIR] [--keep]
                                        [--reanalyze DIR] [--project-shards N]

Exits 0 when the Airflow run succeeded, whatever the error; 1 when the run failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import embedded_airflow, machine, result, write_dag  # noqa: E402
from benchmarks.memory_watch import MemoryWatch  # noqa: E402
from mop_airflow.records.layout import RunLayout  # noqa: E402
from mop_airflow.records import HopRecord, Plan, RunRecord  # noqa: E402
from mop_airflow.config import MopSpec  # noqa: E402
from mop_airflow.store import Store  # noqa: E402
from mop_airflow.planning.task_plan import spec_task_plan  # noqa: E402

from mop_airflow.planning.placement import slot_rules  # noqa: E402
from mop_airflow.planning.simulation import Simulation, lower_bound, simulate  # noqa: E402

MODEL = "mop_airflow.examples.timed_models:sleepy"
DAG_ID = "mop_sim_vs_airflow"
BATCH_SIZE = 32
FEATURES = 8
TOLERANCE = 0.10


# -- setup ---------------------------------------------------------------------------------------

def write_data(folder: Path, *, train_rows: int, validation_rows: int, seed: int) -> tuple[str, str]:
    """A two-class problem (sklearn make_classification) as train and validation Parquet files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=train_rows + validation_rows, n_features=FEATURES, n_informative=5,
                               n_redundant=1, n_classes=2, random_state=seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in (("train", slice(0, train_rows)), ("validation", slice(train_rows, None))):
        columns = {f"x{i}": x[rows, i].astype(np.float32) for i in range(FEATURES)}
        columns["label"] = y[rows].astype(np.int64)
        path = folder / f"{name}.parquet"
        pq.write_table(pa.table(columns), path)
        paths.append(str(path))
    return paths[0], paths[1]


def seconds_per_batch_grid(configs: int, batches: int, min_hop: float, max_hop: float) -> list[float]:
    """``configs`` values whose hops take ``min_hop`` .. ``max_hop`` seconds, evenly spread."""
    if configs == 1:
        return [round(min_hop / batches, 6)]
    return [round((min_hop + (max_hop - min_hop) * k / (configs - 1)) / batches, 6) for k in range(configs)]


def make_spec(args: argparse.Namespace, train: str, validation: str, store_root: str) -> dict[str, Any]:
    return {
        "data": {"source": train, "validation": validation, "label": "label", "features": "x*", "classes": [0, 1]},
        "search": {
            "space": {"method": "grid", "params": {
                "model": MODEL, "optimizer": "adam", "learning_rate": 0.01, "batch_size": BATCH_SIZE,
                "metrics": ["accuracy"],
                "hparams": {"seconds_per_batch": seconds_per_batch_grid(args.configs, args.batches, args.min_hop,
                                                                        args.max_hop)},
            }},
            "metric": "val_accuracy",
        },
        "schedule": {"shards": args.shards, "iterations": args.iterations, "slots_per_shard": args.slots,
                     "epochs_per_hop": 1, "seed": args.seed},
        "store": {"root": store_root},
    }


def summarize_load(samples: list[float]) -> str:
    if not samples:
        return "no samples"
    return (f"min {min(samples):.2f}, mean {statistics.mean(samples):.2f}, max {max(samples):.2f} "
            f"({len(samples)} samples)")


class LoadSampler:
    """The 1-minute load average every few seconds while the run goes on."""

    def __init__(self, every: float = 5.0) -> None:
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


# -- measurement ---------------------------------------------------------------------------------

def ts(value: str | None) -> float | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def describe(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return f"median {statistics.median(values):6.2f}s  p90 {p90:6.2f}s  min {values[0]:6.2f}s  max {values[-1]:6.2f}s"


def hand_offs(hops: dict[tuple[str, int], dict[str, Any]]) -> dict[tuple[str, int], float]:
    """For each hop with something before it: from when it could have started (its configuration's
    previous hop committed, its slot free) to when its slot took it."""
    out = {}
    on_slot: dict[str, list[tuple[str, int]]] = {}
    for key, hop in sorted(hops.items(), key=lambda item: item[1]["start"]):
        on_slot.setdefault(hop["slot"], []).append(key)
    for keys in on_slot.values():
        for k, (cid, t) in enumerate(keys):
            hop = hops[(cid, t)]
            before = [hops[(cid, t - 1)]["saved"]] if (cid, t - 1) in hops else []
            before += [hops[keys[k - 1]]["end"]] if k else []
            if before:
                out[(cid, t)] = hop["start"] - max(before)
    return out


def window(sim: Simulation) -> float:
    return max(e.end for e in sim.events) - min(e.start for e in sim.events)


def busy(sim: Simulation, *, not_work: float = 0.0) -> float:
    """Busy fraction of the slots over the hop window; ``not_work`` seconds of each hop are latency."""
    work = sum(e.end - e.start - not_work for e in sim.events)
    return work / (window(sim) * sim.shards * sim.slots)


SAVED = "airflow_run.json"


def run_on_airflow(args: argparse.Namespace, home: Path, began: float) -> dict[str, Any]:
    """Write the data and the DAG file, run the DAG on an embedded Airflow; what the comparison needs."""
    from mop_airflow.deployment.local import EMBEDDED_PARALLELISM  # noqa: PLC0415
    from mop_airflow.cli.demo import run_and_watch  # noqa: PLC0415

    load_at_start = os.getloadavg()
    train_rows = args.shards * args.batches * BATCH_SIZE
    train, validation = write_data(home / "data", train_rows=train_rows, validation_rows=1000, seed=args.seed)
    store = Store("file://" + str(home / "store"))
    write_dag(home / "dags", DAG_ID, make_spec(args, train, validation, store.root))
    # A block's train tasks (shards x slots) run at once, beside a control task: the LocalExecutor
    # must run that many task processes (preflight refuses a run it cannot hold).
    env = {"AIRFLOW__CORE__PARALLELISM": os.environ.get("AIRFLOW__CORE__PARALLELISM",
                                                        str(max(EMBEDDED_PARALLELISM, args.shards * args.slots + 1)))}
    with LoadSampler() as load, embedded_airflow(home, home / "dags", env=env, quiet=False) as af:
        af.wait_for_dag(DAG_ID)
        load_at_trigger = os.getloadavg()
        # what the deployment holds while the run trains: its processes' PSS (the train tasks fork from
        # a scheduler that preloaded the backend, so RSS would count shared pages once per slot)
        with MemoryWatch([p.pid for p in af.processes.values()]) as watch:
            run_id, state, _ = run_and_watch(af, DAG_ID, timeout=args.timeout, started=began)
        load_at_end = os.getloadavg()
        tis = af.task_instances(DAG_ID, run_id)
        run = af.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
    memory = {"idle_tree_pss": watch.idle_tree_pss, "peak_tree_pss": watch.peak_tree_pss,
              "peak_machine": watch.peak_machine, "peak_process_rss": watch.peak_process_rss,
              "processes_at_peak": len(watch.at_peak)}
    return {"run_id": run_id, "state": state, "task_instances": tis, "dag_run": run, "train_rows": train_rows,
            "load": {"start": load_at_start, "trigger": load_at_trigger, "end": load_at_end,
                     "samples": load.samples}, "memory": memory}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--slots", type=int, default=1, help="slots per shard pool")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--configs", type=int, default=8)
    parser.add_argument("--batches", type=int, default=20, help="batches of %d rows per shard" % BATCH_SIZE)
    parser.add_argument("--min-hop", type=float, default=1.0, help="controlled training seconds of the fastest hop")
    parser.add_argument("--max-hop", type=float, default=8.0, help="controlled training seconds of the slowest hop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the DAG run may take")
    parser.add_argument("--home", default=None, help="working folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (Airflow logs, store)")
    parser.add_argument("--reanalyze", metavar="DIR", help="compare again from a kept working folder, no new run")
    parser.add_argument("--project-shards", type=int, default=0, metavar="N",
                        help="also simulate N shards (same slots, rows per shard and configurations) with the "
                             "costs this run measured, and scale its memory per slot: a size past this machine")
    parser.add_argument("--project-configs", type=int, default=0, metavar="M",
                        help="with --project-shards: M configurations, the measured ones' hop costs in turn")
    args = parser.parse_args()

    began = time.time()
    if args.reanalyze:  # a kept working folder: compare again without running Airflow
        home = Path(args.reanalyze).absolute()
        saved = json.loads((home / SAVED).read_text())
    else:
        home = Path(args.home or tempfile.mkdtemp(prefix="mop-sim-vs-airflow-")).absolute()
        saved = run_on_airflow(args, home, began)
        (home / SAVED).write_text(json.dumps(saved))
    if saved["state"] != "success":
        print(f"run {saved['run_id']} {saved['state']}: no comparison (logs under {home / 'airflow' / 'logs'})")
        return 1
    store = Store("file://" + str(home / "store"))
    run_id, tis, run = saved["run_id"], saved["task_instances"], saved["dag_run"]
    load_at_start, load_at_trigger, load_at_end = (saved["load"][k] for k in ("start", "trigger", "end"))
    train_rows = saved["train_rows"]

    layout = RunLayout(store, DAG_ID, run_id)
    plan_record = Plan.read(store, layout.plan_uri)
    run_record = RunRecord.read(store, layout.run_record_uri)
    manifest = store.read_json(layout.manifest_pointer_uri)
    p, slots, iterations = plan_record.shards, run_record.schedule.slots_per_shard, plan_record.iterations
    hops_per_config = iterations * p
    spb = {c["config_id"]: float(c["hparams"]["seconds_per_batch"]) for c in run_record.configs}
    batches = [math.ceil(entry["rows"] / BATCH_SIZE) for entry in manifest["shards"]]

    def controlled(cid: str, t: int, shard: int) -> float:
        return batches[shard] * spb[cid]

    # A block is one train task per shard slot: a hop is a hop record, trained in its slot's warm process.
    records = [r for r in (HopRecord.read(store, u) for u in store.glob(layout.hops_glob)) if r.status == "ok"]
    hops: dict[tuple[str, int], dict[str, Any]] = {
        (r.config_id, r.t): {"start": r.started_at, "end": r.released_at, "saved": r.saved_at, "shard": r.shard,
                             "slot": r.task_id, "train": r.timings["train"],
                             "controlled": controlled(r.config_id, r.t, r.shard)} for r in records}
    for hop in hops.values():
        hop["duration"] = hop["end"] - hop["start"]
    trains = {ti["task_id"]: ti for ti in tis
              if ti["task_id"].rsplit(".", 1)[-1].startswith("train_shard_") and ti["state"] == "success"}
    stage_tis = [ti for ti in tis if ti["task_id"].rsplit(".", 1)[-1].startswith("stage_shard_")]
    stages_end = max(ts(ti["end_date"]) for ti in stage_tis)
    startup = {task: min(h["start"] for h in hops.values() if h["slot"] == task) - ts(ti["start_date"])
               for task, ti in trains.items() if any(h["slot"] == task for h in hops.values())}
    after = {task: ts(ti["end_date"]) - max(h["saved"] for h in hops.values() if h["slot"] == task)
             for task, ti in trains.items() if any(h["slot"] == task for h in hops.values())}

    first = min(h["start"] for h in hops.values())
    last_saved, last_released = max(h["saved"] for h in hops.values()), max(h["end"] for h in hops.values())
    measured = last_saved - first
    measured_work = sum(h["duration"] for h in hops.values())
    measured_busy = measured_work / (measured * p * slots)
    fixed_each = [h["duration"] - h["train"] for h in hops.values()]
    overhead_each = [h["train"] - h["controlled"] for h in hops.values()]
    fixed, overhead = statistics.median(fixed_each), statistics.median(overhead_each)
    handoff = hand_offs(hops)
    latency = statistics.median(handoff.values())
    task_startup = statistics.median(startup.values())

    plan = spec_task_plan(MopSpec.from_dict(run_record.spec), plan_record.priority)  # the DAG's own plan
    # The shard loop's units are configurations, in the block's order: class by class, in the plan's lineup.
    per_class = plan_record.class_lineup()

    def sim(seconds: Callable[[str, int, int], float], task_seconds: float) -> Simulation:
        return simulate(plan, per_class, seconds, slots=slots, task_seconds=task_seconds, **slot_rules(run_record))

    def predicted(each: float) -> Callable[[str, int, int], float]:
        return lambda cid, t, shard: controlled(cid, t, shard) + each

    def replay(extra: float) -> Simulation:
        return sim(lambda cid, t, shard: hops[(cid, t)]["duration"] + extra, 0.0)

    # The same inputs as means: a makespan sums durations along chains, and these are right-skewed.
    fixed_mean, overhead_mean = statistics.mean(fixed_each), statistics.mean(overhead_each)
    latency_mean, startup_mean = statistics.mean(handoff.values()), statistics.mean(startup.values())
    variants = [
        # (name, simulation, seconds of each hop that are hand-off latency, not work)
        ("A predicted: controlled training, fixed cost", sim(predicted(fixed), task_startup), 0.0),
        ("B   A + training overhead", sim(predicted(fixed + overhead), task_startup), 0.0),
        ("C   B + hand-off", sim(predicted(fixed + overhead + latency), task_startup), latency),
        ("D   C with means instead of medians",
         sim(predicted(fixed_mean + overhead_mean + latency_mean), startup_mean), latency_mean),
        ("E replay: measured hop slot times", replay(0.0), 0.0),
        ("F   E + hand-off", replay(latency), latency),
    ]

    mean_controlled = {c: statistics.mean(batches[s] * spb[c] for s in range(p)) for c in spb}
    bound_training = lower_bound(mean_controlled, {c: hops_per_config for c in spb}, shards=p, slots=slots)

    # -- report ----------------------------------------------------------------------------------
    print()
    print(f"date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}"
          + (f" (re-analysis of a run that started {dt.datetime.fromtimestamp(ts(run['start_date']), dt.timezone.utc).isoformat(timespec='seconds')})"
             if args.reanalyze else ""))
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min): at start {fmt_load(load_at_start)}; at trigger {fmt_load(load_at_trigger)}; "
          f"at the end of the run {fmt_load(load_at_end)}; 1-min samples during the benchmark: "
          f"{summarize_load(saved['load']['samples'])}")
    print(f"inputs: {len(spb)} configurations of {MODEL}, {p} shards x {slots} slot(s), {iterations} iterations "
          f"({hops_per_config} hops per configuration, {len(hops)} hops); batch size {BATCH_SIZE}, "
          f"{train_rows} training rows x {FEATURES} features, batches per shard {batches}; priority rule "
          f"{plan_record.priority!r}")
    print(f"{len(trains)} train task instances (one per shard slot) for {len(hops)} model hops")
    print(f"\n{'config':<10} {'class':>5} {'controlled/hop':>15} {'measured train':>15} {'slot time':>10}"
          "   (medians over the configuration's hops)")
    for o, ids in enumerate(per_class):
        for cid in ids:
            own = [h for (k, _), h in hops.items() if k == cid]
            print(f"{cid:<10} {o:>5} {statistics.median(h['controlled'] for h in own):>14.2f}s "
                  f"{statistics.median(h['train'] for h in own):>14.2f}s "
                  f"{statistics.median(h['duration'] for h in own):>9.2f}s")
    print("\nper hop (its record: taken -> slot released):")
    print(f"  slot time             {describe([h['duration'] for h in hops.values()])}")
    print(f"  fixed cost per hop    {describe(fixed_each)}   (slot time - timings['train'])")
    print(f"  training overhead     {describe(overhead_each)}   (timings['train'] - batches x seconds_per_batch)")
    print(f"  hand-off to taken     {describe(list(handoff.values()))}   (previous hop committed and slot free "
          f"-> taken; {len(handoff)} hops)")
    print(f"  commit after release  {describe([h['saved'] - h['end'] for h in hops.values()])}   "
          "(released_at -> saved_at)")
    print("per train task instance:")
    print(f"  start-up              {describe(list(startup.values()))}   (task start_date -> its first hop taken)")
    print(f"  after its last commit {describe(list(after.values()))}   (its last hop committed -> task end_date)")
    train_starts = sorted(ts(ti["start_date"]) - stages_end for ti in trains.values())
    print(f"  start: the stage tasks were done {first - stages_end:.2f}s before the first hop was taken; the train "
          f"tasks started {', '.join(f'{v:.2f}' for v in train_starts)}s after them")
    memory = saved.get("memory")  # a working folder kept before memory was sampled has none
    if memory:
        gib = 2 ** 30
        # a task process's title does not name its task on the LocalExecutor: a slot's share is what the
        # deployment grew by while the block's train tasks ran, over the slots (with their supervisors)
        per_slot = (memory["peak_tree_pss"] - memory["idle_tree_pss"]) / (p * slots)
        print(f"memory (PSS, sampled while the run trained): the deployment {memory['idle_tree_pss'] / gib:.2f} GiB "
              f"before the trigger, {memory['peak_tree_pss'] / gib:.2f} GiB at its peak, {per_slot / gib:.2f} GiB a "
              f"shard slot; the machine +{memory['peak_machine'] / gib:.2f} GiB; largest process RSS "
              f"{memory['peak_process_rss'] / gib:.2f} GiB; {memory['processes_at_peak']} process(es) over 200 MB "
              "RSS at the peak")
    dag_wall = ts(run["end_date"]) - ts(run["start_date"])
    print(f"DAG run wall time {dag_wall:.1f}s (trigger to success); hop window {measured:.1f}s (first hop taken to "
          f"last committed; to the last released {last_released - first:.1f}s)")
    print(f"\nmodel inputs, median (mean): task start-up {task_startup:.2f}s ({startup_mean:.2f}s), fixed cost per "
          f"hop {fixed:.2f}s ({fixed_mean:.2f}s), training overhead per hop {overhead:.2f}s ({overhead_mean:.2f}s), "
          f"hand-off {latency:.2f}s ({latency_mean:.2f}s)")
    print(f"\n{'':<46} {'makespan':>9} {'error':>8} {'within 10 %':>12} {'busy':>7} {'same order':>11}")
    print(f"{'measured (real Airflow)':<46} {measured:>8.1f}s {'':>8} {'':>12} {measured_busy:>7.1%}")
    for name, simulation, not_work in variants:
        predicted = window(simulation)
        error = (predicted - measured) / measured
        print(f"{name:<46} {predicted:>8.1f}s {error:>+8.1%} {'yes' if abs(error) <= TOLERANCE else 'no':>12} "
              f"{busy(simulation, not_work=not_work):>7.1%} {same_order(hops, simulation):>5}/{len(hops)}")
    print(f"  busy: hops' slot time / (hop window x {p * slots} slots); error: (predicted - measured) / measured; "
          "same order: hops at the same position of their shard slot's sequence (its train task) as in the real run")
    per_shard = {shard: sum(h["duration"] for h in hops.values() if h["shard"] == shard) / (measured * slots)
                 for shard in range(p)}
    print("measured busy fraction per shard: " + ", ".join(f"shard {k} {v:.1%}" for k, v in per_shard.items()))
    main_prediction = window(variants[0][1])
    print(f"\npure-training bound (controlled training only, every slot busy): {bound_training:.1f}s; "
          f"measured efficiency {bound_training / measured:.1%} (hop window {measured:.1f}s)")
    error = (main_prediction - measured) / measured
    replay_error = (window(variants[4][1]) - measured) / measured
    print(f"\npredicted (A) {main_prediction:.1f}s vs measured {measured:.1f}s: error {error:+.1%}; "
          f"within 10 %: {'yes' if abs(error) <= TOLERANCE else 'no'}")
    print(f"replay (E, measured durations) {window(variants[4][1]):.1f}s: error {replay_error:+.1%}; "
          f"within 10 %: {'yes' if abs(replay_error) <= TOLERANCE else 'no'}")
    if args.project_shards:
        measured_ids = sorted(spb)
        cost = {f"p{k:05d}": statistics.mean(batches) * spb[measured_ids[k % len(measured_ids)]] + fixed + overhead + latency
                for k in range(args.project_configs or len(measured_ids))}
        project(args.project_shards, run_record.spec, plan_record.priority, list(cost), slots=slots, hop=cost.__getitem__,
                task_seconds=task_startup, per_slot=(memory["peak_tree_pss"] - memory["idle_tree_pss"]) / (p * slots)
                if memory else None, hops_per_config=iterations)
    result("sim_vs_airflow", {
        "shape": {"configs": len(spb), "shards": p, "slots": slots, "iterations": iterations, "hops": len(hops)},
        "dag_run_seconds": round(dag_wall, 1), "hop_window": round(measured, 1), "slots_busy": round(measured_busy, 4),
        "bound": round(bound_training, 1), "predicted": {name.split()[0]: round(window(sim_), 1)
                                                          for name, sim_, _ in variants},
        "task_startup": task_startup, "fixed": fixed, "overhead": overhead, "hand_off": latency})
    keep = args.keep or args.home or args.reanalyze
    print(f"benchmark took {time.time() - began:.0f}s; working folder {'kept' if keep else 'removed'}")
    if not keep:
        shutil.rmtree(home, ignore_errors=True)
    return 0


def project(shards: int, spec: Mapping[str, Any], priority: str, config_ids: list[str], *, slots: int,
            hop: Callable[[str], float], task_seconds: float, per_slot: float | None, hops_per_config: int) -> None:
    """Simulate the same search on ``shards`` shards (its iterations, slots and configurations; every shard
    as large as the measured ones) with the measured costs of variant C, and scale the memory a slot took."""
    from mop_airflow.planning.schedule import deal_classes  # noqa: PLC0415

    spec = json.loads(json.dumps(spec))
    spec["schedule"]["shards"] = shards
    plan = spec_task_plan(MopSpec.from_dict(spec), priority)
    classes = deal_classes(config_ids, shards=shards, seed=spec["schedule"].get("seed", 0))
    started = time.time()
    simulation = simulate(plan, classes, lambda cid, t, shard: hop(cid), slots=slots, task_seconds=task_seconds)
    hops = len(config_ids) * hops_per_config * shards
    bound = lower_bound({c: hop(c) for c in config_ids}, {c: hops_per_config * shards for c in config_ids},
                        shards=shards, slots=slots)
    print(f"\nprojected to {shards} shards x {slots} slot(s) (simulated in {time.time() - started:.1f}s, variant C's "
          f"costs: each hop its controlled training + fixed cost + overhead + hand-off; task start-up "
          f"{task_seconds:.2f}s): {len(config_ids)} configurations, {hops} hops, {shards * slots} train tasks at once")
    print(f"  makespan {window(simulation):.1f}s, slots busy {busy(simulation):.1%}, bound with those costs "
          f"{bound:.1f}s (every slot busy)")
    if per_slot is not None:
        gib = 2 ** 30
        print(f"  memory: {shards * slots} shard slots x {per_slot / gib:.2f} GiB = {shards * slots * per_slot / gib:.1f} "
              f"GiB of task processes across the workers; Airflow's [core] parallelism at least {shards * slots + 1}")


def same_order(hops: Mapping[tuple[str, int], Mapping[str, Any]], simulation: Simulation) -> int:
    """How many hops hold the same position in their train task's sequence (the shard slot that
    trained them), real run vs simulation: a hop on another slot than simulated is never in place."""
    real: dict[str, list[tuple[str, int]]] = {}
    for key, hop in sorted(hops.items(), key=lambda item: item[1]["start"]):
        real.setdefault(hop["slot"].rsplit(".", 1)[-1], []).append(key)
    simulated: dict[str, list[tuple[str, int]]] = {}
    for event in sorted(simulation.events, key=lambda e: e.start):
        simulated.setdefault(event.task_id.rsplit(".", 1)[-1], []).append((event.config_id, event.t))
    return sum(a == b for slot in real for a, b in zip(real[slot], simulated.get(slot, [])))


def fmt_load(values: tuple[float, float, float]) -> str:
    return "/".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
