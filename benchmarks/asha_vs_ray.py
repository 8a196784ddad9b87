"""ASHA two ways, side by side in one run: mop_airflow's ASHA DAG against Ray Tune's ``ASHAScheduler``.

The same MNIST-1D data (16,000 training rows, the 4,000-row test split for validation), the same
search space (the example's ``mnist1d_random_space(seed=7)``: an MLP or a 1-D CNN of
``mop_airflow.examples.mnist1d_models``, Adam, a log-uniform learning rate in [1e-3, 3e-2], batch
size 32, 64 or 128), the same budget (``n`` configurations, rungs at ``r``, ``r * eta``, ... ``R``
passes over the training data) and two trials at a time:

  mop_airflow   the example DAG ``dags/mop_mnist1d_asha.py`` with ``--n --r --R --eta --shards`` on the
                embedded Airflow (SQLite, LocalExecutor): ``--shards`` one-slot shard pools, so at most
                two hop tasks train at once with the default 2 shards, each on half of the data (the
                example's 4 shards would train four at once). One iteration (every configuration
                visits every shard once) is one pass over the whole training data. The search is
                decided between blocks of one iteration, one DAG run a block; it is timed from the
                start of its first DAG run to the end of its last (the one whose ``report`` task ran),
                the hand-offs between runs included and Airflow's start-up not.
  Ray Tune      ``tune.Tuner`` with ``ASHAScheduler(time_attr="training_iteration", grace_period=r,
                max_t=R, reduction_factor=eta)``, ``metric="val_accuracy", mode="max"``,
                ``num_samples=n``, two trials at a time (one CPU each), a trial reporting its
                validation accuracy after every epoch over the whole training data, so one
                training_iteration is one mop_airflow iteration. The same distributions, drawn by
                Ray's own generator (``--same-draws``: the very configurations mop_airflow drew).
                Timed as the wall time of its process (Ray's and TensorFlow's start-up included).

Every TensorFlow process uses one intra-op thread (``threads_per_hop: 1`` for the hops), so no side
is slowed by oversubscribed cores. Both sides evaluate every configuration on the validation split
after every pass; "best" is the highest validation accuracy a configuration ended with.

The two ASHAs are not the same algorithm. mop_airflow's is the promotion variant of the paper: a
configuration that completes a rung pauses, and one among the best 1/eta of its rung is later
promoted and resumes from its checkpoint (weights and Adam state); its blocks hold two
configurations per slot, so up to four are on their way at once while two train. Ray's is the
stopping variant: a trial that reaches a rung goes on unless it is below the rung's top 1/eta of
those recorded so far, and is otherwise stopped for good (it never pauses or resumes, so it needs no
checkpoint; the first trials to reach a rung always go on). So the two may train different numbers
of epochs for the same n, r, R, eta: both are printed.

    python benchmarks/asha_vs_ray.py [--n 27] [--r 1] [--R 9] [--eta 3] [--shards 2] [--same-draws]
                                     [--reuse-actors] [--budget ITERATIONS] [--home DIR]

``--budget`` also runs mop_airflow's ASHA with that budget as its deadline (``search.adaptive.budget``),
after the first and in an Airflow of its own, on the same draws: one more row of the table.

Needs ``ray[tune]`` (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.demo_grid import label, load_data, train_one  # noqa: E402
from benchmarks.harness import (REPO, embedded_airflow, example_data, header, load, one_thread, result,  # noqa: E402
                                run_seconds, timed_process, write_dag)

DAG_ID = "mop_asha_vs_ray"
# The example DAG's search (dags/mop_mnist1d_asha.py): ASHA's n, r, R, eta, the space's seed and the schedule's seed.
N, R_MIN, R_MAX, ETA, SPACE_SEED, SEED = 27, 1, 9, 3, 7, 42
# Two one-slot shards: two hops at once, as Ray Tune runs two trials at once (the example has 4).
SHARDS = 2
TRIALS_AT_ONCE = 2


def asha_spec(folder: str, *, n: int, r: int, R: int, eta: int, shards: int, budget: int | None = None) -> dict:
    """The example DAG's spec with the benchmark's budget and shards, one TensorFlow thread a hop
    (``budget``: ASHA's deadline in iterations, ``search.adaptive.budget``)."""
    from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec, mnist1d_random_space  # noqa: PLC0415

    adaptive = {"method": "asha", "n": n, "r": r, "R": R, "eta": eta, **({"budget": budget} if budget else {})}
    return {
        "data": mnist1d_data_spec(folder),
        "search": {"space": mnist1d_random_space(seed=SPACE_SEED), "metric": "val_accuracy", "adaptive": adaptive},
        "schedule": {"shards": shards, "seed": SEED, "threads_per_hop": 1},
    }


def ray_space(space: dict) -> dict:
    """Ray Tune's distributions for a mop_airflow random space's model, learning rate and batch size."""
    from ray import tune  # noqa: PLC0415

    params = space["params"]
    if params.get("optimizer", "adam") != "adam":
        raise ValueError(f"the Ray side trains with Adam, the space says {params['optimizer']!r}")

    def one(name: str, value):
        if not isinstance(value, dict):
            return value
        kind = value["distribution"]
        if kind == "choice":
            return tune.choice(list(value["values"]))
        if kind == "log_uniform":
            return tune.loguniform(value["low"], value["high"])
        if kind == "uniform":
            return tune.uniform(value["low"], value["high"])
        raise ValueError(f"{name}: no Ray Tune distribution for {kind!r} here")

    return {name: one(name, params[name]) for name in ("model", "learning_rate", "batch_size")}


# -- Ray Tune, in its own process ----------------------------------------------------------------

def ray_asha(folder: str, options: dict) -> dict:
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
    from ray.tune.schedulers import ASHAScheduler  # noqa: PLC0415
    from ray.tune.search import BasicVariantGenerator  # noqa: PLC0415

    from mop_airflow.examples.mnist1d_spec import mnist1d_random_space  # noqa: PLC0415

    epochs = options["R"]

    def trainable(config):
        try:
            one_thread()
        except RuntimeError:  # a reused actor has set it already
            pass
        train_one(config, load_data(folder), epochs=epochs, report=lambda acc: tune.report({"val_accuracy": acc}))

    scheduler = ASHAScheduler(time_attr="training_iteration", grace_period=options["r"], max_t=options["R"],
                              reduction_factor=options["eta"])
    search = BasicVariantGenerator(points_to_evaluate=options.get("points"), random_state=SPACE_SEED)
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}), param_space=ray_space(mnist1d_random_space(seed=SPACE_SEED)),
        tune_config=tune.TuneConfig(metric="val_accuracy", mode="max", scheduler=scheduler, search_alg=search,
                                    num_samples=options["n"], max_concurrent_trials=TRIALS_AT_ONCE,
                                    reuse_actors=options["reuse_actors"]),
        run_config=tune.RunConfig(storage_path=os.path.join(folder, "ray_results"), verbose=0))
    results = tuner.fit()
    trials = []
    for result in results:
        metrics = result.metrics or {}
        trials.append({"config": label(result.config), "val_accuracy": metrics.get("val_accuracy"),
                       "epochs": metrics.get("training_iteration", 0), "error": str(result.error) if result.error else None})
    return {"trials": trials}


# -- mop_airflow ---------------------------------------------------------------------------------

def wait_for_search(af, dag_id: str, first: str, *, timeout: float, log=print) -> list[str]:
    """Wait for the chain of DAG runs an adaptive search started with ``first``: its runs, in order.
    The search ends with the run whose ``report`` task succeeded; every other run started the next."""
    from mop_airflow.errors import AirflowApiError  # noqa: PLC0415
    from mop_airflow.planning.run_chain import next_run_id  # noqa: PLC0415

    deadline, runs, began = time.time() + timeout, [first], time.time()
    while True:
        run_id = runs[-1]
        while True:  # the previous run's decide task starts this one: it exists by the time that run ends
            try:
                af.run_state(dag_id, run_id)
                break
            except AirflowApiError:
                if time.time() > deadline:
                    raise TimeoutError(f"run {run_id} of {dag_id} never started") from None
                time.sleep(1)
        state = af.wait_for_run(dag_id, run_id, timeout=max(1.0, deadline - time.time()))
        states = {ti["task_id"]: ti["state"] for ti in af.task_instances(dag_id, run_id)}
        if state != "success":
            failed = sorted(task for task, s in states.items() if s == "failed")
            raise RuntimeError(f"run {run_id} of {dag_id} ended {state}; failed tasks: {failed}")
        log(f"  [{time.time() - began:6.0f} s] run {len(runs)} ({run_id}) done")
        if states.get("report") == "success":
            return runs
        runs.append(next_run_id(first, len(runs)))


def mop_asha(home: Path, folder: str, options: dict, timeout: float) -> dict:
    from mop_airflow.records import HopRecord  # noqa: PLC0415
    from mop_airflow.records.layout import RunLayout  # noqa: PLC0415
    from mop_airflow.store import Store  # noqa: PLC0415

    spec = asha_spec(folder, **{k: options[k] for k in ("n", "r", "R", "eta", "shards")}, budget=options.get("budget"))
    write_dag(home / "dags", DAG_ID, spec)
    store = Store("file://" + str(home / "store"))
    with embedded_airflow(home, home / "dags", pools_for=DAG_ID) as af:
        first = af.trigger(DAG_ID)
        runs = wait_for_search(af, DAG_ID, first, timeout=timeout)
        seconds = run_seconds(af, DAG_ID, first, runs[-1])
    layout = RunLayout(store, DAG_ID, first)
    board = store.read_json(layout.report_uri("leaderboard.json"))
    hops = [HopRecord.from_dict(store.read_json(uri)) for uri in store.glob(layout.hops_glob)]
    trials = [{"config": label({"model": row["model"], "learning_rate": row["learning_rate"],
                                "batch_size": row["batch_size"]}),
               "val_accuracy": row.get("val_accuracy"),
               "epochs": 0 if row.get("iteration") is None else row["iteration"] + 1}
              for row in board["leaderboard"]]
    kinds = [d["kind"] for d in board["decisions"]]
    configs = store.read_json(layout.run_record_uri)["configs"]
    return {"seconds": seconds, "trials": [t for t in trials if t["epochs"]],
            "facts": {"DAG runs": len(runs), "promotions": kinds.count("promote"),
                      "model hops": len(hops), "failed hops": sum(h.status != "ok" for h in hops),
                      "threads": sorted({h.threads for h in hops})},
            "started": kinds.count("start"), "epochs": sum(h.status == "ok" for h in hops) / options["shards"],
            "draws": [{"model": c["model"], "learning_rate": c["optimizer_params"]["learning_rate"],
                       "batch_size": c["batch_size"]} for c in configs]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=N, help="configurations to start in all")
    parser.add_argument("--r", type=int, default=R_MIN, metavar="r", help="passes over the data of the first rung")
    parser.add_argument("--R", type=int, default=R_MAX, metavar="R", help="passes over the data of the last rung")
    parser.add_argument("--eta", type=int, default=ETA, help="keep the best 1/eta at each rung")
    parser.add_argument("--shards", type=int, default=SHARDS, help="mop_airflow's one-slot shards: hops at once")
    parser.add_argument("--same-draws", action="store_true",
                        help="Ray Tune evaluates the configurations mop_airflow drew instead of its own draws")
    parser.add_argument("--reuse-actors", action="store_true", help="Ray Tune reuses its trial processes")
    parser.add_argument("--budget", type=int, default=None,
                        help="also run mop_airflow's ASHA with this budget (iterations in all) as its deadline")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds the mop_airflow search may take")
    parser.add_argument("--home", help="keep the runs here (default: a temporary folder, deleted)")
    parser.add_argument("--skip-ray", action="store_true", help="mop_airflow's side alone (a check that it runs)")
    parser.add_argument("--ray", help=argparse.SUPPRESS)
    parser.add_argument("--ray-options", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ray:
        print(json.dumps(ray_asha(args.ray, json.loads(Path(args.ray_options).read_text()))))
        return 0
    try:
        import ray  # noqa: F401, PLC0415
    except ImportError:
        if not args.skip_ray:
            print("Ray Tune is not installed: pip install -e '.[bench]' (or --skip-ray)")
            return 2

    options = {"n": args.n, "r": args.r, "R": args.R, "eta": args.eta, "shards": args.shards}
    home = Path(args.home or tempfile.mkdtemp(prefix="mop-asha-vs-ray-")).absolute()
    header("asha_vs_ray")
    print(f"ASHA n={args.n} r={args.r} R={args.R} eta={args.eta}; mop_airflow on {args.shards} one-slot shards, "
          f"Ray Tune {TRIALS_AT_ONCE} trials at a time{', reusing actors' if args.reuse_actors else ''}"
          f"{', on the configurations mop_airflow drew' if args.same_draws else ''}", flush=True)
    try:
        folder = example_data(home / "data")
        rows = []
        before = load()
        print(f"mop_airflow (load average {before})", flush=True)
        mop = mop_asha(home, folder, options, args.timeout)
        rows.append((f"mop_airflow ASHA, {args.shards} shards x 1 slot", mop["seconds"], mop["trials"], mop["started"],
                     mop["epochs"], before, load(), mop["facts"]))
        if args.budget:  # the same search with a deadline, in an Airflow of its own beside the first
            before = load()
            print(f"mop_airflow with budget={args.budget} (load average {before})", flush=True)
            budgeted = mop_asha(home / "budget", folder, {**options, "budget": args.budget}, args.timeout)
            extra = (f"mop_airflow ASHA, budget={args.budget}", budgeted["seconds"], budgeted["trials"],
                     budgeted["started"], budgeted["epochs"], before, load(), budgeted["facts"])

        if args.skip_ray:
            name, seconds, trials, started, epochs, *_ = rows[0]
            best = max((t for t in trials if t["val_accuracy"] is not None), key=lambda t: t["val_accuracy"])
            print(f"{name}: {seconds:.1f} s, best {best['val_accuracy']:.4f} ({best['config']}), started {started}, "
                  f"epochs {epochs:g}; {json.dumps(rows[0][-1])}")
            result("asha_vs_ray", {"mop_airflow": {"seconds": round(seconds, 1), "best": best["val_accuracy"],
                                                   "started": started, "epochs": epochs, **rows[0][-1]}})
            return 0
        ray_options = {**options, "reuse_actors": args.reuse_actors,
                       "points": mop["draws"] if args.same_draws else None}
        (home / "ray_options.json").write_text(json.dumps(ray_options))
        before = load()
        print(f"Ray Tune (load average {before})", flush=True)
        wall, out = timed_process(__file__, "--ray", folder, "--ray-options", str(home / "ray_options.json"))
        trials = out["trials"]
        errors = [t["error"] for t in trials if t["error"]]
        rows.append((f"Ray Tune ASHAScheduler, {TRIALS_AT_ONCE} trials at a time", wall,
                     [t for t in trials if t["epochs"]], len(trials), sum(t["epochs"] for t in trials), before, load(),
                     {"stopped early": sum(0 < t["epochs"] < args.R for t in trials), "errors": len(errors)}))
        if errors:
            print("Ray Tune trial errors:\n" + "\n".join(errors[:3]))

        print(f"\n{'side':<42} {'seconds':>8}  {'best':>7}  {'started':>7}  {'epochs':>6}  {'load average before / after':<34}"
              "best configuration (epochs)")
        for name, seconds, trials, started, epochs, before, after, facts in rows + ([extra] if args.budget else []):
            ranked = [t for t in trials if t["val_accuracy"] is not None]
            best = max(ranked, key=lambda t: t["val_accuracy"])
            print(f"{name:<42} {seconds:>8.1f}  {best['val_accuracy']:>7.4f}  {started:>7}  {epochs:>6g}  "
                  f"{before + ' / ' + after:<34}{best['config']} ({best['epochs']})  {json.dumps(facts)}")
        (_, mop_s, mop_trials, *_), (_, ray_s, ray_trials, *_) = rows
        mop_best = max(t["val_accuracy"] for t in mop_trials if t["val_accuracy"] is not None)
        ray_best = max(t["val_accuracy"] for t in ray_trials if t["val_accuracy"] is not None)
        print(f"\nmop_airflow / Ray Tune: wall time {mop_s / ray_s:.2f}x, best val_accuracy "
              f"{mop_best - ray_best:+.4f}; goal (the same or better accuracy in no more time): "
              f"{'met' if mop_s <= ray_s and mop_best >= ray_best else 'not met'}")
        result("asha_vs_ray", {"options": options, "same_draws": args.same_draws, "sides": {
            row[0]: {"seconds": round(row[1], 1), "started": row[3], "epochs": row[4], "load": f"{row[5]} / {row[6]}",
                     "best": max(t["val_accuracy"] for t in row[2] if t["val_accuracy"] is not None), **row[7]}
            for row in rows + ([extra] if args.budget else [])}})
    finally:
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
