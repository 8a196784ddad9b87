"""After the report: publish the run's winner as the DAG's champion, or leave the champion and skip.

The decision was taken by the report task (:func:`mop_airflow.serving.champion.challenge`, which evaluates
both models) and written to ``report/challenge.json``; this task only acts on it, without
TensorFlow. Publishing appends the registry entry and emits the event of this task's outlet, the
Asset ``mop://<dag_id>/champion``, with the entry as its ``extra``. A winner that is not better by the
margin skips the task, and a skipped task emits no Asset event: downstream DAGs keep the champion.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from mop_airflow.serving.champion import asset_extra, publish

from mop_airflow.operators.base import MopBaseOperator


class MopPublishOperator(MopBaseOperator):
    ui_color = "#fbe7c6"

    def work(self, context: Any) -> dict[str, Any]:
        layout = self.layout(context)
        decision = layout.store.read_json(layout.report_uri("challenge.json"))
        if not decision["publish"]:
            raise AirflowSkipException(f"not published: {decision['reason']}")
        entry = publish(layout.store, layout.dag_id, decision["entry"], reason=decision["reason"])
        extra = asset_extra(entry)
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = extra
        self.log.info("published %s of run %s as champion version %d of %s: %s", entry["config_id"], entry["run_id"],
                      entry["version"], layout.dag_id, decision["reason"])
        return extra
