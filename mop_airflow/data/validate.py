"""Validating the input data with Great Expectations before anything is sharded or trained.

Every expectation runs (none stops the others) and every failure becomes one plain sentence in a
single :class:`~mop_airflow.errors.DataValidationError`, so one failed run shows everything to fix.
The Great Expectations context is ephemeral and in memory: validation writes nothing anywhere.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping

from mop_airflow.data.expectations import EXAMPLES, Check, gx_context, suite, suspect, validate_batch
from mop_airflow.data.images import layout_problems, rows_named
from mop_airflow.data.inputs import InputSpec, Problem, decode_images, input_columns, resolve_inputs, tensor_values
from mop_airflow.data.source import iter_batches, list_source, rows_per_batch, source_options
from mop_airflow.data.table import MAX_FOUND_CLASSES, count_labels, holdout_rows, min_rows_for, sorted_labels
from mop_airflow.errors import DataValidationError
from mop_airflow.records import SourceListing
from mop_airflow.config import DataSpec

# pandas dtypes a feature may have: every feature is cast to float32 for training. bool is left
# out on purpose: a bool column is more often a flag read with the wrong schema than a feature.
NUMERIC_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                  "float16", "float32", "float64")


def validate_source(data: DataSpec, *, shards: int, max_batch_size: int,
                    options: Mapping[str, Any] | None = None) -> dict:
    """Validate ``data.source`` (and a separate validation source) with Great Expectations, in one process.

    The source is read one record batch of about ``data.batch_mb`` MB at a time, file by file, so
    memory does not grow with its size. Each of the ``shards`` training shards must hold at least
    ``max_batch_size`` rows after the validation split. Raises :class:`DataValidationError` listing
    every failure, merged over all batches; returns a summary with the classes found. (A DAG runs
    the same checks spread over its ``scatter`` tasks, one slice of files each, and merges them.)
    """
    options = source_options(data, options)  # what opens the source (a connection's keys, from the Airflow side)
    listing = list_source(data.source, options, labels=data.labels)
    held, held_failures = None, []
    if isinstance(data.validation, str):
        try:
            held = list_source(data.validation, options, role="data.validation",
                               labels=data.labels)
        except DataValidationError as exc:  # still report what is wrong with the source
            held_failures = [f"validation file {data.validation}: {f}" for f in exc.failures]
    checks = DataChecks.plan(data, listing, held, shards=shards, max_batch_size=max_batch_size,
                             failures=held_failures)
    for role in checks.roles:
        checker = checks.checker(role.role)
        if checker.columns:
            for batch in iter_batches(role.listing, checker.columns, batch_rows=rows_per_batch(role.listing, data.batch_mb),
                                      options=options):
                checker.observe(batch)
    return checks.conclude()


@dataclass
class DataChecks:
    """Every check planned for a source (and a separate validation source), and what they found.

    Planned from the listings alone, so each task that reads a slice of the files plans the same
    checks; per-batch findings are kept as a JSON state (:meth:`state`) that merges across slices
    (:meth:`absorb`) before :meth:`conclude` words every failure in one error.
    """

    data: DataSpec
    roles: list["_Role"]
    inputs: list[InputSpec]
    failures: list[str]  # found before any row is read: inputs that do not resolve, an unreadable source
    validation_rows: int

    @classmethod
    def plan(cls, data: DataSpec, listing: SourceListing, held: SourceListing | None, *, shards: int,
             max_batch_size: int, failures: list[str] | tuple[str, ...] = ()) -> "DataChecks":
        failures = list(failures)
        # An image folder's layout problems, found while listing, join the rows' findings.
        failures += layout_problems(listing, data.classes, "data.source")
        if held is not None:
            failures += layout_problems(held, data.classes, "data.validation")
        try:
            inputs = resolve_inputs(listing.columns, data.features, data.label)
        except DataValidationError as exc:  # keep going: the label and row checks still say something
            failures.extend(exc.failures)
            inputs = []
        min_train_rows = shards * max_batch_size
        rows_rule = f"{shards} shard(s) x max_batch_size {max_batch_size} = {min_train_rows} training rows"
        rows_fix = "add rows, use fewer shards or a smaller maximum batch size"
        roles: list[_Role] = []
        if isinstance(data.validation, str):
            roles.append(_Role("source", listing, min_train_rows, rows_rule, rows_fix))
            validation_rows = 0
            if held is not None:
                roles.append(_Role("validation", held, 1, "a validation set",
                                   "point data.validation at a non-empty file or use a fraction such as 0.2"))
                validation_rows = held.total_rows
        else:
            rows_rule += f" after holding out {data.validation:g} of the rows for validation"
            roles.append(_Role("source", listing, min_rows_for(min_train_rows, data.validation), rows_rule, rows_fix))
            validation_rows = holdout_rows(listing.total_rows, data.validation)
        for role in roles:
            role.plan(inputs, data)
        return cls(data, roles, inputs, failures, validation_rows)

    def role(self, name: str) -> "_Role":
        return next(role for role in self.roles if role.role == name)

    def checker(self, name: str) -> "_BatchChecker":
        """Runs the per-batch checks of role ``name`` ("source" or "validation") on batches of its files."""
        return _BatchChecker(self.role(name), self.inputs, self.data)

    @property
    def schema_ok(self) -> bool:
        """No failure is known from the listings alone (missing or non-numeric columns, too few rows...)."""
        return not self.failures and all(role.schema_result(check)["success"]
                                         for role in self.roles for check in role.checks if not check.per_batch)

    def state(self) -> dict[str, Any]:
        return {role.role: role.state() for role in self.roles}

    def absorb(self, state: dict[str, Any]) -> None:
        for role in self.roles:
            if role.role in state:
                role.absorb(state[role.role])

    def conclude(self) -> dict:
        """The summary, or :class:`DataValidationError` listing every failure found."""
        data = self.data
        failures = list(self.failures)
        checks_run: list[str] = []
        for role in self.roles:
            for check in role.checks:
                if check.expectation not in checks_run:
                    checks_run.append(check.expectation)
                result = role.result(check)
                if result is not None and not result["success"]:
                    failures.append(role.describe(check, result, data))
        for role in self.roles:
            failures += role.tensor_failures()
        classes = list(data.classes)
        # a label column that is missing was named above: no "0 distinct values" beside it
        if data.task == "classification" and not classes and data.label in self.roles[0].listing.columns:
            classes, found_failures = _found_classes(self.roles, data.label)
            failures += found_failures
        if failures:
            raise DataValidationError(data.source, failures)
        source = self.roles[0]
        return {
            "rows": source.listing.total_rows,
            "files": len(source.listing.files),
            "bytes": source.listing.total_bytes,
            "columns": source.listing.columns,
            "features": input_columns(self.inputs),
            "inputs": [spec.to_dict() for spec in self.inputs],
            "label": data.label,
            "task": data.task,
            "classes": classes,
            "class_counts": {str(c): int(source.label_counts.get(c, 0)) for c in classes},
            "validation_rows": self.validation_rows,
            "batches": sum(role.batches for role in self.roles),
            "checks": checks_run,
        }


def _found_classes(roles: list["_Role"], label: str) -> tuple[list, list[str]]:
    """The training labels, sorted, when ``data.classes`` was left out; validation labels must be among them."""
    source = roles[0]
    found = sorted_labels(source.label_counts)
    failures = []
    if len(found) > MAX_FOUND_CLASSES:
        failures.append(f"label column {label!r} has more than {MAX_FOUND_CLASSES} distinct values; "
                        "if it is a numeric target set data.task to 'regression', else declare data.classes")
    elif len(found) < 2:
        failures.append(f"label column {label!r} holds {len(found)} distinct value(s) {found}; classification needs "
                        "at least two classes: add rows of the other classes or declare data.classes")
    for role in roles[1:]:
        unknown = sorted(set(role.label_counts) - set(found), key=str)
        if unknown:
            count = sum(role.label_counts[v] for v in unknown)
            failures.append(f"validation file {role.listing.uri}: label column {label!r}: {_values(count)} not among "
                            f"the training labels {found[:20]} (values {', '.join(map(repr, unknown[:5]))}); the "
                            "model cannot predict a class it never trained on: declare data.classes or fix the rows")
    return found, failures


@dataclass
class _Role:
    """One source to validate (training or validation), the checks planned for it and what they found."""

    role: str  # "source" or "validation"
    listing: SourceListing
    min_rows: int
    rows_rule: str  # why it needs min_rows
    rows_fix: str
    checks: list[Check] = field(default_factory=list)
    tensor_inputs: list[InputSpec] = field(default_factory=list)
    tensor_problems: dict = field(default_factory=dict)  # (column, rule) -> [count, examples, first Problem]
    label_counts: dict = field(default_factory=dict)
    batches: int = 0
    totals: dict = field(default_factory=dict)  # index in checks -> merged result over batches

    @property
    def uri(self) -> str:
        return self.listing.uri

    def plan(self, inputs: list[InputSpec], data: DataSpec) -> None:
        present = set(self.listing.columns)
        scalars = [c for spec in inputs if spec.kind == "columns" for c in spec.columns]
        tensors = [spec for spec in inputs if spec.kind != "columns"]
        for column in [*scalars, *[spec.columns[0] for spec in tensors], data.label]:
            self.checks.append(Check("expect_column_to_exist", "exists", column, per_batch=False))
        # Column checks only on present columns: a missing column is already one failure above.
        for column in (c for c in scalars if c in present):
            self.checks += [
                Check("expect_column_values_to_be_in_type_list", "numeric", column,
                       {"type_list": list(NUMERIC_DTYPES)}, per_batch=False),
                Check("expect_column_values_to_not_be_null", "feature_not_null", column),
                Check("expect_column_values_to_not_be_in_set", "finite", column,
                       {"value_set": [float("inf"), float("-inf")]}),
            ]
        self.tensor_inputs = [spec for spec in tensors if spec.columns[0] in present]
        if data.label in present:
            self.checks.append(Check("expect_column_values_to_not_be_null", "label_not_null", data.label))
            if data.task == "regression":
                self.checks += [
                    Check("expect_column_values_to_be_in_type_list", "target_numeric", data.label,
                           {"type_list": list(NUMERIC_DTYPES)}, per_batch=False),
                    Check("expect_column_values_to_not_be_in_set", "target_finite", data.label,
                           {"value_set": [float("inf"), float("-inf")]}),
                ]
            elif data.classes and (self.listing.images or {}).get("layout") != "folders":
                # (A class folder's name missing from data.classes is one sentence per folder, from the listing.)
                self.checks.append(Check("expect_column_values_to_be_in_set", "in_classes", data.label,
                                          {"value_set": list(data.classes)}))
        self.checks.append(Check("expect_table_row_count_to_be_between", "rows", None,
                                  {"min_value": self.min_rows}, per_batch=False))

    def where_rows(self, examples: list[tuple[int, int]], count: int) -> str:
        """Row numbers as a user finds them: in the file, named when the source has several (an image: its file)."""
        if self.listing.format == "images":
            return rows_named(self.listing, examples, count)
        several = len(self.listing.files) > 1
        shown = [f"{_file_name(self.listing.files[f].uri)}:{r}" if several else str(r) for f, r in examples]
        more = ", ..." if count > len(shown) else ""
        label = "row" if count == 1 else "rows"
        return f"{label} {', '.join(shown)}{more}, counted from 0" + (" in each file" if several else "")

    def describe(self, check: Check, result: dict, data: DataSpec) -> str:
        """One sentence: which column, which rule, what was found, how to fix it."""
        where = "" if self.role == "source" else f"validation file {self.uri}: "
        column = check.column
        if "exception" in result:
            target = f" on column {column!r}" if column else ""
            return (f"{where}check {check.expectation}{target} could not run ({result['exception']}); "
                    "this is a bug or an unsupported column type: report it with the column's type")
        if check.rule == "exists":
            close = difflib.get_close_matches(column, self.listing.columns, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            what = "data.label" if column == data.label else "data.features"
            return (f"{where}column {column!r} is missing{hint}; the file has {_preview(self.listing.columns)}; "
                    f"add the column or fix {what}")
        if check.rule in ("numeric", "target_numeric"):
            arrow_type = self.listing.schema.get(column, "?")
            if check.rule == "target_numeric":
                return (f"{where}label column {column!r}: type {arrow_type} is not numeric, but data.task is "
                        "'regression'; convert the target to numbers, or use task 'classification'")
            return (f"{where}column {column!r}: type {arrow_type} is not numeric (features must be integers or "
                    "floats); convert the column to numbers or remove it from data.features")
        if check.rule == "rows":
            subject = "the file" if self.role == "source" else f"validation file {self.uri}"
            return (f"{subject} has {result['observed_value']} row(s) but needs at least {self.min_rows} "
                    f"({self.rows_rule}); {self.rows_fix}")
        count = result["unexpected_count"]
        rows = self.where_rows(result["examples"], count)
        if check.rule == "feature_not_null":
            return f"{where}column {column!r}: {_values(count)} null or NaN ({rows}); remove or impute them"
        if check.rule in ("finite", "target_finite"):
            return (f"{where}{'label ' if check.rule == 'target_finite' else ''}column {column!r}: "
                    f"{_values(count)} +/-inf ({rows}); remove these rows or clip the values to a finite range")
        if check.rule == "label_not_null":
            return f"{where}label column {column!r}: {_values(count)} null ({rows}); label these rows or remove them"
        # in_classes
        found = sorted({repr(v) for v in result["partial_unexpected_list"]})
        return (f"{where}label column {column!r}: {_values(count)} not in data.classes {list(data.classes)} "
                f"({rows}; values {', '.join(found)}); add the missing classes to data.classes, drop these rows, "
                "or fix the type of data.classes to match the column")

    def schema_result(self, check: Check) -> dict:
        """The result of a check on the schema or the totals, as Great Expectations would word it."""
        if check.rule == "exists":
            return {"success": check.column in self.listing.columns}
        if check.rule in ("numeric", "target_numeric"):
            return {"success": _is_numeric(self.listing.schema.get(check.column, ""))}
        return {"success": self.listing.total_rows >= self.min_rows, "observed_value": self.listing.total_rows}

    def check_tensors(self, batch: Any) -> None:
        """Tensor lengths and values, image decoding and sizes, merged over batches by column and rule."""
        for spec in self.tensor_inputs:
            column = batch.table[spec.columns[0]]
            if spec.kind == "tensor":
                _, problems = tensor_values(column, spec, first_row=batch.first_row, values=False)
            else:
                _, problems = decode_images(column, spec, first_row=batch.first_row)
            for problem in problems:
                merged = self.tensor_problems.setdefault((problem.column, problem.rule), [0, [], problem])
                merged[0] += problem.count
                merged[1] += [(batch.file_index, r) for r in problem.rows][:EXAMPLES - len(merged[1])]

    def tensor_failures(self) -> list[str]:
        where = "" if self.role == "source" else f"validation file {self.uri}: "
        return [where + problem.sentence(rows=self.where_rows(examples, count), count=count)
                for count, examples, problem in self.tensor_problems.values()]

    @property
    def failed_schema(self) -> set[str]:
        """Columns a schema check failed on: their value checks do not run."""
        return {check.column for check in self.checks if not check.per_batch
                and check.column and not self.schema_result(check)["success"]}

    def result(self, check: Check) -> dict | None:
        """``check``'s result: on the listing, or merged over every batch read (None: it could not run)."""
        if not check.per_batch:
            return self.schema_result(check)
        if check.column in self.failed_schema:
            return None
        return self.totals.get(self.checks.index(check), {"success": True})

    @property
    def failed(self) -> bool:
        """Some row read so far broke a rule."""
        return bool(self.tensor_problems) or any(not t["success"] for t in self.totals.values())

    def state(self) -> dict[str, Any]:
        """What the batches read so far found, as JSON, to merge with other slices' (:meth:`absorb`)."""
        return {
            "totals": {str(i): total for i, total in self.totals.items()},
            "tensor": [[column, rule, count, examples, problem.text]
                       for (column, rule), (count, examples, problem) in self.tensor_problems.items()],
            "labels": [[value, count] for value, count in self.label_counts.items()],
            "batches": self.batches,
        }

    def absorb(self, state: dict[str, Any]) -> None:
        """Merge another slice's :meth:`state` into this one (slices absorbed in file order)."""
        for key, other in state["totals"].items():
            self._merge_total(int(key), {**other, "examples": [tuple(e) for e in other["examples"]]})
        for column, rule, count, examples, text in state["tensor"]:
            merged = self.tensor_problems.setdefault((column, rule), [0, [], Problem(column, rule, (), 0, text)])
            merged[0] += count
            merged[1] += [tuple(e) for e in examples][:EXAMPLES - len(merged[1])]
        for value, count in state["labels"]:
            if value in self.label_counts or len(self.label_counts) <= MAX_FOUND_CLASSES:
                self.label_counts[value] = self.label_counts.get(value, 0) + count
        self.batches += state["batches"]

    def _merge_total(self, index: int, other: dict) -> None:
        total = self.totals.setdefault(index, {"success": True, "unexpected_count": 0, "examples": [],
                                               "partial_unexpected_list": []})
        if "exception" in other:
            total.update(success=False, exception=other["exception"])
        if other["success"]:
            return
        total["success"] = False
        total["unexpected_count"] += other["unexpected_count"]
        total["examples"] += other["examples"][:EXAMPLES - len(total["examples"])]
        values = [v for v in other["partial_unexpected_list"] if v not in total["partial_unexpected_list"]]
        total["partial_unexpected_list"] += values[:EXAMPLES]

    def merge(self, check: Check, result: dict, file_index: int) -> None:
        """Add one batch's result of ``check`` to the totals kept in ``self.totals``."""
        total = self.totals.setdefault(self.checks.index(check), {"success": True, "unexpected_count": 0,
                                                                  "examples": [], "partial_unexpected_list": []})
        if "exception" in result:
            total.update(success=False, exception=result["exception"])
            return
        if result["success"]:
            return
        total["success"] = False
        total["unexpected_count"] += int(result.get("unexpected_count") or 0)
        rows = [(file_index, int(r)) for r in result.get("partial_unexpected_index_list") or []]
        total["examples"] += rows[:EXAMPLES - len(total["examples"])]
        values = [v for v in result.get("partial_unexpected_list") or [] if v not in total["partial_unexpected_list"]]
        total["partial_unexpected_list"] += values[:EXAMPLES]


class _BatchChecker:
    """Runs one role's value checks on record batches, merging each batch's results into the role.

    Value checks run in Great Expectations (scalar columns and the label; tensor and image columns
    are checked by :meth:`_Role.check_tensors` on the same batch); schema and row-count checks run
    once on the listing, in :meth:`DataChecks.conclude`.
    """

    def __init__(self, role: _Role, inputs: list[InputSpec], data: DataSpec) -> None:
        self.role = role
        self.data = data
        present, failed_schema = set(role.listing.columns), role.failed_schema
        scalar = [c for spec in inputs if spec.kind == "columns" for c in spec.columns]
        self.batch_checks = [c for c in role.checks if c.per_batch and c.column not in failed_schema]
        self.read = [c for c in dict.fromkeys([*scalar, data.label]) if c in present and c not in failed_schema]
        self.columns = list(dict.fromkeys([*self.read, *[spec.columns[0] for spec in role.tensor_inputs]]))
        self.context: Any = None
        self.suites: dict[tuple[int, ...], Any] = {}
        self.seen = 0

    def observe(self, batch: Any) -> None:
        import pandas as pd  # noqa: PLC0415

        role, data = self.role, self.data
        role.batches += 1
        self.seen += 1
        if data.label in self.read and data.task == "classification":
            count_labels(batch.table[data.label], role.label_counts)
        role.check_tensors(batch)
        # Great Expectations costs ~30 ms per expectation per call whatever the batch's size; a
        # vectorised pre-check passes the clean columns of later batches on its own. The first
        # batch a task reads runs every expectation, so every rule is Great Expectations' own.
        todo = tuple(i for i, check in enumerate(self.batch_checks)
                     if self.seen == 1 or suspect(batch.table, check))
        if not todo:
            return
        if self.context is None:
            self.context = gx_context()
        if todo not in self.suites:
            self.suites[todo] = suite([self.batch_checks[i] for i in todo])
        frame = batch.table.select(self.read).to_pandas()
        # Row numbers in the file, so a failure names rows the user can find.
        frame.index = pd.RangeIndex(batch.first_row, batch.first_row + len(frame))
        for check, result in validate_batch(self.context, frame, self.suites[todo],
                                             [self.batch_checks[i] for i in todo]):
            role.merge(check, result, batch.file_index)


def _is_numeric(arrow_type: str) -> bool:
    return arrow_type.startswith(("int", "uint", "float", "double", "halffloat", "decimal"))


def _file_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _values(count: int) -> str:
    return f"{count} value is" if count == 1 else f"{count} values are"


def _preview(columns: list[str], limit: int = 12) -> str:
    shown = ", ".join(repr(c) for c in columns[:limit])
    return f"columns {shown}" + (f", ... ({len(columns)} in all)" if len(columns) > limit else "")
