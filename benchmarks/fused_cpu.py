"""Fused configurations against one at a time, on the CPU (Keras on JAX's CPU backend).

16 configurations of one of the demo's models (MNIST-1D, 20,000 generated samples: 16,000 training
rows in 4 shards of 4,000, MNIST-1D's own 4,000 test rows for validation), Adam, batch size 32, 16
learning rates from 1e-3 to 1e-2 (log-spaced), train 5 hops: hop ``h`` on shard ``h mod 4``, every
configuration evaluated on the validation rows after every hop, every hop committed to a ``file://``
store (checkpoint and hop record), as a shard slot commits it.

  unfused    the warm single path: one process, one compiled model reused by every configuration
             (``TaskSession`` as a shard slot keeps it), each configuration's hop in turn
             (``train_hop`` + commit);
  fused N    the configurations in groups of N (``fuse_groups``), each group's hop one compiled step
             over its stacked variables (``train_fused_hop``), each member committed in turn.

Every run is a fresh process (its compilations included: JAX's persistent cache is off), on the same
data and threads (XLA's CPU thread pool, all the machine's cores, as a slot on it would have);
``--runs`` of each (3 by default), median and range. Reports the whole 5 hops (what a block of them
costs a slot, compilation included) and hops 2 to 5 (compiled).

    python benchmarks/fused_cpu.py                    # the MLP, about 10 minutes on 2 cores
    python benchmarks/fused_cpu.py --model cnn --runs 3

What fusing does to a leaderboard: each configuration's final val_accuracy, fused against unfused
(``--rates`` picks the learning rates, ``--shards`` and ``--hops`` the search's size):

    python benchmarks/fused_cpu.py --model cnn --rates 1e-3 3e-3 1e-2 3e-2 --shards 2 --hops 4 --groups 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import REPO, example_data, header, result, spread, summary  # noqa: E402

RATES = [round(1e-3 * 10 ** (i / 15), 6) for i in range(16)]  # 16 log-spaced from 1e-3 to 1e-2
SHARDS = 4
HOPS = 5

RUN = r"""
import json, sys, time
from mop_airflow.data.shard import shard_dataset
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.records import Assignment
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.planning.fusing import fuse_groups
from mop_airflow.search.space import config_field
from mop_airflow.training.fused import train_fused_hop
from mop_airflow.training.model_hop import state_after, train_hop
from mop_airflow.training.session import TaskSession, WARM_MODELS

spec, fuse, hops = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
run = resolve_run(spec, None, dag_id="bench", run_id="r")
layout = RunLayout(Store(run.store.root), "bench", "r")
manifest = shard_dataset(run.data, layout.store, "bench", run.schedule.shards, run.schedule.seed)
manifest.write(layout.store, layout.store.root + "/manifest.json")
session = TaskSession(run, manifest, run.store.cache_dir, max_models=WARM_MODELS)
states = {c["config_id"]: Assignment(c["config_id"], -1, None) for c in run.configs}
groups = fuse_groups(run.configs, fuse, "jax")
hop_seconds, best = [], {}
for t in range(hops):
    shard, began = t % run.schedule.shards, time.perf_counter()
    for group in groups:
        if len(group) == 1:
            trained = [train_hop(layout, run, manifest, states[group[0]], t=t, shard=shard, rung_end=True,
                                 cache_dir=run.store.cache_dir, session=session)]
        else:
            trained = train_fused_hop(layout, run, manifest, [states[c] for c in group], t=t, shard=shard,
                                      rung_end=True, cache_dir=run.store.cache_dir, session=session)
        for hop in trained:
            if isinstance(hop, Exception):
                raise hop
            record = hop.commit()
            states[record.config_id] = state_after(record)
            best[record.config_id] = record.val_metrics["val_accuracy"]
    hop_seconds.append(time.perf_counter() - began)
rates = {c["config_id"]: config_field(c, "learning_rate") for c in run.configs}
print(json.dumps({"hop_seconds": hop_seconds, "groups": [len(g) for g in groups],
                  "best_val_accuracy": max(best.values()),
                  "final": {str(rates[c]): accuracy for c, accuracy in best.items()}}))
"""


def spec_for(folder: str, data: dict, model: str, rates: list[float], shards: int) -> dict:
    return {"data": {"source": data["train"], "validation": data["test"], "label": "label", "features": "x*",
                     "classes": list(range(10))},
            "search": {"space": {"method": "grid", "params": {
                "model": [f"mop_airflow.examples.mnist1d_models:{model}"], "optimizer": "adam",
                "learning_rate": rates, "batch_size": [32]}}},
            "schedule": {"shards": shards, "iterations": 2, "seed": 42},
            "store": {"root": f"file://{folder}/store", "cache_dir": f"{folder}/cache"}}


def one_run(spec: dict, fuse: int | str, hops: int) -> dict:
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "MOP_COMPILATION_CACHE": "0",
           "MOP_SHARED_COMPILE": "0", "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(spec), json.dumps(fuse), str(hops)], env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise SystemExit(f"a run with fuse={fuse} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--groups", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--rates", type=float, nargs="+", default=RATES, help="one configuration a learning rate")
    parser.add_argument("--shards", type=int, default=SHARDS, help="shards of the 16,000 training rows")
    parser.add_argument("--hops", type=int, default=HOPS,
                        help="hops each configuration trains (hop h on shard h mod shards)")
    args = parser.parse_args()
    hops = args.hops

    header("fused_cpu", "Keras on JAX's CPU backend")  # Keras itself is imported by the runs, on JAX
    print(f"{len(args.rates)} configurations of the demo's {args.model}, Adam, batch 32, {hops} hops of a "
          f"{args.shards}-shard split of MNIST-1D (16,000 training rows), validated after every hop; "
          f"{args.runs} runs each")
    with tempfile.TemporaryDirectory() as folder:
        from mop_airflow.examples.mnist1d_spec import TEST_FILE, TRAIN_FILE  # noqa: PLC0415

        where = example_data(os.path.join(folder, "data"))
        data = {"train": os.path.join(where, TRAIN_FILE), "test": os.path.join(where, TEST_FILE)}
        variants: list[tuple[str, int | str]] = [("unfused", "off")] + [(f"fused {n}", n) for n in args.groups]
        rows, finals = [], []
        for name, fuse in variants:
            runs = []
            for index in range(args.runs):
                work = os.path.join(folder, f"{name.replace(' ', '_')}-{index}")
                runs.append(one_run(spec_for(work, data, args.model, args.rates, args.shards), fuse, hops))
            whole = [sum(r["hop_seconds"]) for r in runs]
            warm = [sum(r["hop_seconds"][1:]) for r in runs]
            rows.append((name, whole, warm, runs[0]["groups"], runs[0]["best_val_accuracy"]))
            finals.append((name, [r["final"] for r in runs]))
            print(f"  {name:<8} groups {runs[0]['groups']}: {hops} hops {spread(whole)}, hops 2-{hops} {spread(warm)}, "
                  f"best val_accuracy {runs[0]['best_val_accuracy']:.4f}", flush=True)
        base_whole, base_warm = statistics.median(rows[0][1]), statistics.median(rows[0][2])
        print(f"\n| | {hops} hops, s (median, range) | hops 2-{hops}, s | speed-up ({hops} hops / hops 2-{hops}) |")
        print("|---|---|---|---|")
        for name, whole, warm, _, _ in rows:
            print(f"| {name} | {spread(whole)} | {spread(warm)} | {base_whole / statistics.median(whole):.2f}x / "
                  f"{base_warm / statistics.median(warm):.2f}x |")
        moved = leaderboard_moves(finals)
        result("fused_cpu", {"model": args.model, "variants": {
            name: {"hops": summary(whole), "compiled_hops": summary(warm), "groups": groups, "best": best}
            for name, whole, warm, groups, best in rows}, "final_val_accuracy_moved": moved})


def leaderboard_moves(finals: list[tuple[str, list[dict]]]) -> dict:
    """Print and return, for each fused variant, how far each learning rate's final val_accuracy moved
    from the unfused one's, and whether every run of a variant ended on the same figures (a fused group
    trains to the same bits every time)."""
    unfused = finals[0][1][0]
    moved = {name: {rate: round(abs(runs[0][rate] - unfused[rate]), 6) for rate in unfused}
             for name, runs in finals[1:]}
    print(f"\n| learning rate | unfused, final val_accuracy | {' | '.join(f'{name}, moved by' for name in moved)} |")
    print("|---|---|" + "---|" * len(moved))
    for rate in sorted(unfused, key=float):
        cells = " | ".join(f"{m[rate]:.4f}" for m in moved.values())
        print(f"| {float(rate):g} | {unfused[rate]:.4f} | {cells} |")
    for name, runs in finals:
        same = all(r == runs[0] for r in runs)
        print(f"  {name}: every run ended on the same val_accuracy: {'yes' if same else 'no'}")
    return moved


if __name__ == "__main__":
    main()
