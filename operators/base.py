"""What every mop_airflow operator shares: the store it reads the run's records from.

Operators get resolved arguments computed once when the DAG is rendered (a task's hop, shard,
bracket...), plus the store section of the spec. The run itself is resolved once by the first task
(``preflight``) into a :class:`~mop_airflow.records.RunRecord`; later tasks read that record.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow.sdk import BaseOperator

from mop_airflow.layout import RunLayout
from mop_airflow.records import RunRecord
from mop_airflow.spec import StoreSpec
from mop_airflow.store import Store


class MopBaseOperator(BaseOperator):
    ui_color = "#e8f1fb"

    def __init__(self, *, store: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = dict(store)

    def store_spec(self, context: Mapping[str, Any]) -> StoreSpec:
        """The DAG's store, or the one the trigger conf names (the run record is written there)."""
        override = (context.get("params") or {}).get("store")
        return StoreSpec(**{**self.store, **(override if isinstance(override, Mapping) else {})})

    def layout(self, context: Mapping[str, Any]) -> RunLayout:
        return RunLayout(Store.from_spec(self.store_spec(context)), context["dag"].dag_id, context["run_id"])

    @staticmethod
    def run_record(layout: RunLayout) -> RunRecord:
        """The run record the plan task wrote: every task after it reads the run from here."""
        return RunRecord.read(layout.store, layout.run_record_uri)

    @staticmethod
    def resolved_run(context: Mapping[str, Any]) -> RunRecord:
        """The run record as preflight resolved it, before the plan task writes it to the store."""
        return RunRecord.from_dict(context["ti"].xcom_pull(task_ids="preflight"))
