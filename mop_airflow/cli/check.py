"""`mop-airflow check SPEC_OR_DAG_FILE`: what a DAG run would find wrong, and what it would train,
without Airflow running.

The file is a spec (``.json``, ``.yaml``/``.yml``; its folder on ``sys.path``, as a spec kept in the DAG
folder beside its builders) or a Python file. A Python file is imported as
Airflow's DAG processor imports a DAG file (its folder on ``sys.path``; Airflow installed, not
running); the specs it holds are those of the DAGs it built with ``build_mop_dag`` (one per DAG)
and ``MopTaskGroup`` (one per group, named ``<dag_id>.<group_id>``), else its module-level ``spec``
(a dict or a :class:`~mop_airflow.config.MopSpec`). For each spec, as the DAG's first tasks would:
the spec validated and the search space expanded (:func:`~mop_airflow.planning.resolve.resolve_run`,
every builder's module found), the data source read and validated in batches
(:func:`~mop_airflow.data.validate.validate_source`), then each distinct model built and compiled
for the data's inputs, a batch passed through it, saved and loaded back
(:func:`~mop_airflow.training.model_check.check_models`, as the DAG's check_models task), and one
training step of it on the first rows of the data (:func:`train_on_rows`); and what the run would train: its
configurations, shards, slots, blocks and tasks (:mod:`mop_airflow.planning.shape`).

Exit codes: 0 every spec passes; 1 a model cannot train; 2 a spec or the data is wrong, or the file
cannot be read.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from mop_airflow.cli.runs import FAILED, OK, USAGE, fail


def add_commands(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser(
        "check", help="check a spec or DAG file without Airflow: the spec, the data, every model; say what would run",
        description="Validate a spec (a JSON or YAML spec file, or the specs a DAG file's build_mop_dag and "
                    "MopTaskGroup calls use, else a Python file's module-level `spec`), expand its search space, "
                    "read and validate the data source, build and compile each distinct model for the data's "
                    "inputs, save and load it back, and print what a run would train: configurations, shards, "
                    "slots, blocks and tasks. No Airflow service is needed (a DAG file imports Airflow's SDK). "
                    "Exit 0 all good, 1 a model cannot train, 2 a spec, the data or the file is wrong.")
    check.add_argument("file", metavar="SPEC_OR_DAG_FILE",
                       help="a spec (.json, .yaml, .yml) or a Python DAG file (.py)")
    check.add_argument("--no-models", action="store_true",
                       help="validate the spec and the data only: build no model (no TensorFlow import)")
    check.set_defaults(func=cmd_check)


def load_specs(path: Path) -> dict[str, Any]:
    """{name: spec} of a spec file or a Python file (see the module docstring). Raises SpecError."""
    from mop_airflow.errors import SpecError  # noqa: PLC0415

    if not path.is_file():
        raise SpecError("SPEC_OR_DAG_FILE", str(path), "no such file", "give the path of a spec or a DAG file")
    suffix = path.suffix.lower()
    if suffix in (".json", ".yaml", ".yml"):
        import yaml  # noqa: PLC0415 - YAML is a superset of JSON: one reader for both

        try:
            spec = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise SpecError("SPEC_OR_DAG_FILE", str(path), f"is not valid {suffix[1:].upper()}: {exc}",
                            "fix the syntax at the line and column named") from None
        if not isinstance(spec, dict):
            raise SpecError("SPEC_OR_DAG_FILE", str(path), f"holds a {type(spec).__name__}, not a spec mapping",
                            "write the spec as a mapping with data, search and schedule") from None
        on_path(path.resolve().parent)  # a spec kept in the DAG folder finds the builders beside it, as its DAG does
        return {path.stem: spec}
    if suffix != ".py":
        raise SpecError("SPEC_OR_DAG_FILE", str(path), "is neither a spec (.json, .yaml, .yml) nor a Python file",
                        "give a spec file or the DAG file that builds the DAG")
    module = _import_file(path)
    specs = _dag_specs(vars(module))
    if not specs and "spec" in vars(module):
        spec = vars(module)["spec"]
        specs = {path.stem: spec.to_dict() if hasattr(spec, "to_dict") else spec}
    if not specs:
        raise SpecError("SPEC_OR_DAG_FILE", str(path), "builds no mop_airflow DAG or task group and has no "
                        "module-level `spec`", "call build_mop_dag(spec, ...) or MopTaskGroup(spec=...) in it, or "
                        "name the spec `spec`")
    return specs


def on_path(folder: Path) -> None:
    """``folder`` first on ``sys.path``, as Airflow puts the DAG folder on the path of every task."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def _import_file(path: Path) -> Any:
    """Import ``path`` as Airflow's DAG processor does: its folder first on ``sys.path`` (builders and helper
    modules beside the DAG file import), under a name of its own."""
    from mop_airflow.errors import SpecError  # noqa: PLC0415

    on_path(path.resolve().parent)
    name = f"mop_check_{path.stem}_{uuid.uuid4().hex[:8]}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 - the DAG file's own error, named as Airflow would show it
        raise SpecError("SPEC_OR_DAG_FILE", str(path), f"failed to import: {type(exc).__name__}: {exc}",
                        "fix the DAG file (Airflow would show this as an import error)") from None
    return module


def _dag_specs(namespace: dict[str, Any]) -> dict[str, Any]:
    """The spec of each mop_airflow selection in the DAGs of ``namespace``: carried by its preflight task."""
    specs: dict[str, Any] = {}
    for value in list(namespace.values()):
        tasks = getattr(value, "tasks", None)
        dag_id = getattr(value, "dag_id", None)
        if not isinstance(dag_id, str) or not isinstance(tasks, list):
            continue
        for task in tasks:
            if getattr(task, "task_type", "") == "MopPreflightOperator":
                group = task.task_id.rsplit(".", 1)[0] if "." in task.task_id else None
                specs[f"{dag_id}.{group}" if group else dag_id] = task.spec
    return specs


def check_spec(name: str, spec: Any, *, models: bool = True) -> int:
    """Check one spec and print what its run would train; the exit code."""
    from mop_airflow.data.inputs import InputSpec, input_shapes  # noqa: PLC0415
    from mop_airflow.data.validate import validate_source  # noqa: PLC0415
    from mop_airflow.planning.describe import describe_search  # noqa: PLC0415
    from mop_airflow.planning.resolve import resolve_run  # noqa: PLC0415
    from mop_airflow.planning.shape import dag_shape  # noqa: PLC0415
    from mop_airflow.planning.task_plan import plan_tasks  # noqa: PLC0415
    from mop_airflow.config import MopSpec  # noqa: PLC0415

    parsed = spec if isinstance(spec, MopSpec) else MopSpec.from_dict(spec)
    run = resolve_run(parsed, None, dag_id=name, run_id="check")
    shape = dag_shape(parsed, result="." in name)
    tasks = plan_tasks(shape).tasks
    print(f"{name}: spec valid; {describe_search(parsed, shape)}")
    print(f"  would train {len(run.configs)} configuration(s) ({len({c['model'] for c in run.configs})} builder(s)) on "
          f"{shape.shards} shard(s) x {shape.slots} slot(s), {shape.blocks} block(s) a DAG run, "
          f"{len(tasks)} task(s) a DAG run")
    summary = validate_source(run.data, shards=run.schedule.shards, max_batch_size=run.max_batch_size)
    print(f"  data valid: {summary['rows']} row(s) in {summary['files']} file(s), {summary['validation_rows']} for "
          f"validation; inputs {few(summary['features'])}; label {summary['label']} ({summary['task']}"
          + (f", {len(summary['classes'])} classes)" if summary["classes"] else ")"))
    if not models:
        return OK
    from mop_airflow.training.model_check import check_models  # noqa: PLC0415 - TensorFlow loads here

    inputs = [InputSpec.from_dict(d) for d in summary["inputs"]]
    found = check_models(run.configs, input_shapes=input_shapes(inputs), num_classes=len(summary["classes"]),
                         task=summary["task"], seed=run.schedule.seed)
    if found.failures:
        print_failures(found.failures, run.configs)
        fatal = found.fatal(run.configs, fail_fast=run.fail_fast)
        print(f"  {len(found.failures)} of {len(run.configs)} configuration(s) cannot train"
              + (f"; the run would fail before training: {fatal}" if fatal else
                 "; the run would mark them failed at their first hop"), file=sys.stderr)
        return FAILED
    stepped = train_on_rows(run, summary)
    if stepped:
        print_failures(stepped, run.configs)
        return FAILED
    print(f"  models: {found.built} distinct model(s) built and compiled, a step trained on {FEW_ROWS} rows of the "
          "data, saved and loaded back")
    return OK


def print_failures(failures: dict[str, str], configs: list[dict[str, Any]]) -> None:
    """A line for each reason: the configurations a builder fails for alike (a misspelt builder fails for
    every one of them) are named together, not each on a line of the same text."""
    by_reason: dict[str, list[str]] = {}
    for cid, reason in sorted(failures.items()):
        by_reason.setdefault(reason, []).append(cid)
    for reason, cids in by_reason.items():
        if len(cids) == 1:
            config = next(c for c in configs if c["config_id"] == cids[0])
            print(f"  {cids[0]} (model {config['model']}, hparams {json.dumps(config.get('hparams') or {})}) "
                  f"cannot train: {reason}", file=sys.stderr)
        else:
            print(f"  {len(cids)} configurations ({few(cids, 4, counted=False)}) cannot train: {reason}", file=sys.stderr)


FEW_ROWS = 8


def few(names: list[str], shown: int = 6, *, counted: bool = True) -> str:
    """Names for one line: all of a few, else the first and the last (and the count: 64 pixel columns)."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown - 1])}, ..., {names[-1]}" + (f" ({len(names)} in all)" if counted else "")


def train_on_rows(run: Any, summary: dict[str, Any], rows: int = FEW_ROWS) -> dict[str, str]:
    """One training step of each distinct model on the first ``rows`` rows of the source, as a hop's first
    step takes them (the inputs decoded, the label as the targets): what a zero batch cannot show, such as
    a loss that does not fit the labels. {config_id: why it cannot train} for every configuration of a
    model that fails."""
    import keras  # noqa: PLC0415

    from mop_airflow.data.cache import targets  # noqa: PLC0415
    from mop_airflow.data.inputs import InputSpec, input_columns, input_shapes, to_arrays  # noqa: PLC0415
    from mop_airflow.data.source import iter_batches, list_source, source_options  # noqa: PLC0415
    from mop_airflow.training.builder import build_model  # noqa: PLC0415
    from mop_airflow.training.model_check import distinct_models  # noqa: PLC0415

    data, task, classes = run.data, summary["task"], summary["classes"]
    inputs = [InputSpec.from_dict(d) for d in summary["inputs"]]
    options = source_options(data, None)
    listing = list_source(data.source, options, labels=data.labels)
    batch = next(iter_batches(listing, [*input_columns(inputs), data.label], batch_rows=rows, options=options))
    x = to_arrays(batch.table, inputs, where=data.source)
    y = targets(batch.table[data.label], data.label, classes, task, data.source)
    failures: dict[str, str] = {}
    for group in distinct_models(run.configs):
        config = group[0]
        keras.backend.clear_session()
        try:
            model = build_model(config, input_shapes=input_shapes(inputs), num_classes=len(classes),
                                seed=run.schedule.seed, task=task)
            model.fit(x, y, batch_size=len(y), epochs=1, verbose=0)
        except Exception as exc:  # noqa: BLE001 - whatever Keras raises, the run's first hop would raise too
            text = " ".join(str(exc).split())[:400]
            reason = (f"model builder {config['model']!r} with hparams {dict(config.get('hparams') or {})}: a "
                      f"training step on {len(y)} rows of {data.source} failed: {type(exc).__name__}: {text}. Fix: "
                      f"make the model's output and loss ({config.get('loss')!r}) fit the label {data.label!r} "
                      f"({task}{f', {len(classes)} classes as indices 0..{len(classes) - 1}' if classes else ''})")
            failures.update((c["config_id"], reason) for c in group)
    keras.backend.clear_session()
    return failures


def cmd_check(args: argparse.Namespace) -> int:
    from mop_airflow.errors import DataValidationError, SpecError  # noqa: PLC0415

    try:
        specs = load_specs(Path(args.file))
    except SpecError as exc:
        return fail(str(exc), USAGE)
    worst = OK
    for name, spec in specs.items():
        try:
            code = check_spec(name, spec, models=not args.no_models)
        except (SpecError, DataValidationError) as exc:
            print(f"mop-airflow: {name}: {exc}", file=sys.stderr)
            code = USAGE
        worst = max(worst, code)
    return worst
