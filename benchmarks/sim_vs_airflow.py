"""Does a real Airflow run take as long as the simulator predicts? Runs one and compares.

Workload: configurations of ``mop_airflow.examples.timed_models:sleepy``, whose training step
sleeps ``seconds_per_batch`` per batch; every shard has exactly ``--batches`` batches, so a hop's
controlled training time is ``batches * seconds_per_batch``, spread evenly from ``--min-hop`` to
``--max-hop`` seconds over the configurations. Hops sleep rather than compute, so four shards
run side by side on two cores without competing for CPU. The DAG (``--shards`` shards,
``--slots`` slots each, ``--iterations`` iterations) runs on a real embedded Airflow (SQLite,
LocalExecutor); then, from the task instances and the hop records:

measured   makespan = first hop task start -> last hop task end (the hop window); each hop's
           duration (task start_date -> end_date); busy fraction = hop task time in the shard
           pools / (makespan * shards * slots).
fixed cost per hop = task duration - hop record ``timings["train"]``: task process start, shard
           read, model build, checkpoint load, evaluation, save and the task's finish.
training overhead per hop = ``timings["train"]`` - controlled training time: Keras tracing the
           train step of the hop's fresh model and the steps' own compute (~0.7 CPU-seconds per
           hop), which is CPU work: hops starting together on few cores stretch it.
hand-off   per hop, start_date - the moment it could have started (its previous hop ended, or the
           last stage task for a first hop, and its pool had a free slot): the scheduler loop
           (it sleeps up to ``[scheduler] scheduler_idle_sleep_time``, 1 s by default, between
           idle loops), the executor and the task process start. Split at queued_when.
predicted  :func:`~mop_airflow.planning.simulation.simulate` on the same task plan with the run's own
           offset classes (plan.json), makespan and busy fraction over the hop window:
           A  hop seconds = controlled training time, task_seconds = median fixed cost
           B  A with the median training overhead added to every hop
           C  B with the median hand-off latency added to task_seconds: an explicit
              scheduler-latency model (a hop holds its slot from the moment it could start)
           D  C with means instead of medians (a makespan sums durations; they are skewed)
replay     E  the simulator fed each hop's measured task duration (task_seconds 0): isolates the
              scheduling semantics from the duration model
           F  E with the median hand-off latency as task_seconds
bound      :func:`~mop_airflow.planning.simulation.lower_bound` and efficiency = bound / makespan.

    python benchmarks/sim_vs_airflow.py [--shards 4] [--iterations 2] [--configs 8] [--batches 20]
                                        [--min-hop 1] [--max-hop 8] [--home DIR] [--keep]
                                        [--reanalyze DIR]

Exits 0 when the Airflow run succeeded, whatever the error; 1 when the run failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script from a checkout: make the package importable
    sys.path.insert(0, str(REPO))

from mop_airflow.records.layout import RunLayout  # noqa: E402
from mop_airflow.records import HopRecord, Plan, RunRecord  # noqa: E402
from mop_airflow.config import MopSpec  # noqa: E402
from mop_airflow.store import Store  # noqa: E402
from mop_airflow.planning.task_plan import spec_task_plan  # noqa: E402

from mop_airflow.planning.simulation import Simulation, lower_bound, simulate, simulate_bundles  # noqa: E402

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


def write_dag_file(folder: Path, dag_id: str, spec: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dag_id}.py"
    path.write_text("import json\nfrom mop_airflow import build_mop_dag\n"
                    f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={dag_id!r})\n")
    return path


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


def hand_offs(hops: dict[tuple[str, int], dict[str, Any]], pool_spans: dict[str, list[tuple[float, float]]],
              stages_end: float, slots: int) -> dict[tuple[str, int], dict[str, float]]:
    """For each hop: when it could have started (its previous hop done, a slot of its pool free),
    and how long from then to queued and to started."""
    out = {}
    for (cid, t), hop in hops.items():
        upstream_end = hops[(cid, t - 1)]["end"] if (cid, t - 1) in hops else stages_end
        earlier = sorted((end for start, end in pool_spans[hop["pool"]] if start < hop["start"]), reverse=True)
        slot_free = earlier[slots - 1] if len(earlier) >= slots else -math.inf
        ready = max(upstream_end, slot_free)
        out[(cid, t)] = {"ready": ready, "to_queued": hop["queued"] - ready, "to_start": hop["start"] - ready,
                         "queued_to_start": hop["start"] - hop["queued"]}
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
    from mop_airflow.airflow.local import LocalAirflow  # noqa: PLC0415
    from mop_airflow.cli.demo import run_and_watch  # noqa: PLC0415

    load_at_start = os.getloadavg()
    train_rows = args.shards * args.batches * BATCH_SIZE
    train, validation = write_data(home / "data", train_rows=train_rows, validation_rows=1000, seed=args.seed)
    store = Store("file://" + str(home / "store"))
    write_dag_file(home / "dags", DAG_ID, make_spec(args, train, validation, store.root))
    with LoadSampler() as load, LocalAirflow(home / "airflow", home / "dags",
                                             extra_env={"MOP_AIRFLOW_HOME": str(home)}) as af:
        af.wait_for_dag(DAG_ID)
        load_at_trigger = os.getloadavg()
        run_id, state, _ = run_and_watch(af, DAG_ID, timeout=args.timeout, started=began)
        load_at_end = os.getloadavg()
        tis = af.task_instances(DAG_ID, run_id)
        run = af.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}")
    return {"run_id": run_id, "state": state, "task_instances": tis, "dag_run": run, "train_rows": train_rows,
            "load": {"start": load_at_start, "trigger": load_at_trigger, "end": load_at_end,
                     "samples": load.samples}}


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

    # The unit of Airflow work is a bundle's hop (one task instance training each of its configurations).
    records = [HopRecord.read(store, u) for u in store.glob(layout.hops_glob)]
    by_ti = {(ti["task_id"], ti["map_index"]): ti for ti in tis}
    bundles = plan_record.class_bundles()
    members_of = {f"b{k}": b for k, b in enumerate(b for per in bundles for b in per)}
    hops: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        ti = by_ti[(r.task_id, r.map_index)]
        unit = hops.setdefault((f"b{r.bundle}", r.t), {
            "start": ts(ti["start_date"]), "end": ts(ti["end_date"]), "queued": ts(ti["queued_when"]),
            "pool": ti["pool"], "shard": r.shard, "train": 0.0, "controlled": 0.0, "configs": 0})
        unit["train"] += r.timings["train"]
        unit["controlled"] += controlled(r.config_id, r.t, r.shard)
        unit["configs"] += 1
    for unit in hops.values():
        unit["duration"] = unit["end"] - unit["start"]
    pool_spans: dict[str, list[tuple[float, float]]] = {}
    for ti in tis:
        if ((ti["pool"] or "").startswith("mop_shard_") and ti["state"] != "skipped"
                and ti["start_date"] and ti["end_date"]):
            pool_spans.setdefault(ti["pool"], []).append((ts(ti["start_date"]), ts(ti["end_date"])))
    stage_tis = [ti for ti in tis if ti["task_id"].startswith("stage_shard_")]
    stages_end = max(ts(ti["end_date"]) for ti in stage_tis)

    first, last = min(h["start"] for h in hops.values()), max(h["end"] for h in hops.values())
    measured = last - first
    measured_work = sum(h["duration"] for h in hops.values())
    measured_busy = measured_work / (measured * p * slots)
    # per task instance, and per configuration trained in it
    fixed_each = [h["duration"] - h["train"] for h in hops.values()]
    fixed_per_config = [(h["duration"] - h["train"]) / h["configs"] for h in hops.values()]
    overhead_each = [(h["train"] - h["controlled"]) / h["configs"] for h in hops.values()]
    fixed, overhead = statistics.median(fixed_each), statistics.median(overhead_each)
    handoff = hand_offs(hops, pool_spans, stages_end, slots)
    latency = statistics.median(h["to_start"] for h in handoff.values())

    plan = spec_task_plan(MopSpec.from_dict(run_record.spec), plan_record.priority)  # the DAG's own plan
    per_class_ids = [[f"b{k}" for k in range(sum(map(len, bundles[:o])), sum(map(len, bundles[:o + 1])))]
                     for o in range(p)]

    def sim(seconds: Callable[[str, int, int], float], task_seconds: float, config_seconds: float = 0.0) -> Simulation:
        return simulate_bundles(plan, bundles, seconds, slots=slots, task_seconds=task_seconds,
                                config_seconds=config_seconds)

    def replay(task_seconds: float) -> Simulation:
        return simulate(plan, lambda group, expanded: per_class_ids[group.offset],
                        lambda b, t, s: hops[(b, t)]["duration"], slots=slots, task_seconds=task_seconds)

    # The same inputs as means: a makespan sums durations along chains, and these are right-skewed.
    fixed_mean, overhead_mean = statistics.mean(fixed_each), statistics.mean(overhead_each)
    latency_mean = statistics.mean(h["to_start"] for h in handoff.values())
    variants = [
        # (name, simulation, seconds of each hop that are hand-off latency, not work)
        ("A predicted: controlled training, fixed cost", sim(controlled, fixed), 0.0),
        ("B   A + training overhead", sim(controlled, fixed, overhead), 0.0),
        ("C   B + hand-off latency", sim(controlled, fixed + latency, overhead), latency),
        ("D   C with means instead of medians", sim(controlled, fixed_mean + latency_mean, overhead_mean),
         latency_mean),
        ("E replay: measured task durations", replay(0.0), 0.0),
        ("F   E + hand-off latency", replay(latency), latency),
    ]

    mean_controlled = {c: statistics.mean(batches[s] * spb[c] for s in range(p)) for c in spb}
    bound_training = lower_bound(mean_controlled, {c: hops_per_config for c in spb}, shards=p, slots=slots)

    # -- report ----------------------------------------------------------------------------------
    print()
    print(f"date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}"
          + (f" (re-analysis of a run that started {dt.datetime.fromtimestamp(ts(run['start_date']), dt.timezone.utc).isoformat(timespec='seconds')})"
             if args.reanalyze else ""))
    print(f"machine: {platform.platform()}, {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    print(f"load average (1/5/15 min): at start {fmt_load(load_at_start)}; at trigger {fmt_load(load_at_trigger)}; "
          f"at the end of the run {fmt_load(load_at_end)}; 1-min samples during the benchmark: "
          f"{summarize_load(saved['load']['samples'])}")
    print(f"inputs: {len(spb)} configurations of {MODEL}, {p} shards x {slots} slot(s), {iterations} iterations "
          f"({hops_per_config} hops per configuration, {len(hops)} hops); batch size {BATCH_SIZE}, "
          f"{train_rows} training rows x {FEATURES} features, batches per shard {batches}; priority rule "
          f"{plan_record.priority!r}")
    print(f"bundles (plan.json, bundle_size {plan_record.bundle_size!r}): {len(members_of)} chains; "
          f"{len(hops)} hop task instances for {len(records)} model hops")
    print(f"\n{'bundle':<8} {'class':>5} {'configs':>7} {'controlled/hop':>15} {'measured train':>15} "
          f"{'measured task':>14}   (medians over the bundle's hops)")
    for o, ids in enumerate(per_class_ids):
        for b in ids:
            own = [h for (k, _), h in hops.items() if k == b]
            print(f"{b:<8} {o:>5} {len(members_of[b]):>7} {statistics.median(h['controlled'] for h in own):>14.2f}s "
                  f"{statistics.median(h['train'] for h in own):>14.2f}s "
                  f"{statistics.median(h['duration'] for h in own):>13.2f}s")
    print("\nper hop task instance (a bundle's hop), and per configuration trained in it:")
    print(f"  task duration         {describe([h['duration'] for h in hops.values()])}")
    print(f"  fixed cost per task   {describe(fixed_each)}   (task duration - its configurations' timings['train'])")
    print(f"  fixed cost per config {describe(fixed_per_config)}   (the same, divided by its configurations)")
    print(f"  training overhead     {describe(overhead_each)}   per configuration (timings['train'] - batches x "
          "seconds_per_batch)")
    print(f"  hand-off to start     {describe([h['to_start'] for h in handoff.values()])}   "
          "(could start -> start_date)")
    print(f"    could start->queued {describe([h['to_queued'] for h in handoff.values()])}")
    print(f"    queued->start       {describe([h['queued_to_start'] for h in handoff.values()])}")
    first_on_pool = sorted(min(h["start"] for h in hops.values() if h["pool"] == pool) for pool in pool_spans)
    print(f"  start: the stage tasks were done {first - stages_end:.2f}s before the first hop started; the first hop "
          f"of each shard started {', '.join(f'{v - stages_end:.2f}' for v in first_on_pool)}s after them")
    dag_wall = ts(run["end_date"]) - ts(run["start_date"])
    print(f"DAG run wall time {dag_wall:.1f}s (trigger to success); hop window {measured:.1f}s")
    print(f"\nmodel inputs, median (mean): fixed cost per task {fixed:.2f}s ({fixed_mean:.2f}s), training overhead "
          f"per configuration {overhead:.2f}s ({overhead_mean:.2f}s), hand-off latency {latency:.2f}s "
          f"({latency_mean:.2f}s)")
    print(f"\n{'':<46} {'makespan':>9} {'error':>8} {'within 10 %':>12} {'busy':>7} {'same order':>11}")
    print(f"{'measured (real Airflow)':<46} {measured:>8.1f}s {'':>8} {'':>12} {measured_busy:>7.1%}")
    for name, simulation, not_work in variants:
        predicted = window(simulation)
        error = (predicted - measured) / measured
        print(f"{name:<46} {predicted:>8.1f}s {error:>+8.1%} {'yes' if abs(error) <= TOLERANCE else 'no':>12} "
              f"{busy(simulation, not_work=not_work):>7.1%} {same_order(hops, simulation):>5}/{len(hops)}")
    print(f"  busy: hop task time / (hop window x {p * slots} slots); error: (predicted - measured) / measured; "
          "same order: hops at the same position of their shard's sequence as in the real run")
    per_pool = {pool: sum(e - s for (s, e) in spans if s >= first - 1e-6) / (measured * slots)
                for pool, spans in sorted(pool_spans.items())}
    print("measured busy fraction per pool: " + ", ".join(f"{k} {v:.1%}" for k, v in per_pool.items()))
    main_prediction = window(variants[0][1])
    print(f"\npure-training bound (controlled training only, every slot busy): {bound_training:.1f}s; "
          f"measured efficiency {bound_training / measured:.1%} (hop window {measured:.1f}s)")
    error = (main_prediction - measured) / measured
    replay_error = (window(variants[4][1]) - measured) / measured
    print(f"\npredicted (A) {main_prediction:.1f}s vs measured {measured:.1f}s: error {error:+.1%}; "
          f"within 10 %: {'yes' if abs(error) <= TOLERANCE else 'no'}")
    print(f"replay (E, measured durations) {window(variants[4][1]):.1f}s: error {replay_error:+.1%}; "
          f"within 10 %: {'yes' if abs(replay_error) <= TOLERANCE else 'no'}")
    keep = args.keep or args.home or args.reanalyze
    print(f"benchmark took {time.time() - began:.0f}s; working folder {'kept' if keep else 'removed'}")
    if not keep:
        shutil.rmtree(home, ignore_errors=True)
    return 0


def same_order(hops: Mapping[tuple[str, int], Mapping[str, Any]], simulation: Simulation) -> int:
    """How many hops hold the same position in their shard's sequence, real run vs simulation."""
    real: dict[int, list[tuple[str, int]]] = {}
    for key, hop in sorted(hops.items(), key=lambda item: item[1]["start"]):
        real.setdefault(hop["shard"], []).append(key)
    simulated: dict[int, list[tuple[str, int]]] = {}
    for event in sorted(simulation.events, key=lambda e: (e.start, e.slot)):
        simulated.setdefault(event.shard, []).append((event.config_id, event.t))
    return sum(a == b for shard in real for a, b in zip(real[shard], simulated.get(shard, [])))


def fmt_load(values: tuple[float, float, float]) -> str:
    return "/".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
