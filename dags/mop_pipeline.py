"""Example: model selection inside your own pipeline — extract >> select a model >> deploy.

``extract`` writes scikit-learn's digits (the 8x8 images as a tensor column) to a folder named
after the run's date and returns its path; the ``model_selection`` group (a MopTaskGroup) trains on
whatever path that task returned; ``deploy`` loads the winner from ``selection.output`` and scores
a batch of the freshly extracted data with it. Nothing here imports TensorFlow at parse time.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import dag, task

from mop_airflow import MopTaskGroup
from mop_airflow.examples.sklearn_data import digits_search

SPEC = {
    "data": {"label": "label", "validation": 0.2, "features": {"pixels": {"shape": [8, 8, 1]}}},
    "search": digits_search(),  # a 2-D CNN against an MLP, two learning rates
    "schedule": {"shards": 2, "iterations": 2, "seed": 7},
}


@dag(dag_id="mop_pipeline", schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
     catchup=False, tags=["mop_airflow", "example"], doc_md=__doc__)
def mop_pipeline():
    @task
    def extract(ds: str | None = None) -> str:
        """Today's training data, in a folder of its own (the digits stand in for a real extract)."""
        import os  # noqa: PLC0415

        from mop_airflow.examples.sklearn_data import write_digits  # noqa: PLC0415
        from mop_airflow.config import default_home  # noqa: PLC0415

        return write_digits(os.path.join(default_home(), "data", "pipeline", ds or "manual"))

    @task
    def deploy(summary: dict, data_folder: str) -> dict:
        """Load the winner the selection reported and score a batch of the extracted data with it."""
        import os  # noqa: PLC0415

        import pyarrow.parquet as pq  # noqa: PLC0415

        from mop_airflow.results.runs import run_layout  # noqa: PLC0415
        from mop_airflow.serving.predict import predict  # noqa: PLC0415

        layout = run_layout(summary["store_root"], summary["selection_id"], summary["run_id"])
        out = os.path.join(data_folder, "scores.parquet")
        scored = predict(layout, os.path.join(data_folder, "part-0.parquet"), out, id_column="label")
        table = pq.read_table(out)
        hits = sum(int(p) == int(y) for p, y in zip(table["response"].to_pylist(), table["label"].to_pylist()))
        return {"model": summary["best_model_uri"], "config_id": summary["best_config_id"],
                "rows": scored["rows"], "accuracy": hits / scored["rows"], "scores": out}

    data = extract()
    spec = {**SPEC, "data": {**SPEC["data"], "source": data}}
    selection = MopTaskGroup(spec, group_id="model_selection")
    deploy(selection.output, data)


dag = mop_pipeline()
