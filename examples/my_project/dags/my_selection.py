"""The example project's DAG: model selection over the digits that ``make_data.py`` writes.

Copy the folder, point ``data.source`` at your file (or set ``MY_PROJECT_DATA``), put your own
builders in ``my_models.py``, and start Airflow on the folder: ``mop-airflow up --dags-folder dags``.
"""

import os
from pathlib import Path

from mop_airflow import build_mop_dag

DATA = os.environ.get("MY_PROJECT_DATA") or str(Path(__file__).resolve().parent.parent / "data" / "digits.parquet")

spec = {
    "data": {"source": DATA, "label": "digit", "features": "px*", "classes": list(range(10)), "validation": 0.2},
    "search": {
        "space": {"method": "grid", "params": {
            "model": "my_models:mlp",           # module:function, the module beside this file
            "optimizer": "adam",
            "learning_rate": [1e-3, 1e-2, 3e-2],
            "batch_size": [32],
            "hparams": {"units": [64]},
        }},
        "metric": "val_accuracy",
    },
    "schedule": {"shards": 3, "iterations": 2, "seed": 7},
}

dag = build_mop_dag(spec, dag_id="my_selection")
