"""Example: continuous retraining — every night, and whenever new digits land, a champion is challenged.

A small model selection on the digits folder of `mop-airflow example-data` (two learning rates of
one MLP, two shards, one iteration), scheduled with
``AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 3 * * *"), assets=<the data folder's Asset>)``:
a run starts at 03:00 UTC and also as soon as the data Asset gets an event. Each run warm-starts
from the current champion's weights (``search.warm_start = {"from": "champion", "select": "winner"}``),
and its winner replaces the champion only when it is better by more than half a point of
validation accuracy on this run's validation data (``publish.margin = 0.005``). Then the publish
task emits the ``mop://mop_digits_retrain/champion`` Asset event, which schedules the deployment
DAG ``mop_digits_score``; a winner that is not better enough skips it, and nothing is redeployed.
Unpausing the DAG runs its latest nightly slot at once (``catchup=False`` runs the latest one), so a
new deployment trains its first champion without waiting for 03:00.

**Feeding it.** The data Asset's URI is the digits folder as a ``file://`` URI:
``file://$MOP_HOME/data/digits`` (shown on the Assets page). Tell Airflow that new files
landed there in either way:

- from a producer DAG, the task that writes the files declares the Asset as its outlet::

      from airflow.sdk import Asset, task

      @task(outlets=[Asset("file:///.../data/digits")])
      def land_new_digits(): ...

- from anything else (an upload job, a storage notification), through the REST API: look the
  Asset's id up with ``GET /api/v2/assets?uri_pattern=data/digits``, then
  ``POST /api/v2/assets/events`` with ``{"asset_id": <id>, "extra": {"files": [...]}}``.

Several events before a run starts are consumed by one run.
"""

import os

from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable

from mop_airflow import build_mop_dag
from mop_airflow.examples.sklearn_data import digits_data_spec

DATA = digits_data_spec()
# The Asset is the data folder itself: an event on it means "new data landed here".
DIGITS = Asset(uri="file://" + os.path.abspath(DATA["source"]), group="data")

spec = {
    "data": DATA,
    "search": {
        "space": {
            "method": "grid",
            "params": {
                "model": ["mop_airflow.examples.image_models:flat_mlp"],
                "optimizer": "adam",
                "learning_rate": [3e-3, 1e-2],
                "batch_size": [32],
                "metrics": ["accuracy"],
            },
        },
        "metric": "val_accuracy",
        # Both configurations share the champion's model, so both start from its weights.
        "warm_start": {"from": "champion", "select": "winner"},
    },
    "schedule": {"shards": 2, "iterations": 1, "epochs_per_hop": 1, "seed": 7},
    "publish": {"enabled": True, "margin": 0.005},
}

dag = build_mop_dag(
    spec,
    dag_id="mop_digits_retrain",
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("0 3 * * *", timezone="UTC"), assets=DIGITS),
    tags=["mop_airflow", "example", "retraining"],
    doc_md=__doc__,
)
