"""Great Expectations as the engine behind validation: one expectation per check, run per batch.

Great Expectations costs ~30 ms per expectation per call whatever the batch's size, so
:func:`suspect` lets a vectorised pyarrow pre-check pass a clean column of a later batch on its
own; the context is ephemeral and in memory, so validating writes nothing anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXAMPLES = 5  # offending rows / values quoted per failure


@dataclass(frozen=True)
class Check:
    expectation: str  # Great Expectations' snake_case name, e.g. expect_column_to_exist
    rule: str         # our name for the rule; picks the failure sentence
    column: str | None
    kwargs: dict = field(default_factory=dict)
    per_batch: bool = True  # False: a check of the schema or the totals, run once


def suspect(table: Any, check: Check) -> bool:
    """Whether ``check`` might fail on ``table``: True unless pyarrow proves the column clean.

    Errs towards True (an unknown rule or type runs in Great Expectations), never the other way.
    """
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    column = table[check.column]
    floating = pa.types.is_floating(column.type)
    try:
        if check.rule in ("feature_not_null", "label_not_null"):
            return column.null_count > 0 or (floating and pc.any(pc.is_nan(column)).as_py() is True)
        if check.rule in ("finite", "target_finite"):
            return floating and pc.any(pc.is_inf(column)).as_py() is True
        if check.rule == "in_classes":
            found = pc.is_in(column, value_set=pa.array(check.kwargs["value_set"]).cast(column.type))
            return pc.all(pc.or_kleene(found, pc.is_null(column))).as_py() is not True
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return True
    return True


def gx_context():
    """An ephemeral, in-memory Great Expectations context with one pandas data source."""
    import great_expectations as gx  # noqa: PLC0415 - ~3 s to import; only tasks that validate pay it
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
    asset = context.data_sources.add_pandas("mop_airflow").add_dataframe_asset("batch")
    return asset.add_batch_definition_whole_dataframe("all")


def suite(checks: list[Check]):
    import great_expectations as gx  # noqa: PLC0415
    import great_expectations.expectations as gxe  # noqa: PLC0415

    expectations = []
    for index, check in enumerate(checks):
        expectation_class = getattr(gxe, _class_name(check.expectation))
        column = {} if check.column is None else {"column": check.column}
        expectations.append(expectation_class(**column, **check.kwargs, meta={"check": index}))
    # Given to the constructor, not one by one: add_expectation compares each new expectation with
    # every one already added (checks are distinct by construction), which for 128 feature columns
    # (258 expectations) took 3.9 s of a scatter task's first batch.
    return gx.ExpectationSuite(name="mop_airflow", expectations=expectations)


def validate_batch(batch_definition: Any, frame: Any, suite: Any, checks: list[Check]):
    outcome = batch_definition.get_batch(batch_parameters={"dataframe": frame}).validate(
        suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": EXAMPLES})
    by_index = {r.expectation_config.meta["check"]: r for r in outcome.results}
    for index, check in enumerate(checks):
        yield check, _as_dict(by_index[index])


def _as_dict(result: Any) -> dict:
    info = result.exception_info or {}
    out = {"success": bool(result.success), **dict(result.result or {})}
    if info.get("raised_exception"):
        out["success"] = False
        out["exception"] = info.get("exception_message")
    return out


def _class_name(expectation: str) -> str:
    return "".join(part.capitalize() for part in expectation.split("_"))
