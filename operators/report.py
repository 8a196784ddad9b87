"""After the hops: leaderboard, metrics table, learning curves, hop timeline, best model, summary;
the champion/challenger decision; then TensorBoard files and, when configured, MLflow runs.

The work is :func:`mop_airflow.report.write_report`, :func:`mop_airflow.champion.challenge` (it
evaluates the winner and the DAG's champion on this run's validation data; the publish task acts
on its decision) and :func:`mop_airflow.tracking.track_run`; this operator only logs the outcome. Tracking cannot fail the task: the model selection has
finished and its report is written, so a tracker that is down is a warning in the task log.
"""

from __future__ import annotations

from typing import Any

from mop_airflow.champion import challenge
from mop_airflow.report import write_report
from mop_airflow.tracking import track_run

from mop_airflow.operators.base import MopBaseOperator


class MopReportOperator(MopBaseOperator):
    ui_color = "#ece3f8"

    def work(self, context: Any) -> dict[str, Any]:
        layout = self.layout(context)
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
        return {"best_config_id": best["config_id"], metric: best[metric], "report_uri": layout.report_uri(""),
                "best_model_uri": summary["best_model_uri"], "publish": decision["publish"],
                "tensorboard_uri": tracked["tensorboard"],
                "mlflow_run_id": tracked["mlflow_run_id"]}
