"""The commands that use a run's model: `mop-airflow predict`, `export-best` and `export-study`. They find
the run through Airflow, or in a store alone with ``--store`` (:mod:`mop_airflow.cli.runs`)."""

from __future__ import annotations

import argparse

from mop_airflow.cli import runs
from mop_airflow.cli.runs import FAILED, OK, UNAVAILABLE, USAGE, fail, run_options


def add_commands(sub: argparse._SubParsersAction, home: str) -> None:
    predict = sub.add_parser(
        "predict", help="score a Parquet/CSV source with a run's best model (or a configuration's last checkpoint)",
        description="Score rows with a run's model: the same feature columns, shapes and decoding as training "
                    "(the run's manifest says which), read and written in batches. With --store the run is "
                    "found in the store alone (no Airflow; without RUN_ID the DAG's latest reported run).")
    run_options(predict, home)
    predict.add_argument("--source", required=True, help="a Parquet or CSV file, folder, glob or s3:// prefix")
    predict.add_argument("--out", required=True, help="the Parquet file to write (a path or a URI)")
    predict.add_argument("--mode", choices=("response", "prob", "top_k"), default="response",
                         help="response: the class (or the value, for regression); prob: a column per class; "
                              "top_k: k rows per input row, with rank, class and prob (default response)")
    predict.add_argument("--k", type=int, default=3, help="classes per row for --mode top_k (default 3)")
    predict.add_argument("--config", help="score with this configuration's last checkpoint, not the best model")
    predict.add_argument("--champion", action="store_true",
                         help="score with the DAG's current champion (the run its registry names), not RUN_ID")
    predict.add_argument("--id", help="a source column to copy into the output beside row_id")
    predict.add_argument("--batch-rows", type=int, default=None, help="rows per batch (default: about 64 MB)")
    predict.set_defaults(func=cmd_predict)

    export = sub.add_parser(
        "export-best", help="copy a run's best model out for serving, with a model card (and a SavedModel)",
        description="Write best_model.keras and model_card.json (configuration, metrics, data fingerprint, "
                    "versions) to a folder; --format saved_model adds a TensorFlow SavedModel.")
    run_options(export, home)
    export.add_argument("--out", required=True, help="the folder to write to (a path or a URI)")
    export.add_argument("--format", choices=("keras", "saved_model"), default="keras",
                        help="keras: the .keras file and the model card; saved_model: a TensorFlow SavedModel "
                             "beside them, for TensorFlow Serving (default %(default)s)")
    export.add_argument("--champion", action="store_true",
                        help="export the DAG's current champion (the run its registry names), not RUN_ID")
    export.set_defaults(func=cmd_export_best)

    study = sub.add_parser(
        "export-study", help="write a reported run as an Optuna study (for optuna-dashboard and Optuna's plots)",
        description="Write the search's configurations as the trials of an Optuna study in a SQLite file: their "
                    "searched values, final metric, per-iteration validation metric and outcome. Open it with "
                    "optuna-dashboard (the dashboard extra).")
    run_options(study, home)
    study.add_argument("--out", required=True, help="the SQLite file to write (it must not exist yet)")
    study.set_defaults(func=cmd_export_study)


def _champion_layout(args: argparse.Namespace):
    """The folder of the run the selection's registry names as its current champion."""
    from mop_airflow.serving.predict import champion_layout  # noqa: PLC0415

    layout, entry = champion_layout(runs.store_of(args), runs.selection_of(args))
    print(f"champion of {runs.selection_of(args)}: version {entry['version']}, {entry['config_id']} of run "
          f"{entry['run_id']} ({entry['metric']}={entry['value']:.6g})")
    return layout


def _model_command(args: argparse.Namespace, work) -> int:
    """Run ``work(layout)`` with the exit codes of the module docstring."""
    from mop_airflow.errors import (AirflowApiError, DataValidationError, SpecError,  # noqa: PLC0415
                                    StoreError, TrainingError)

    if args.champion:
        for name, value in (("RUN_ID", args.run_id), ("--config", getattr(args, "config", None))):
            if value is not None:
                return fail(f"{name}={value!r}: cannot be combined with --champion, which already names the model "
                            "(the run the DAG's registry names as champion, its best model). Fix: pass either "
                            f"--champion or {name}", USAGE)
    try:
        return work(_champion_layout(args) if args.champion else runs.run_layout_of(args))
    except (AirflowApiError, StoreError) as exc:
        return fail(str(exc), UNAVAILABLE)
    except (SpecError, DataValidationError) as exc:
        return fail(str(exc), USAGE)
    except TrainingError as exc:
        return fail(str(exc), FAILED)


def cmd_predict(args: argparse.Namespace) -> int:
    from mop_airflow.serving.predict import predict  # noqa: PLC0415

    def work(layout) -> int:
        done = predict(layout, args.source, args.out, mode=args.mode, k=args.k, config_id=args.config,
                       id_column=args.id, batch_rows=args.batch_rows)
        print(f"{done['rows']} row(s) scored ({done['mode']}: {', '.join(done['columns'])}) with configuration "
              f"{done['config_id']} of {layout.dag_id} / {layout.run_id}\nwritten: {done['uri']}")
        return OK

    return _model_command(args, work)


def cmd_export_best(args: argparse.Namespace) -> int:
    from mop_airflow.serving.export import export_for_serving  # noqa: PLC0415

    def work(layout) -> int:
        written = export_for_serving(layout, args.out, fmt=args.format)
        print(f"best model of {layout.dag_id} / {layout.run_id} exported\n"
              + "\n".join(f"written: {uri}" for uri in written.values()))
        return OK

    return _model_command(args, work)


def cmd_export_study(args: argparse.Namespace) -> int:
    from mop_airflow.results.study import export_study  # noqa: PLC0415

    def work(layout) -> int:
        study = export_study(layout, args.out)
        print(f"{len(study.trials)} trial(s) of {layout.dag_id} / {layout.run_id} written to {args.out} as the "
              f"Optuna study {study.study_name!r}\nopen it with: optuna-dashboard sqlite:///{args.out}")
        return OK

    args.champion = False
    return _model_command(args, work)
