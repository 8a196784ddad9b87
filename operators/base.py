"""What every mop_airflow operator shares: the store it reads the run's records from, and which
failures are worth a retry.

Operators get resolved arguments computed once when the DAG is rendered (a task's hop, shard,
bracket...), plus the store section of the spec. The run itself is resolved once by the first task
(``preflight``) into a :class:`~mop_airflow.records.RunRecord`; later tasks read that record.

Tasks retry by default (a preempted worker, a store that was briefly away), but a mistake in the
input or the configuration fails at once: a retry would only repeat it.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from mop_airflow.errors import NOT_RETRIED  # noqa: F401 - failures a retry cannot fix, re-exported

from mop_airflow.records.layout import RunLayout, read_run
from mop_airflow.records import RunRecord
from mop_airflow.records import Continuation
from mop_airflow.planning.run_chain import continuation_of
from mop_airflow.records.selection import conf_of, selection_id, task_id_in
from mop_airflow.config import StoreSpec
from mop_airflow.hooks.connections import open_spec_store


class MopBaseOperator(BaseOperator):
    ui_color = "#e8f1fb"

    def __init__(self, *, store: Mapping[str, Any], selection: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = dict(store)
        # the MopTaskGroup this task belongs to (None: a whole MOP DAG); it names the run's folders
        self.selection = selection

    def execute(self, context: Any) -> Any:
        try:
            return self.work(context)
        except NOT_RETRIED as exc:
            raise AirflowFailException(str(exc)) from exc

    def work(self, context: Any) -> Any:
        raise NotImplementedError

    def store_spec(self, context: Mapping[str, Any]) -> StoreSpec:
        """The DAG's store, or the one the trigger conf names (the run record is written there)."""
        override = (conf_of(context.get("params") or {}, self.selection) or {}).get("store")
        return StoreSpec(**{**self.store, **(override if isinstance(override, Mapping) else {})})

    def layout(self, context: Mapping[str, Any]) -> RunLayout:
        """The search's folder: this run's, or for a run continuing a search the first run's."""
        continuing = self.continuation(context)
        run_id = continuing.first_run if continuing else context["run_id"]
        return RunLayout(open_spec_store(self.store_spec(context)), self.selection_id(context), run_id)

    def continuation(self, context: Mapping[str, Any]) -> Continuation | None:
        """Which search and block this run continues (:mod:`mop_airflow.planning.run_chain`); None for a first run."""
        if self.selection is not None:  # a MopTaskGroup's search is never split
            return None
        return continuation_of(getattr(context.get("dag_run"), "conf", None))

    def selection_id(self, context: Mapping[str, Any]) -> str:
        """What names this selection's run folders, registry and Asset (:mod:`mop_airflow.records.selection`)."""
        return selection_id(context["dag"].dag_id, self.selection)

    @staticmethod
    def run_record(layout: RunLayout) -> RunRecord:
        """The run record the plan task wrote: every task after it reads the run from here."""
        return read_run(layout)

    def resolved_run(self, context: Mapping[str, Any]) -> RunRecord:
        """The run record as preflight resolved it, before the plan task writes it to the store."""
        return RunRecord.from_dict(context["ti"].xcom_pull(task_ids=task_id_in(self.selection, "preflight")))
