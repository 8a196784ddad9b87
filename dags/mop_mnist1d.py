"""Example: MOP model selection on MNIST-1D — MLP vs 1-D CNN x 2 learning rates x 2 batch sizes.

The data comes from `mop-airflow example-data` (generated offline by the mnist1d package). The
validation set is MNIST-1D's own test split. Nothing here imports TensorFlow: the models are named
by import path and built on the workers.
"""

from mop_airflow import build_mop_dag
from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec, mnist1d_grid_search

spec = {
    "data": mnist1d_data_spec(),
    "search": mnist1d_grid_search(),
    "schedule": {"shards": 4, "iterations": 3, "epochs_per_hop": 1, "seed": 42},
}

dag = build_mop_dag(spec, dag_id="mop_mnist1d", tags=["mop_airflow", "example"], doc_md=__doc__)
