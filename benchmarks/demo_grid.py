"""The demo grid three ways, side by side in one run: mop_airflow's DAG, plain Keras, Ray Tune.

The same MNIST-1D data (16,000 training rows, the 4,000-row test split for validation), the same 8
configurations (MLP and 1-D CNN x learning rates 3e-3, 1e-2 x batch sizes 32, 128, Adam) and the
same 3 passes over the training data, so the best accuracies are comparable:

  mop_airflow   the example DAG ``dags/mop_mnist1d.py`` on the embedded Airflow (SQLite,
                LocalExecutor, 4 one-slot shard pools, a train task per shard slot): trigger to
                success of the DAG run, its train task instances, model hops and reused models;
  plain Keras   one process that trains the 8 configurations one after another (``model.fit``,
                3 epochs, Keras's shuffling): its wall time, TensorFlow's import included;
  Ray Tune      ``tune.Tuner`` with two trials at a time (one CPU each), when ``ray[tune]`` is
                installed (``pip install -e '.[bench]'``): its process wall time.

Every TensorFlow process uses one intra-op thread (as mop_airflow's train tasks do on the embedded
Airflow of a 2-core machine), so no side is slowed by oversubscribed cores.

    python benchmarks/demo_grid.py [--skip-ray] [--runs N] [--home DIR] [--airflow-env K=V]

``--runs N`` triggers the DAG N times, one after another on one embedded Airflow (Airflow's start is
not in a run's time), then runs plain Keras (and Ray Tune) N times, and prints each side's median and
range; every run of a side must rank the same best.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import (REPO, embedded_airflow, example_data, header, one_thread, result,  # noqa: E402
                                run_seconds, spread, summary, timed_process)

MODELS = ("mop_airflow.examples.mnist1d_models:mlp", "mop_airflow.examples.mnist1d_models:cnn")
RATES = (3e-3, 1e-2)
BATCHES = (32, 128)
EPOCHS = 3
DAG_ID = "mop_mnist1d"


def grid() -> list[dict]:
    return [{"model": m, "learning_rate": lr, "batch_size": b} for m in MODELS for lr in RATES for b in BATCHES]


def label(config: dict) -> str:
    return f"{config['model'].rsplit(':', 1)[1]} / adam / {config['learning_rate']:g} / {config['batch_size']}"


# -- the sides that run in their own process ---------------------------------------------------

def load_data(folder: str):
    """MNIST-1D's training and test splits as written by ``write_mnist1d``: ((x, y), (x_val, y_val))."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    from mop_airflow.examples.mnist1d_spec import TEST_FILE, TRAIN_FILE  # noqa: PLC0415

    def load(name):
        table = pq.read_table(os.path.join(folder, name)).to_pandas()
        x = table[[c for c in table.columns if c.startswith("x")]].to_numpy("float32")
        return x, table["label"].to_numpy("int64")

    return load(TRAIN_FILE), load(TEST_FILE)


def train_one(config: dict, data, *, epochs: int = EPOCHS, report: Callable[[float], None] | None = None) -> float:
    """One configuration as a Keras user would train it: build, compile, fit ``epochs`` epochs, evaluate.
    With ``report``, one epoch at a time, each followed by an evaluation passed to ``report`` (what a
    tuner's early stopping needs)."""
    import keras  # noqa: PLC0415

    from mop_airflow.training.builder import load_builder  # noqa: PLC0415

    (x, y), (xv, yv) = data
    keras.utils.set_random_seed(42)
    model = load_builder(config["model"])({"input_dim": x.shape[1], "num_classes": 10})
    model.compile(optimizer=keras.optimizers.Adam(config["learning_rate"]), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])

    def evaluate() -> float:
        return float(model.evaluate(xv, yv, batch_size=256, verbose=0, return_dict=True)["accuracy"])

    if report is None:
        model.fit(x, y, batch_size=config["batch_size"], epochs=epochs, shuffle=True, verbose=0)
        return evaluate()
    accuracy = math.nan
    for _ in range(epochs):
        model.fit(x, y, batch_size=config["batch_size"], epochs=1, shuffle=True, verbose=0)
        accuracy = evaluate()
        report(accuracy)
    return accuracy


def plain_keras(folder: str) -> dict:
    one_thread()
    data = load_data(folder)
    return {label(c): train_one(c, data) for c in grid()}


def ray_tune(folder: str) -> dict:
    import ray  # noqa: PLC0415
    from ray import tune  # noqa: PLC0415

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    def trainable(config):
        one_thread()
        return {"accuracy": train_one(config, load_data(folder))}

    space = {"model": tune.grid_search(list(MODELS)), "learning_rate": tune.grid_search(list(RATES)),
             "batch_size": tune.grid_search(list(BATCHES))}
    tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}), param_space=space,
                       tune_config=tune.TuneConfig(max_concurrent_trials=2),
                       run_config=tune.RunConfig(storage_path=os.path.join(folder, "ray_results"), verbose=0))
    results = tuner.fit()
    return {label(r.config): float(r.metrics["accuracy"]) for r in results}


# -- mop_airflow -----------------------------------------------------------------------------------

def mop_runs(home: Path, airflow_env: dict, runs: int = 1) -> list[tuple[float, dict, dict]]:
    """The example DAG's runs as ``mop-airflow demo`` triggers it, ``runs`` of them one after another on
    one embedded Airflow: each run's seconds, leaderboard and facts."""
    from mop_airflow.store import Store  # noqa: PLC0415

    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dags" / "mop_mnist1d.py", dags / "mop_mnist1d.py")
    store = Store("file://" + str(home / "store"))
    done = []
    with embedded_airflow(home, dags, env=airflow_env, pools_for=DAG_ID) as af:
        for _ in range(runs):
            run_id = af.trigger(DAG_ID, conf={})
            state = af.wait_for_run(DAG_ID, run_id, timeout=1800)
            if state != "success":
                raise RuntimeError(f"the DAG run {run_id} ended {state}")
            # the train task instances that ran: one per shard slot
            tasks = [ti for ti in af.task_instances(DAG_ID, run_id)
                     if ti["task_id"].startswith("train_shard_") and ti["state"] != "skipped"]
            done.append((run_seconds(af, DAG_ID, run_id), run_id, len(tasks)))
    return [(seconds, *_board_and_facts(store, run_id, tasks)) for seconds, run_id, tasks in done]


def _board_and_facts(store, run_id: str, tasks: int) -> tuple[dict, dict]:
    from mop_airflow.records.layout import RunLayout  # noqa: PLC0415
    from mop_airflow.records import HopRecord  # noqa: PLC0415

    layout = RunLayout(store, DAG_ID, run_id)
    board = store.read_json(layout.report_uri("leaderboard.json"))
    names = {c["config_id"]: label({"model": c["model"], "batch_size": c["batch_size"],
                                    "learning_rate": c["optimizer_params"]["learning_rate"]})
             for c in store.read_json(layout.run_record_uri)["configs"]}
    hops = [HopRecord.from_dict(store.read_json(u)) for u in store.glob(f"{layout.run_uri}/hops/*/*.json")]
    return ({names[row["config_id"]]: row.get("val_accuracy") for row in board["leaderboard"]},
            {"task instances": tasks, "model hops": len(hops), "models reused": sum(h.model_reused for h in hops),
             "threads": sorted({h.threads for h in hops})})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--airflow-env", action="append", default=[], metavar="KEY=VALUE",
                        help="override the embedded Airflow's environment, e.g. to measure a setting's effect")
    parser.add_argument("--runs", type=int, default=1, help="each side this many times: median and range")
    parser.add_argument("--home", help="keep the runs here (default: a temporary folder, deleted)")
    parser.add_argument("--plain", help=argparse.SUPPRESS)
    parser.add_argument("--ray", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain or args.ray:
        print(json.dumps(plain_keras(args.plain) if args.plain else ray_tune(args.ray)))
        return 0

    home = Path(args.home or tempfile.mkdtemp(prefix="mop-demo-grid-")).absolute()
    header("demo_grid")
    try:
        folder = example_data(home / "data")
        dag_runs = mop_runs(home, dict(item.split("=", 1) for item in args.airflow_env), args.runs)
        rows = [("mop_airflow DAG run", *_side("mop_airflow DAG run", dag_runs))]
        plain = [(*timed_process(__file__, "--plain", folder), {}) for _ in range(args.runs)]
        rows.append(("plain Keras, sequential (process wall)", *_side("plain Keras", plain)))
        try:
            import ray  # noqa: F401, PLC0415
            have_ray = not args.skip_ray
        except ImportError:
            have_ray = False
        if have_ray:
            ray_runs = [(*timed_process(__file__, "--ray", folder), {}) for _ in range(args.runs)]
            rows.append(("Ray Tune, 2 trials at a time (process wall)", *_side("Ray Tune", ray_runs)))
        else:
            print("Ray Tune: left out (--skip-ray, or not installed: pip install -e '.[bench]')")
        seconds = f"seconds (median (range) of {args.runs})"
        print(f"\n{'side':<46} {seconds:>24}  {'best':>7}  best configuration")
        figures = {}
        for name, walls, board, facts in rows:
            best = max(board, key=board.get)
            print(f"{name:<46} {spread(walls):>24}  {board[best]:>7.4f}  {best}  {json.dumps(facts) if facts else ''}")
            figures[name] = {"seconds": [round(w, 1) for w in walls], **summary(walls), "best": board[best],
                             "best_config": best, **facts}
        result("demo_grid", {"airflow_env": args.airflow_env, "runs": args.runs, "sides": figures})
    finally:
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)
    return 0


def _side(name: str, runs: list[tuple[float, dict, dict]]) -> tuple[list[float], dict, dict]:
    """A side's runs as one row: their walls, the first run's leaderboard and facts. Every run must rank
    the same best: a side whose best moves between runs is not a side of one comparison."""
    bests = {max(board, key=board.get) for _, board, _ in runs}
    if len(bests) > 1:
        raise RuntimeError(f"{name}: the runs ranked different bests: {sorted(bests)}")
    return [wall for wall, _, _ in runs], runs[0][1], runs[0][2]


if __name__ == "__main__":
    sys.exit(main())
