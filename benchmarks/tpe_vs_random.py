"""Does TPE help? Random search against TPE at the same budget, and ASHA with and without TPE, over
several seeds, on MNIST-1D.

The same MNIST-1D data (16,000 training rows, the 4,000-row test split for validation) and the
adaptive examples' random space (``mnist1d_random_space(seed)``: an MLP or a 1-D CNN of
``mop_airflow.examples.mnist1d_models``, Adam, a log-uniform learning rate in [1e-3, 3e-2], batch
size 32, 64 or 128), with the space's seed the benchmark's seed. Four methods per seed:

  random     ``--n`` configurations drawn up front, each trained ``--epochs`` passes over the data;
  tpe        the same budget with ``"sampler": "tpe"``: the first ``--startup`` drawn at random, every
             later one proposed by Optuna's TPE from the results so far;
  asha       ASHA with ``--asha-n --r --R --eta`` on the random draw;
  asha+tpe   the same ASHA whose configurations after the first ``--startup`` are TPE's proposals.

No Airflow here: the loop drives the very decision modules the DAG uses between its blocks
(``mop_airflow.planning.blocks``). A random or TPE search runs as the one-rung ASHA the DAG runs it
as (``mop_airflow.search.adaptive.effective_adaptive``: r = R = the passes), so all four are
``mop_airflow.search.asha.next_jobs`` over ``mop_airflow.search.space.SearchSpace``'s seeded draw,
with ``propose=`` TPE's proposer (``mop_airflow.search.tpe.proposer``, rebuilt from the records at
every decision and seeded by the space's seed and the decision's number) for the TPE methods. At
most ``--capacity`` configurations are in flight: whenever one completes its job, its completion is
fed back (in the order the jobs completed) and the freed capacity is handed out, a promotion or a
start, a TPE proposal made only then, as the DAG's ``decide`` step does. The order of completions is
the wall clock's, so two runs of one seed may decide differently when two jobs end close together.

Each job trains with plain Keras in one of ``--capacity`` worker processes (one TensorFlow
intra-op thread each, so two jobs train at once on two cores): build, compile (Adam), ``model.fit``
the job's passes, evaluate on the validation split. A promoted ASHA configuration resumes, it is not
retrained: the driver keeps every paused configuration's weights and Adam state in memory (as
mop_airflow's checkpoint does) and the worker that trains its next rung restores them into a fresh
build. Initial weights and batch order are seeded per configuration (``config_seed``, as a hop's).
"best" is the highest validation accuracy a configuration ended with (for ASHA: at the rung where
it stopped); "epochs" the passes over the training data trained in all; "seconds" the search's wall
time (the workers started, TensorFlow imported and the data loaded before the first search).

    python benchmarks/tpe_vs_random.py [--seeds 0 1 2] [--n 12] [--epochs 3] [--startup 4]
                                       [--asha-n 12] [--r 1] [--R 9] [--eta 3] [--capacity 2]
                                       [--methods random tpe asha asha+tpe] [--home DIR]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.demo_grid import label, load_data  # noqa: E402
from benchmarks.harness import example_data, header, load, one_thread, result  # noqa: E402

METHODS = ("random", "tpe", "asha", "asha+tpe")
SEEDS = (0, 1, 2)
N, EPOCHS, STARTUP = 12, 3, 4
ASHA_N, R_MIN, R_MAX, ETA = 12, 1, 9, 3
CAPACITY = 2


# -- a worker: plain Keras, one thread ------------------------------------------------------------

_DATA = None


def _worker_start(folder: str) -> None:
    global _DATA
    one_thread()
    _DATA = load_data(folder)


def _warm(seconds: float) -> None:
    """Keras imported and the data loaded in every worker before anything is timed."""
    import keras  # noqa: F401, PLC0415

    time.sleep(seconds)


def _train(config: dict, seed: int, state: dict | None, epochs: int) -> dict:
    """Train ``config`` ``epochs`` more passes, from ``state`` (weights and Adam variables) or from
    scratch; evaluate on the validation split. Returns the accuracy and the state to resume from."""
    import keras  # noqa: PLC0415

    from mop_airflow.training.builder import load_builder  # noqa: PLC0415

    if config["optimizer"] != "adam":
        raise ValueError(f"the benchmark trains with Adam, the configuration says {config['optimizer']!r}")
    (x, y), (xv, yv) = _DATA
    began = time.perf_counter()
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    model = load_builder(config["model"])({**config.get("hparams", {}), "input_dim": x.shape[1], "num_classes": 10})
    model.compile(optimizer=keras.optimizers.Adam(config["optimizer_params"]["learning_rate"]),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    done = 0
    if state is not None:
        model.optimizer.build(model.trainable_variables)
        model.set_weights(state["weights"])
        for variable, value in zip(model.optimizer.variables, state["optimizer"]):
            variable.assign(value)
        done = state["epochs"]
        keras.utils.set_random_seed(seed + done)  # the next passes' batch order, not the first ones' again
    model.fit(x, y, batch_size=config["batch_size"], epochs=epochs, shuffle=True, verbose=0)
    accuracy = float(model.evaluate(xv, yv, batch_size=256, verbose=0, return_dict=True)["accuracy"])
    return {"accuracy": accuracy, "seconds": time.perf_counter() - began,
            "state": {"weights": model.get_weights(), "optimizer": [v.numpy() for v in model.optimizer.variables],
                      "epochs": done + epochs}}


# -- the search loop: the DAG's decisions, jobs trained by the workers ---------------------------

def search(method: str, seed: int, pool: ProcessPoolExecutor, args: argparse.Namespace) -> dict:
    from mop_airflow.examples.mnist1d_spec import mnist1d_random_space  # noqa: PLC0415
    from mop_airflow.planning.schedule import config_seed  # noqa: PLC0415
    from mop_airflow.search.asha import asha_plan, next_jobs  # noqa: PLC0415
    from mop_airflow.search.jobs import Completion  # noqa: PLC0415
    from mop_airflow.search.space import SearchSpace, config_id  # noqa: PLC0415

    tpe, asha = method.endswith("tpe"), method.startswith("asha")
    plan = (asha_plan({"n": args.asha_n, "r": args.r, "R": args.R, "eta": args.eta}) if asha
            else asha_plan({"n": args.n, "r": args.epochs, "R": args.epochs}))  # one rung, as the DAG runs it
    space_dict = {**mnist1d_random_space(seed=seed), "num_samples": plan.n}
    if tpe:
        space_dict.update(sampler="tpe", startup=args.startup)
    space = SearchSpace.from_dict(space_dict)
    draw = space.expand(1, count=min(plan.n, args.startup) if tpe else plan.n)
    configs = {c["config_id"]: c for c in draw}
    candidates = list(configs)
    completions: list = []
    promoted: list[tuple[str, int]] = []
    started: list[str] = []
    states: dict[str, dict] = {}
    last: dict[str, tuple[float, int]] = {}  # config_id -> (accuracy, epochs) of its latest job
    running: dict = {}
    decisions = proposals = epochs_trained = 0
    failures: list[str] = []
    began = time.perf_counter()
    while True:
        free = args.capacity - len(running)
        if free:
            made: list[dict] = []
            propose = None
            if tpe:
                ask = None
                block = decisions

                def propose() -> str:
                    nonlocal ask
                    if ask is None:  # built from the records on the first proposal of this decision
                        from mop_airflow.search.tpe import proposer  # noqa: PLC0415

                        count = len(configs)
                        ask = proposer(space, list(configs.values()), completions,
                                       sorted(job.config_id for job, _ in running.values()), top_rung=plan.top,
                                       direction="max", block=block, default_epochs_per_hop=1,
                                       new_id=lambda c: config_id(count + len(made), c))
                    config = ask()
                    made.append(config)
                    return config["config_id"]
            jobs = next_jobs(plan, completions, promoted, started, candidates, free, direction="max", propose=propose)
            decisions += 1
            proposals += len(made)
            configs.update((c["config_id"], c) for c in made)
            for job in jobs:
                if job.kind == "promote":
                    promoted.append((job.config_id, job.rung - 1))
                else:
                    started.append(job.config_id)
                state = states.pop(job.config_id, None)
                epochs = job.iterations - (state["epochs"] if state else 0)
                future = pool.submit(_train, configs[job.config_id], config_seed(seed, job.config_id), state, epochs)
                running[future] = (job, epochs)
        if not running:
            break
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in sorted(finished, key=lambda f: running[f][0].config_id):
            job, epochs = running.pop(future)
            try:
                out = future.result()
            except Exception as exc:  # noqa: BLE001 - recorded as the DAG records a failed hop
                failures.append(f"{job.config_id}: {type(exc).__name__}: {exc}")
                completions.append(Completion(job.config_id, job.rung, None, "failed", str(exc)))
                continue
            epochs_trained += epochs
            states[job.config_id] = out["state"]
            accuracy = out["accuracy"]
            finite = math.isfinite(accuracy)
            last[job.config_id] = (accuracy, out["state"]["epochs"])
            completions.append(Completion(job.config_id, job.rung, accuracy if finite else None,
                                          "ok" if finite else "diverged"))
    seconds = time.perf_counter() - began
    ranked = sorted(last.items(), key=lambda item: -item[1][0])
    best_id, (best, best_epochs) = ranked[0] if ranked else ("-", (math.nan, 0))
    config = configs.get(best_id)
    return {"method": method, "seed": seed, "best": best, "seconds": seconds, "started": len(started),
            "promotions": len(promoted), "proposed": proposals, "epochs": epochs_trained, "decisions": decisions,
            "failures": failures,
            "config": "-" if config is None else label({"model": config["model"], "batch_size": config["batch_size"],
                                                        "learning_rate": config["optimizer_params"]["learning_rate"]}),
            "config_epochs": best_epochs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="the space's (and TPE's) seeds")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--n", type=int, default=N, help="random and TPE: configurations in all")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="random and TPE: passes over the data each")
    parser.add_argument("--startup", type=int, default=STARTUP, help="TPE: configurations drawn at random first")
    parser.add_argument("--asha-n", type=int, default=ASHA_N, help="ASHA: configurations to start in all")
    parser.add_argument("--r", type=int, default=R_MIN, metavar="r", help="ASHA: passes of the first rung")
    parser.add_argument("--R", type=int, default=R_MAX, metavar="R", help="ASHA: passes of the last rung")
    parser.add_argument("--eta", type=int, default=ETA, help="ASHA: keep the best 1/eta at each rung")
    parser.add_argument("--capacity", type=int, default=CAPACITY, help="configurations in flight (worker processes)")
    parser.add_argument("--home", help="keep the data here (default: a temporary folder, deleted)")
    args = parser.parse_args(argv)

    from mop_airflow.search.asha import asha_plan  # noqa: PLC0415

    asha = asha_plan({"n": args.asha_n, "r": args.r, "R": args.R, "eta": args.eta})
    home = Path(args.home or tempfile.mkdtemp(prefix="mop-tpe-vs-random-")).absolute()
    header("tpe_vs_random")
    print(f"budget per seed: random and TPE {args.n} configurations x {args.epochs} epochs = {args.n * args.epochs} "
          f"epochs each (TPE: {args.startup} drawn at random, then proposed); ASHA n={args.asha_n} r={args.r} "
          f"R={args.R} eta={args.eta} (rungs {list(asha.rungs)}, ~{asha.halving_iterations()} epochs if every rung "
          f"promoted 1/eta), with and without TPE ({args.startup} drawn at random); {args.capacity} configurations "
          f"in flight, one TensorFlow thread each; seeds {args.seeds}", flush=True)
    try:
        folder = example_data(home / "data")
        results = []
        print(f"\n{'method':<9} {'seed':>4}  {'best':>7}  {'started':>7}  {'proposed':>8}  {'promoted':>8}  "
              f"{'epochs':>6}  {'seconds':>7}  {'load average':<16}best configuration (epochs)", flush=True)
        with ProcessPoolExecutor(max_workers=args.capacity, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_start, initargs=(folder,)) as pool:
            for future in [pool.submit(_warm, 2.0) for _ in range(args.capacity)]:
                future.result()
            for seed in args.seeds:
                for method in args.methods:
                    r = search(method, seed, pool, args)
                    results.append(r)
                    print(f"{method:<9} {seed:>4}  {r['best']:>7.4f}  {r['started']:>7}  {r['proposed']:>8}  "
                          f"{r['promotions']:>8}  {r['epochs']:>6}  {r['seconds']:>7.1f}  {load():<16}"
                          f"{r['config']} ({r['config_epochs']})", flush=True)
                    for failure in r["failures"][:3]:
                        print(f"  failed: {failure}", flush=True)

        print(f"\n{'method':<9}  {'best val_accuracy, mean ± sd (min .. max)':<42}  {'epochs (mean)':>13}  "
              f"{'seconds (mean)':>14}  per seed")
        by_method = {m: [r for r in results if r["method"] == m] for m in args.methods}
        for method, rows in by_method.items():
            values = [r["best"] for r in rows]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            print(f"{method:<9}  {f'{statistics.mean(values):.4f} ± {sd:.4f} ({min(values):.4f} .. {max(values):.4f})':<42}  "
                  f"{statistics.mean(r['epochs'] for r in rows):>13.1f}  "
                  f"{statistics.mean(r['seconds'] for r in rows):>14.1f}  "
                  + " ".join(f"{r['seed']}:{r['best']:.4f}" for r in rows))
        for with_tpe, without in (("tpe", "random"), ("asha+tpe", "asha")):
            if with_tpe in by_method and without in by_method:
                pairs = {r["seed"]: r["best"] for r in by_method[without]}
                diffs = [r["best"] - pairs[r["seed"]] for r in by_method[with_tpe] if r["seed"] in pairs]
                wins = sum(d > 0 for d in diffs)
                print(f"{with_tpe} - {without}: mean {statistics.mean(diffs):+.4f} "
                      f"({', '.join(f'{d:+.4f}' for d in diffs)}); better on {wins} of {len(diffs)} seeds")
        result("tpe_vs_random", {"seeds": args.seeds, "methods": {
            method: {"best": [r["best"] for r in rows], "epochs": [r["epochs"] for r in rows],
                     "seconds": [round(r["seconds"], 1) for r in rows]} for method, rows in by_method.items()}})
    finally:
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
