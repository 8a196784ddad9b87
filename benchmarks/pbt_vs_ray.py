"""Population-based training two ways, side by side in one run: mop_airflow's PBT DAG against Ray
Tune's ``PopulationBasedTraining``.

The same MNIST-1D data (16,000 training rows, the 4,000-row test split for validation), the same
search space (the PBT example's, ``dags/mop_mnist1d_pbt.py``: the 1-D CNN of
``mop_airflow.examples.mnist1d_models``, Adam, a log-uniform learning rate in [1e-4, 3e-2], batch
size 32, 64 or 128), the same population, length (``--iterations`` passes over the training data),
``--interval``, ``--quantile``, ``--resample-probability``, perturbation factors (1.2, 0.8) and
mutations (the learning rate on its log-uniform range, the batch size on its list), two trials at a
time:

  mop_airflow   the example's search with ``--population --iterations --interval ...`` on the
                embedded Airflow (SQLite, LocalExecutor), on ``--shards`` one-slot shard pools, so at
                most two hop tasks train at once with the default 2 shards, each on half of the data.
                One iteration (every member visits every shard once) is one pass over the whole
                training data; the search is decided between blocks of one iteration, by the decide
                tasks of one DAG run or of a chain of runs (``schedule.iterations_per_run``; "auto"
                holds a search this small in one run). At every ``interval`` the whole population is
                ranked together and each member of the bottom quantile goes on as a copy of one of
                the top (its checkpoint: weights and Adam moments), explored. Timed from the start of
                its first DAG run to the end of its last (the one whose ``report`` task ran), any
                hand-offs between runs included and Airflow's start-up not.
  Ray Tune      ``tune.Tuner`` with ``PopulationBasedTraining(time_attr="epoch",
                perturbation_interval=interval, quantile_fraction=quantile, resample_probability=...,
                perturbation_factors=(1.2, 0.8), hyperparam_mutations=..., synch=True)``,
                ``metric="val_accuracy", mode="max"``, ``num_samples=population``, two trials at a
                time (one CPU each) while ``max_concurrent_trials`` lets the whole population be alive
                (Ray's PBT pauses the members that reached a boundary and runs the others, so every
                member must be running or paused). The function trainable trains one epoch over the
                whole training data at a time, evaluates, and reports ``val_accuracy`` with a
                ``tune.Checkpoint`` of its model (``model.save``: weights and Adam state); it starts
                from ``tune.get_checkpoint()`` when there is one (its own after a pause, or the top
                member's after an exploit), with the learning rate and batch size of its config, as
                Ray's PBT guide shows for function trainables. A trial stops at ``epoch ==
                iterations`` (so the last report is not a boundary). Fresh members' initial weights are
                seeded from their configuration. The same distributions, drawn by Ray's own generator
                (``--same-draws``: the very initial population mop_airflow drew). Timed as the wall
                time of its process (Ray's and TensorFlow's start-up included).

``synch=True`` matches mop_airflow's synchronous ranking (Ray's default ranks each trial alone when
it reaches a boundary). What still differs (see ``mop_airflow.search.pbt``): Ray lets a perturbed
learning rate drift out of its range, mop_airflow clips it into the range; a mop_airflow copy is a
new configuration in the member's place, a Ray copy keeps its trial. Every TensorFlow process uses
one intra-op thread (``threads_per_hop: 1`` for the hops). "best" is the highest validation accuracy
a member of the final population ended with; "copies" are the exploits (a bottom member taking a top
member's checkpoint); "epochs" the passes over the training data both sides trained in all (Ray's
counted by its trainables, so an epoch trained and then thrown away by a pause would count too).

    python benchmarks/pbt_vs_ray.py [--population 4] [--iterations 6] [--interval 2] [--quantile 0.25]
                                    [--resample-probability 0.25] [--shards 2] [--same-draws]
                                    [--reuse-actors] [--home DIR]

Needs ``ray[tune]`` (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.asha_vs_ray import ray_space, wait_for_search  # noqa: E402
from benchmarks.demo_grid import label, load_data  # noqa: E402
from benchmarks.harness import (REPO, embedded_airflow, example_data, header, load, one_thread, result,  # noqa: E402
                                run_seconds, timed_process, write_dag)

DAG_ID = "mop_pbt_vs_ray"
# The PBT example's space and exploration (dags/mop_mnist1d_pbt.py), its space's seed and schedule's seed.
MODEL = "mop_airflow.examples.mnist1d_models:cnn"
LEARNING_RATE = {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2}
BATCH_SIZES = [32, 64, 128]
FACTORS = (1.2, 0.8)
SPACE_SEED, SEED = 7, 42
# Smaller than the example's 8 members x 12 iterations, so that each side takes minutes on 2 cores.
POPULATION, ITERATIONS, INTERVAL, QUANTILE, RESAMPLE = 4, 6, 2, 0.25, 0.25
# Two one-slot shards: two hops at once, as Ray Tune runs two trials at once (the example has 4).
SHARDS = 2
TRIALS_AT_ONCE = 2


def pbt_space() -> dict:
    return {"method": "random", "seed": SPACE_SEED,
            "params": {"model": MODEL, "learning_rate": LEARNING_RATE, "batch_size": BATCH_SIZES}}


def pbt_adaptive(options: dict) -> dict:
    return {"method": "pbt", "population": options["population"], "iterations": options["iterations"],
            "interval": options["interval"], "quantile": options["quantile"],
            "resample_probability": options["resample_probability"], "perturbation_factors": list(FACTORS),
            "mutations": {"learning_rate": LEARNING_RATE, "batch_size": BATCH_SIZES}}


def pbt_spec(folder: str, options: dict) -> dict:
    """The example DAG's spec with the benchmark's population and shards, one TensorFlow thread a hop."""
    from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec  # noqa: PLC0415

    return {
        "data": mnist1d_data_spec(folder),
        "search": {"space": pbt_space(), "metric": "val_accuracy", "adaptive": pbt_adaptive(options)},
        "schedule": {"shards": options["shards"], "seed": SEED, "threads_per_hop": 1},
    }


# -- Ray Tune, in its own process ----------------------------------------------------------------

def ray_pbt(folder: str, options: dict) -> dict:
    import ray  # noqa: PLC0415

    # the trial processes import this module's helpers from the checkout
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    # Ray's session files (sockets among them, whose paths must stay short) go to a temporary folder of their own
    session = tempfile.mkdtemp(prefix="ray-")
    ray.init(num_cpus=TRIALS_AT_ONCE, include_dashboard=False, log_to_driver=False, _temp_dir=session)
    try:
        return _ray_trials(folder, options)
    finally:
        ray.shutdown()
        shutil.rmtree(session, ignore_errors=True)


def _ray_trials(folder: str, options: dict) -> dict:
    from ray import tune  # noqa: PLC0415
    from ray.tune.schedulers import PopulationBasedTraining  # noqa: PLC0415
    from ray.tune.search import BasicVariantGenerator  # noqa: PLC0415

    iterations = options["iterations"]
    events = os.path.join(folder, "ray_events.jsonl")  # what the trainables did: restores and epochs

    def log(event: dict) -> None:
        with open(events, "a") as out:
            out.write(json.dumps(event) + "\n")

    def trainable(config):
        import keras  # noqa: PLC0415

        from mop_airflow.training.builder import load_builder  # noqa: PLC0415

        try:
            one_thread()
        except RuntimeError:  # a reused actor has set it already
            pass
        (x, y), (xv, yv) = load_data(folder)
        trial = tune.get_context().get_trial_id()
        checkpoint, epoch = tune.get_checkpoint(), 0
        if checkpoint is None:
            keras.utils.set_random_seed(zlib.crc32(label(config).encode()))
            model = load_builder(config["model"])({"input_dim": x.shape[1], "num_classes": 10})
            model.compile(optimizer=keras.optimizers.Adam(config["learning_rate"]),
                          loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        else:
            with checkpoint.as_directory() as where:
                model = keras.models.load_model(os.path.join(where, "model.keras"))
                meta = json.loads(Path(where, "meta.json").read_text())
            epoch = meta["epoch"]
            model.optimizer.learning_rate = config["learning_rate"]  # the saved state holds the old one
            log({"event": "restore", "trial": trial, "from": meta["trial"], "epoch": epoch, "config": label(config)})
        while epoch < iterations:
            model.fit(x, y, batch_size=int(config["batch_size"]), epochs=1, shuffle=True, verbose=0)
            epoch += 1
            accuracy = float(model.evaluate(xv, yv, batch_size=256, verbose=0, return_dict=True)["accuracy"])
            log({"event": "epoch", "trial": trial, "epoch": epoch, "val_accuracy": accuracy})
            with tempfile.TemporaryDirectory() as where:
                model.save(os.path.join(where, "model.keras"))
                Path(where, "meta.json").write_text(json.dumps({"trial": trial, "epoch": epoch}))
                tune.report({"val_accuracy": accuracy, "epoch": epoch},
                            checkpoint=tune.Checkpoint.from_directory(where))

    space = {"params": {"model": MODEL, "learning_rate": LEARNING_RATE,
                        "batch_size": {"distribution": "choice", "values": BATCH_SIZES}}}
    param_space = ray_space(space)
    scheduler = PopulationBasedTraining(
        time_attr="epoch", perturbation_interval=options["interval"], quantile_fraction=options["quantile"],
        resample_probability=options["resample_probability"], perturbation_factors=FACTORS,
        hyperparam_mutations={"learning_rate": param_space["learning_rate"], "batch_size": list(BATCH_SIZES)},
        synch=True)
    # Ray's PBT draws its parents and explorations from Python's generator, and a resampled value from
    # the search space's distribution through NumPy's global one, in this process: both seeded
    random.seed(SEED)
    import numpy as np  # noqa: PLC0415

    np.random.seed(SEED)
    search = BasicVariantGenerator(points_to_evaluate=options.get("points"), random_state=SPACE_SEED)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}), param_space=param_space,
        tune_config=tune.TuneConfig(metric="val_accuracy", mode="max", scheduler=scheduler, search_alg=search,
                                    num_samples=options["population"], max_concurrent_trials=options["population"],
                                    reuse_actors=options["reuse_actors"]),
        run_config=tune.RunConfig(storage_path=os.path.join(folder, "ray_results"), verbose=0,
                                  stop={"epoch": iterations}))
    results = tuner.fit()
    trials = []
    for result in results:
        metrics = result.metrics or {}
        trials.append({"config": label(result.config), "val_accuracy": metrics.get("val_accuracy"),
                       "epochs": metrics.get("epoch", 0), "error": str(result.error) if result.error else None})
    done = [json.loads(line) for line in Path(events).read_text().splitlines()] if os.path.exists(events) else []
    return {"trials": trials, "events": done}


# -- mop_airflow ---------------------------------------------------------------------------------

def mop_pbt(home: Path, folder: str, options: dict, timeout: float) -> dict:
    from mop_airflow.records import HopRecord  # noqa: PLC0415
    from mop_airflow.records.layout import RunLayout, read_run  # noqa: PLC0415
    from mop_airflow.store import Store  # noqa: PLC0415

    write_dag(home / "dags", DAG_ID, pbt_spec(folder, options))
    store = Store("file://" + str(home / "store"))
    with embedded_airflow(home, home / "dags", pools_for=DAG_ID) as af:
        first = af.trigger(DAG_ID)
        runs = wait_for_search(af, DAG_ID, first, timeout=timeout)
        seconds = run_seconds(af, DAG_ID, first, runs[-1])
    layout = RunLayout(store, DAG_ID, first)
    board = store.read_json(layout.report_uri("leaderboard.json"))
    hops = [HopRecord.from_dict(store.read_json(uri)) for uri in store.glob(layout.hops_glob)]
    members = set(board["members"])
    trials = [{"config": label({"model": row["model"], "learning_rate": row["learning_rate"],
                                "batch_size": row["batch_size"]}),
               "val_accuracy": row.get("val_accuracy"),
               "epochs": 0 if row.get("iteration") is None else row["iteration"] + 1}
              for row in board["leaderboard"] if row["config_id"] in members]
    configs = read_run(layout).configs
    first_population = configs[:options["population"]]
    return {"seconds": seconds, "trials": trials, "lineage": board["lineage"],
            "facts": {"DAG runs": len(runs), "configurations": len(configs), "model hops": len(hops),
                      "failed hops": sum(h.status != "ok" for h in hops), "threads": sorted({h.threads for h in hops})},
            "epochs": sum(h.status == "ok" for h in hops) / options["shards"],
            "draws": [{"model": c["model"], "learning_rate": c["optimizer_params"]["learning_rate"],
                       "batch_size": c["batch_size"]} for c in first_population]}


def _metric(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--population", type=int, default=POPULATION, help="members trained side by side")
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="passes over the data every member trains")
    parser.add_argument("--interval", type=int, default=INTERVAL, help="passes between two rankings of the population")
    parser.add_argument("--quantile", type=float, default=QUANTILE, help="the bottom share that copies the top share")
    parser.add_argument("--resample-probability", type=float, default=RESAMPLE,
                        help="the chance of a fresh draw instead of a perturbation")
    parser.add_argument("--shards", type=int, default=SHARDS, help="mop_airflow's one-slot shards: hops at once")
    parser.add_argument("--same-draws", action="store_true",
                        help="Ray Tune starts from the initial population mop_airflow drew instead of its own draws")
    parser.add_argument("--reuse-actors", action="store_true", help="Ray Tune reuses its trial processes")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds the mop_airflow search may take")
    parser.add_argument("--home", help="keep the runs here (default: a temporary folder, deleted)")
    parser.add_argument("--skip-ray", action="store_true", help="mop_airflow's side alone (a check that it runs)")
    parser.add_argument("--ray", help=argparse.SUPPRESS)
    parser.add_argument("--ray-options", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ray:
        print(json.dumps(ray_pbt(args.ray, json.loads(Path(args.ray_options).read_text()))))
        return 0
    try:
        import ray  # noqa: F401, PLC0415
    except ImportError:
        if not args.skip_ray:
            print("Ray Tune is not installed: pip install -e '.[bench]' (or --skip-ray)")
            return 2

    options = {"population": args.population, "iterations": args.iterations, "interval": args.interval,
               "quantile": args.quantile, "resample_probability": args.resample_probability, "shards": args.shards}
    home = Path(args.home or tempfile.mkdtemp(prefix="mop-pbt-vs-ray-")).absolute()
    header("pbt_vs_ray")
    print(f"PBT population={args.population} iterations={args.iterations} interval={args.interval} "
          f"quantile={args.quantile} resample_probability={args.resample_probability} factors={list(FACTORS)}; "
          f"mop_airflow on {args.shards} one-slot shards, Ray Tune {TRIALS_AT_ONCE} trials at a time (synch=True)"
          f"{', reusing actors' if args.reuse_actors else ''}"
          f"{', from the population mop_airflow drew' if args.same_draws else ''}", flush=True)
    try:
        folder = example_data(home / "data")
        rows = []
        before = load()
        print(f"mop_airflow (load average {before})", flush=True)
        mop = mop_pbt(home, folder, options, args.timeout)
        rows.append((f"mop_airflow PBT, {args.shards} shards x 1 slot", mop["seconds"], mop["trials"],
                     len(mop["lineage"]), mop["epochs"], before, load(), mop["facts"]))

        if args.skip_ray:
            name, seconds, trials, copies, epochs, *_ = rows[0]
            best = max((t["val_accuracy"] for t in trials if t["val_accuracy"] is not None), default=None)
            print(f"{name}: {seconds:.1f} s, best {_metric(best)}, copies {copies}, epochs {epochs:g}; "
                  f"{json.dumps(rows[0][-1])}")
            result("pbt_vs_ray", {"mop_airflow": {"seconds": round(seconds, 1), "best": best, "copies": copies,
                                                  "epochs": epochs, **rows[0][-1]}})
            return 0
        ray_options = {**options, "reuse_actors": args.reuse_actors,
                       "points": mop["draws"] if args.same_draws else None}
        (home / "ray_options.json").write_text(json.dumps(ray_options))
        before = load()
        print(f"Ray Tune (load average {before})", flush=True)
        wall, out = timed_process(__file__, "--ray", folder, "--ray-options", str(home / "ray_options.json"))
        trials, events = out["trials"], out["events"]
        errors = [t["error"] for t in trials if t["error"]]
        restores = [e for e in events if e["event"] == "restore"]
        ray_copies = [e for e in restores if e["from"] != e["trial"]]
        rows.append((f"Ray Tune PopulationBasedTraining, {TRIALS_AT_ONCE} at a time", wall,
                     [t for t in trials if t["epochs"] == args.iterations], len(ray_copies),
                     sum(e["event"] == "epoch" for e in events), before, load(),
                     {"trials": len(trials), "restores": len(restores), "errors": len(errors)}))
        if errors:
            print("Ray Tune trial errors:\n" + "\n".join(errors[:3]))

        print(f"\n{'side':<44} {'seconds':>8}  {'best':>7}  {'copies':>6}  {'epochs':>6}  "
              f"{'load average before / after':<34}best final member (epochs)")
        for name, seconds, trials, copies, epochs, before, after, facts in rows:
            ranked = [t for t in trials if t["val_accuracy"] is not None]
            best = max(ranked, key=lambda t: t["val_accuracy"]) if ranked else {"val_accuracy": float("nan"),
                                                                                 "config": "-", "epochs": 0}
            print(f"{name:<44} {seconds:>8.1f}  {best['val_accuracy']:>7.4f}  {copies:>6}  {epochs:>6g}  "
                  f"{before + ' / ' + after:<34}{best['config']} ({best['epochs']})  {json.dumps(facts)}")

        print("\nmop_airflow's copies (after iteration: member, replaced <- parent, changes):")
        for c in mop["lineage"]:
            changes = ", ".join(f"{k} {v[0]:g} -> {v[1]:g}" for k, v in sorted(c["changes"].items())) or "none"
            print(f"  {c['iteration']:>3}: member {c['member']}, {c['replaced']} ({_metric(c['replaced_metric'])}, "
                  f"{c['rank']} of {c['of']}) <- {c['parent']} ({_metric(c['parent_metric'])}); {changes}")
        print("Ray Tune's copies (after epoch: trial <- trial it copied, its config from then on):")
        for e in ray_copies:
            print(f"  {e['epoch']:>3}: {e['trial']} <- {e['from']}; {e['config']}")

        (_, mop_s, mop_trials, *_), (_, ray_s, ray_trials, *_) = rows
        mop_best = max((t["val_accuracy"] for t in mop_trials if t["val_accuracy"] is not None), default=float("nan"))
        ray_best = max((t["val_accuracy"] for t in ray_trials if t["val_accuracy"] is not None), default=float("nan"))
        print(f"\nmop_airflow / Ray Tune: wall time {mop_s / ray_s:.2f}x, best val_accuracy "
              f"{mop_best - ray_best:+.4f}; goal (the same or better accuracy in no more time): "
              f"{'met' if mop_s <= ray_s and mop_best >= ray_best else 'not met'}")
        result("pbt_vs_ray", {"options": options, "same_draws": args.same_draws, "sides": {
            row[0]: {"seconds": round(row[1], 1), "copies": row[3], "epochs": row[4], "load": f"{row[5]} / {row[6]}",
                     "best": max((t["val_accuracy"] for t in row[2] if t["val_accuracy"] is not None), default=None),
                     **row[7]} for row in rows}})
    finally:
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
