"""Validating the input data with Great Expectations before anything is sharded or trained.

Every expectation runs (none stops the others) and every failure becomes one plain sentence in a
single :class:`~mop_airflow.errors.DataValidationError`, so one failed run shows everything to fix.
The Great Expectations context is ephemeral and in memory: validation writes nothing anywhere.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from typing import Any

from mop_airflow.data.table import holdout_rows, min_rows_for, parse_table, read_source_bytes
from mop_airflow.errors import DataValidationError
from mop_airflow.spec import DataSpec

# pandas dtypes a feature may have: every feature is cast to float32 for training. bool is left
# out on purpose: a bool column is more often a flag read with the wrong schema than a feature.
NUMERIC_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                  "float16", "float32", "float64")
_EXAMPLES = 5  # offending rows / values quoted per failure


def resolve_features(columns: list[str], features: tuple[str, ...] | str) -> list[str]:
    """The feature columns: a glob (fnmatch) keeps ``columns``' order; a tuple is taken as is.

    Pass ``columns`` without the label column, so that a glob such as ``"*"`` does not select it.
    """
    if not isinstance(features, str):
        return list(features)
    matched = [column for column in columns if fnmatch.fnmatchcase(column, features)]
    if not matched:
        raise DataValidationError(f"data.features={features!r}", [
            f"the glob {features!r} matches none of the columns ({_preview(columns)}); "
            "fix the pattern in data.features or list the feature columns by name"])
    return matched


def validate_source(data: DataSpec, *, shards: int, max_batch_size: int) -> dict:
    """Validate ``data.source`` (and a separate validation file) with Great Expectations.

    Each of the ``shards`` training shards must hold at least ``max_batch_size`` rows after the
    validation split. Raises :class:`DataValidationError` listing every failure; returns a summary.
    """
    source = _read(data.source, data.storage_options, data.conn_id)
    columns = list(source.column_names)
    failures: list[str] = []
    try:
        features = resolve_features([c for c in columns if c != data.label], data.features)
    except DataValidationError as exc:  # keep going: the label and row checks still say something
        failures.extend(exc.failures)
        features = []

    min_train_rows = shards * max_batch_size
    rows_rule = f"{shards} shard(s) x max_batch_size {max_batch_size} = {min_train_rows} training rows"
    rows_fix = "add rows, use fewer shards or a smaller maximum batch size"
    if isinstance(data.validation, str):
        batches = [_Batch("source", data.source, source, min_train_rows, rows_rule, rows_fix)]
        try:
            validation = _read(data.validation, data.storage_options, data.conn_id)
        except DataValidationError as exc:  # still report what is wrong with the source
            failures += [f"validation file {data.validation}: {f}" for f in exc.failures]
            validation_rows = 0
        else:
            batches.append(_Batch("validation", data.validation, validation, 1, "a validation set",
                                  "point data.validation at a non-empty file or use a fraction such as 0.2"))
            validation_rows = validation.num_rows
    else:
        rows_rule += f" after holding out {data.validation:g} of the rows for validation"
        batches = [_Batch("source", data.source, source, min_rows_for(min_train_rows, data.validation),
                          rows_rule, rows_fix)]
        validation_rows = holdout_rows(source.num_rows, data.validation)

    checks_run: list[str] = []
    for batch in batches:
        batch.plan(features, data.label, data.classes)
    for batch, check, result in _run_expectations(batches):
        if check.expectation not in checks_run:
            checks_run.append(check.expectation)
        if not result["success"]:
            failures.append(batch.describe(check, result, data))
    if failures:
        raise DataValidationError(data.source, failures)

    return {
        "rows": source.num_rows,
        "columns": columns,
        "features": features,
        "label": data.label,
        "class_counts": _class_counts(source, data.label, data.classes),
        "validation_rows": validation_rows,
        "checks": checks_run,
    }


@dataclass(frozen=True)
class _Check:
    expectation: str  # Great Expectations' snake_case name, e.g. expect_column_to_exist
    rule: str         # our name for the rule; picks the failure sentence
    column: str | None
    kwargs: dict = field(default_factory=dict)


@dataclass
class _Batch:
    """One file to validate and the expectations planned for it."""

    role: str  # "source" or "validation"
    uri: str
    table: Any  # pyarrow.Table
    min_rows: int
    rows_rule: str  # why it needs min_rows
    rows_fix: str
    checks: list[_Check] = field(default_factory=list)

    def plan(self, features: list[str], label: str, classes: tuple) -> None:
        present = set(self.table.column_names)
        for column in [*features, label]:
            self.checks.append(_Check("expect_column_to_exist", "exists", column))
        # Column checks only on present columns: a missing column is already one failure above.
        for column in (c for c in features if c in present):
            self.checks += [
                _Check("expect_column_values_to_be_in_type_list", "numeric", column,
                       {"type_list": list(NUMERIC_DTYPES)}),
                _Check("expect_column_values_to_not_be_null", "feature_not_null", column),
                _Check("expect_column_values_to_not_be_in_set", "finite", column,
                       {"value_set": [float("inf"), float("-inf")]}),
            ]
        if label in present:
            self.checks += [
                _Check("expect_column_values_to_not_be_null", "label_not_null", label),
                _Check("expect_column_values_to_be_in_set", "in_classes", label, {"value_set": list(classes)}),
            ]
        self.checks.append(_Check("expect_table_row_count_to_be_between", "rows", None,
                                  {"min_value": self.min_rows}))

    def describe(self, check: _Check, result: dict, data: DataSpec) -> str:
        """One sentence: which column, which rule, what was found, how to fix it."""
        where = "" if self.role == "source" else f"validation file {self.uri}: "
        column = check.column
        if "exception" in result:
            target = f" on column {column!r}" if column else ""
            return (f"{where}check {check.expectation}{target} could not run ({result['exception']}); "
                    "this is a bug or an unsupported column type: report it with the column's type")
        if check.rule == "exists":
            close = difflib.get_close_matches(column, self.table.column_names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            what = "data.label" if column == data.label else "data.features"
            return (f"{where}column {column!r} is missing{hint}; the file has {_preview(self.table.column_names)}; "
                    f"add the column or fix {what}")
        if check.rule == "numeric":
            arrow_type = self.table.schema.field(column).type
            return (f"{where}column {column!r}: type {arrow_type} is not numeric (features must be integers or "
                    "floats); convert the column to numbers or remove it from data.features")
        if check.rule == "rows":
            subject = "the file" if self.role == "source" else f"validation file {self.uri}"
            return (f"{subject} has {result['observed_value']} row(s) but needs at least {self.min_rows} "
                    f"({self.rows_rule}); {self.rows_fix}")
        count = result["unexpected_count"]
        rows = _rows(result)
        if check.rule == "feature_not_null":
            return f"{where}column {column!r}: {_values(count)} null or NaN ({rows}); remove or impute them"
        if check.rule == "finite":
            return (f"{where}column {column!r}: {_values(count)} +/-inf ({rows}); "
                    "remove these rows or clip the values to a finite range")
        if check.rule == "label_not_null":
            return f"{where}label column {column!r}: {_values(count)} null ({rows}); label these rows or remove them"
        # in_classes
        found = sorted({repr(v) for v in result["partial_unexpected_list"]})
        return (f"{where}label column {column!r}: {_values(count)} not in data.classes {list(data.classes)} "
                f"({rows}; values {', '.join(found)}); add the missing classes to data.classes, drop these rows, "
                "or fix the type of data.classes to match the column")


def _run_expectations(batches: list[_Batch]):
    """Yield (batch, check, result) for every planned check, in plan order."""
    import great_expectations as gx  # noqa: PLC0415 - ~3 s to import; only tasks that validate pay it
    import great_expectations.expectations as gxe  # noqa: PLC0415
    from great_expectations.data_context.types.base import (  # noqa: PLC0415
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    # The default ephemeral config reserves a temporary docs-site folder; ours keeps everything in
    # memory, prints no progress bars into task logs and sends no analytics.
    context = gx.get_context(mode="ephemeral", project_config=DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        progress_bars=ProgressBarsConfig(globally=False),
        analytics_enabled=False,
    ))
    data_source = context.data_sources.add_pandas("mop_airflow")
    for batch in batches:
        asset = data_source.add_dataframe_asset(batch.role)
        gx_batch = asset.add_batch_definition_whole_dataframe("all").get_batch(
            batch_parameters={"dataframe": batch.table.to_pandas()})
        suite = gx.ExpectationSuite(name=f"mop_airflow_{batch.role}")
        for index, check in enumerate(batch.checks):
            expectation_class = getattr(gxe, _class_name(check.expectation))
            column = {} if check.column is None else {"column": check.column}
            suite.add_expectation(expectation_class(**column, **check.kwargs, meta={"check": index}))
        outcome = gx_batch.validate(suite, result_format={"result_format": "SUMMARY",
                                                          "partial_unexpected_count": _EXAMPLES})
        by_index = {r.expectation_config.meta["check"]: r for r in outcome.results}
        for index, check in enumerate(batch.checks):
            yield batch, check, _as_dict(by_index[index])


def _as_dict(result: Any) -> dict:
    info = result.exception_info or {}
    out = {"success": bool(result.success), **dict(result.result or {})}
    if info.get("raised_exception"):
        out["success"] = False
        out["exception"] = info.get("exception_message")
    return out


def _class_name(expectation: str) -> str:
    return "".join(part.capitalize() for part in expectation.split("_"))


def _read(uri: str, storage_options: Any, conn_id: str | None = None):
    try:
        return parse_table(read_source_bytes(uri, storage_options, conn_id), uri)
    except Exception as exc:  # noqa: BLE001 - any read or parse failure is reported as a data problem
        raise DataValidationError(uri, [
            f"the file cannot be read ({type(exc).__name__}: {exc}); check the path, data.storage_options "
            "and that the file is valid Parquet or CSV matching its extension"]) from exc


def _class_counts(table: Any, label: str, classes: tuple) -> dict[str, int]:
    import pyarrow.compute as pc  # noqa: PLC0415

    counts = {entry["values"].as_py(): entry["counts"].as_py() for entry in pc.value_counts(table[label])}
    return {str(c): int(counts.get(c, 0)) for c in classes}


def _values(count: int) -> str:
    return f"{count} value is" if count == 1 else f"{count} values are"


def _rows(result: dict) -> str:
    rows = [str(i) for i in result.get("partial_unexpected_index_list") or []]
    more = ", ..." if result["unexpected_count"] > len(rows) else ""
    label = "row" if result["unexpected_count"] == 1 else "rows"
    return f"{label} {', '.join(rows)}{more}, counted from 0"


def _preview(columns: list[str], limit: int = 12) -> str:
    shown = ", ".join(repr(c) for c in columns[:limit])
    return f"columns {shown}" + (f", ... ({len(columns)} in all)" if len(columns) > limit else "")
