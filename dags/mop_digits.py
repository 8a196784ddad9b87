"""Example: images as a tensor column — a 2-D CNN against an MLP on scikit-learn's 8x8 digits.

The data comes from `mop-airflow example-data`: a folder of four Parquet files whose ``pixels``
column holds each image as 64 numbers, declared with shape [8, 8, 1]; the builders get
``input_shape=(8, 8, 1)``. The classes are left out: validation finds them in the data.
"""

from mop_airflow import build_mop_dag
from mop_airflow.examples.sklearn_data import digits_data_spec, digits_search

spec = {
    "data": digits_data_spec(),
    "search": digits_search(),
    "schedule": {"shards": 2, "iterations": 3, "epochs_per_hop": 1, "seed": 7},
}

dag = build_mop_dag(spec, dag_id="mop_digits", tags=["mop_airflow", "example"], doc_md=__doc__)
