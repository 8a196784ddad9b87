"""After the hops: leaderboard, metrics table, learning curves, hop timeline, best model, summary;
the champion/challenger decision; then TensorBoard files and, when configured, MLflow runs.

The work is :func:`mop_airflow.results.report.write_report`, :func:`mop_airflow.serving.champion.challenge` (it
evaluates the winner and the DAG's champion on this run's validation data; the publish task acts
on its decision) and :func:`mop_airflow.results.tracking.track_run`; this operator only logs the outcome. Tracking cannot fail the task: the model selection has
finished and its report is written, so a tracker that is down is a warning in the task log.
"""

from __future__ import annotations

from typing import Any

from mop_airflow.serving.champion import challenge
from mop_airflow.errors import StoreError
from mop_airflow.records import BlockDecision
from mop_airflow.records.selection import task_id_in
from mop_airflow.results.report import write_report
from mop_airflow.results.tracking import track_run

from mop_airflow.operators.base import MopBaseOperator


class MopReportOperator(MopBaseOperator):
    ui_color = "#ece3f8"

    def __init__(self, *, last_start: int = 0, decided: bool = False, blocks: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.last_start = last_start  # a search split over DAG runs: the first hop of its last block
        self.decided = decided  # a search decided between blocks: the decide step says whether it ended
        self.blocks = blocks  # the blocks one run holds (all of a small PBT or model-based search)

    def _ended(self, layout: Any, first: int) -> bool:
        """Whether the search ended in this run: a decision after one of its blocks found nothing left."""
        for k in range(1, self.blocks + 1):
            uri = layout.block_decision_uri(first + k)
            if not layout.store.exists(uri):
                return False  # the search ended only if a decision of this run found nothing left
            if BlockDecision.read(layout.store, uri).finished:
                return True
        return False

    def work(self, context: Any) -> dict[str, Any]:
        continuing = self.continuation(context)
        layout = self.layout(context)
        if (continuing.start if continuing else 0) < self.last_start or (self.decided and not self._ended(
                layout, continuing.block if continuing else 0)):
            from airflow.sdk.exceptions import AirflowSkipException  # noqa: PLC0415

            raise AirflowSkipException("the search goes on in the DAG's next run (see next_run or decide); "
                                       "the run of its last block reports")
        run = self.run_record(layout)
        cache_dir = self.store_spec(context).local_cache
        summary = write_report(layout, run, cache_dir=cache_dir)
        best, metric = summary["best"], run.metric
        decision = challenge(layout, run, summary, cache_dir=cache_dir)
        self.log.info("%s: %s", "publish" if decision["publish"] else "champion stays", decision["reason"])
        for failure in summary["failed"]:
            self.log.warning("%s %s at hop %d: %s", failure["config_id"], failure["status"], failure["t"],
                             failure["error"])
        self.log.info("best %s %s=%s; report at %s", best["config_id"], metric, best[metric], layout.report_uri(""))
        tracked = track_run(layout, run, summary)
        for warning in tracked["warnings"]:
            self.log.warning("%s", warning)
        if tracked["tensorboard"]:
            self.log.info("TensorBoard: tensorboard --logdir %s", tracked["tensorboard"])
        if tracked["mlflow_run_id"]:
            self.log.info("MLflow: parent run %s", tracked["mlflow_run_id"])
        # what a task downstream of a MopTaskGroup gets (``selection.output``): enough to load the winner
        return {"best_config_id": best["config_id"], metric: best[metric], "metric": metric, "value": best[metric],
                "direction": run.direction, "report_uri": layout.report_uri(""),
                "leaderboard_uri": layout.report_uri("leaderboard.json"), "run_folder": layout.run_uri,
                "store_root": layout.store.root, "selection_id": layout.dag_id, "run_id": layout.run_id, "best_model_uri": summary["best_model_uri"],
                "publish": decision["publish"],
                "champion": {"publish": decision["publish"], "reason": decision["reason"],
                             "champion_config_id": (decision.get("champion") or {}).get("config_id")},
                "tensorboard_uri": tracked["tensorboard"],
                "mlflow_run_id": tracked["mlflow_run_id"]}


class MopResultOperator(MopBaseOperator):
    """A MopTaskGroup's last task: the run's summary (the report task's), whether the winner was
    published or the champion stayed (a skipped publish task), so that tasks downstream of the group run
    either way and ``selection.output`` is what they read."""

    ui_color = "#ece3f8"

    def work(self, context: Any) -> dict[str, Any]:
        summary = context["ti"].xcom_pull(task_ids=task_id_in(self.selection, "report"))
        if not isinstance(summary, dict):
            raise StoreError(f"the report task of {self.selection_id(context)} left no summary in XCom "
                             f"(found {summary!r}). Fix: clear the report task of this run")
        return summary
