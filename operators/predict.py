"""Score a Parquet/CSV source with a run's model inside a DAG; the output's URI goes to XCom.

The work is :func:`mop_airflow.serving.predict.predict` (it runs and is tested without Airflow);
this operator only finds the run and logs what was written. By default it scores with the best
model of the DAG run it belongs to, so it can follow a mop_airflow DAG's ``report`` task:

.. code-block:: python

    from mop_airflow.operators.predict import MopPredictOperator

    score = MopPredictOperator(task_id="score", dag=dag, source="s3://bucket/new/", out="s3://bucket/scores/"
                               "{{ ds }}.parquet", mode="top_k", k=3, store=spec["store"])
    dag.get_task("report") >> score

``model_dag_id`` (and ``model_run_id``; without it, that DAG's latest reported run) scores with
another DAG's run instead, e.g. in a scheduled scoring DAG.

``model_run_id="champion"`` scores with the current champion of ``model_dag_id`` (default: this
task's own DAG): the run named by the last entry of that DAG's registry
(:mod:`mop_airflow.serving.champion`), read when the task runs. A scoring DAG scheduled on the champion
Asset thus always uses the model just published, and a rollback (``mop-airflow champion publish``)
takes effect at its next run. The task fails when the DAG has published no champion yet.

.. code-block:: python

    from mop_airflow.airflow.dag import champion_asset

    with DAG("score_daily", schedule=champion_asset("mnist1d")):
        MopPredictOperator(task_id="score", source=..., out=..., model_dag_id="mnist1d",
                           model_run_id="champion", store=spec["store"])
"""

from __future__ import annotations

from typing import Any, Mapping

from mop_airflow.operators.base import MopBaseOperator

CHAMPION = "champion"  # model_run_id naming the DAG's current champion, not a run


class MopPredictOperator(MopBaseOperator):
    """``source`` scored into the Parquet file ``out`` (``mode`` response, prob or top_k; see the module).

    ``model_run_id``: a run id, ``"champion"`` (the current champion of ``model_dag_id``, default this
    DAG), or None (this DAG run, or with ``model_dag_id`` that DAG's latest reported run)."""

    template_fields = ("source", "out", "mode", "model_dag_id", "model_run_id", "config_id")
    ui_color = "#fdf0dc"

    def __init__(self, *, source: str, out: str, mode: str = "response", k: int = 3,
                 model_dag_id: str | None = None, model_run_id: str | None = None, config_id: str | None = None,
                 id_column: str | None = None, batch_rows: int | None = None,
                 store: Mapping[str, Any] | None = None, conn_id: str | None = None,
                 storage_options: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(store=store or {}, **kwargs)
        self.source = source
        self.out = out
        self.mode = mode
        self.k = k
        self.model_dag_id = model_dag_id
        self.model_run_id = model_run_id
        self.config_id = config_id
        self.id_column = id_column
        self.batch_rows = batch_rows
        self.conn_id = conn_id
        self.storage_options = dict(storage_options or {})

    def work(self, context: Any) -> str:
        from mop_airflow.errors import SpecError  # noqa: PLC0415
        from mop_airflow.records.layout import RunLayout  # noqa: PLC0415
        from mop_airflow.hooks.connections import filesystem_options, open_spec_store  # noqa: PLC0415
        from mop_airflow.results.runs import run_layout  # noqa: PLC0415
        from mop_airflow.serving.predict import champion_layout, predict  # noqa: PLC0415 - Keras

        spec = self.store_spec(context)
        if self.model_run_id == CHAMPION:  # the run the DAG's registry names as its champion, now
            if self.config_id:
                raise SpecError("config_id", self.config_id, "cannot be combined with model_run_id='champion': the "
                                "champion is a run's best model, not a configuration's checkpoint",
                                "leave config_id out, or name the run in model_run_id")
            layout, entry = champion_layout(open_spec_store(spec), self.model_dag_id or context["dag"].dag_id)
            self.log.info("scoring with champion version %d of %s: %s of run %s", entry["version"], layout.dag_id,
                          entry["config_id"], entry["run_id"])
        elif self.model_dag_id and not self.model_run_id:  # another DAG's latest reported run
            layout = run_layout(spec.root, self.model_dag_id,
                                options=filesystem_options(spec.root, spec.storage_options, spec.conn_id))
        else:
            layout = RunLayout(open_spec_store(spec), self.model_dag_id or context["dag"].dag_id,
                               self.model_run_id or context["run_id"])
        done = predict(layout, self.source, self.out, mode=self.mode, k=self.k, config_id=self.config_id,
                       id_column=self.id_column, batch_rows=self.batch_rows,
                       options=filesystem_options((self.source, self.out), self.storage_options, self.conn_id))
        self.log.info("%d row(s) scored (%s) with configuration %s of %s / %s: %s", done["rows"], done["mode"],
                      done["config_id"], layout.dag_id, layout.run_id, done["uri"])
        return done["uri"]
