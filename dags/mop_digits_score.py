"""Example: a deployment DAG — every time ``mop_digits_retrain`` publishes a new champion, score a batch with it.

Scheduled on the champion Asset ``mop://mop_digits_retrain/champion`` (``champion_asset``), which
only a publish task that replaced the champion emits. The event's ``extra`` is the hand-off: the
DAG, run and configuration of the new champion, its metric and value, the model's URI and the
fingerprint of the data it was trained on. ``champion_event`` reads it from
``triggering_asset_events`` (for a run triggered by hand, with no event, it takes the registry's
current champion instead); ``score`` then scores the batch with exactly that run's configuration,
so a later champion cannot slip in between, and writes one prediction per row to
``$MOP_HOME/scores/<this run's id>.parquet``.

The batch here is the digits folder itself (`mop-airflow example-data`); a real deployment points
``source`` at the rows to score.
"""

import os

from airflow.sdk import DAG, task

from mop_airflow.airflow.dag import champion_asset
from mop_airflow.examples.sklearn_data import digits_data_spec
from mop_airflow.operators.predict import MopPredictOperator
from mop_airflow.config import default_home

MODEL_DAG = "mop_digits_retrain"
CHAMPION = champion_asset(MODEL_DAG)
SCORES = "file://" + os.path.join(default_home(), "scores")

with DAG(
    dag_id="mop_digits_score",
    schedule=[CHAMPION],
    catchup=False,
    max_active_runs=1,
    tags=["mop_airflow", "example", "deployment"],
    doc_md=__doc__,
) as dag:

    @task
    def champion_event(triggering_asset_events=None) -> dict:
        """The newest champion event's extra: which run and configuration to score with."""
        events = list(triggering_asset_events[CHAMPION]) if triggering_asset_events else []
        if events:
            extra = dict(events[-1].extra)
            print(f"champion version {extra['version']} of {extra['dag_id']}: {extra['config_id']} of run "
                  f"{extra['run_id']}, {extra['metric']}={extra['value']:.4f} ({len(events)} event(s) consumed)")
            return extra
        from mop_airflow.serving.champion import asset_extra, current_champion  # noqa: PLC0415 - a run by hand only
        from mop_airflow.config import StoreSpec  # noqa: PLC0415
        from mop_airflow.hooks.connections import open_spec_store  # noqa: PLC0415

        entry = current_champion(open_spec_store(StoreSpec()), MODEL_DAG)
        if entry is None:
            raise RuntimeError(f"{MODEL_DAG} has published no champion yet: nothing to score with. Fix: let a "
                               f"{MODEL_DAG} run finish (or publish one with `mop-airflow champion publish`)")
        print(f"no champion event (triggered by hand): the registry's champion, version {entry['version']}")
        return asset_extra(entry)

    event = champion_event()
    score = MopPredictOperator(
        task_id="score",
        source=digits_data_spec()["source"],
        out=SCORES + "/{{ run_id }}.parquet",
        mode="response",
        model_dag_id="{{ ti.xcom_pull(task_ids='champion_event')['dag_id'] }}",
        model_run_id="{{ ti.xcom_pull(task_ids='champion_event')['run_id'] }}",
        config_id="{{ ti.xcom_pull(task_ids='champion_event')['config_id'] }}",
    )
    event >> score
