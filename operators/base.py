"""What every mop_airflow operator shares: the spec it was built with and the run's layout.

The spec is stored as plain data at parse time; ``effective_spec`` applies the run's params
(trigger conf) at run time, so a run can change the search space without re-parsing the DAG.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow.sdk import BaseOperator

from mop_airflow.layout import RunLayout
from mop_airflow.spec import MopSpec
from mop_airflow.store import Store

SPEC_SECTIONS = ("data", "search", "schedule", "store")


class MopBaseOperator(BaseOperator):
    ui_color = "#e8f1fb"

    def __init__(self, *, spec: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = dict(spec)

    def effective_spec(self, context: Mapping[str, Any]) -> MopSpec:
        params = context.get("params") or {}
        overrides = {k: params[k] for k in SPEC_SECTIONS if isinstance(params.get(k), Mapping)}
        return MopSpec.from_dict(self.spec).with_overrides(overrides)

    @staticmethod
    def layout(context: Mapping[str, Any], spec: MopSpec) -> RunLayout:
        return RunLayout(Store.from_spec(spec.store), context["dag"].dag_id, context["run_id"])
