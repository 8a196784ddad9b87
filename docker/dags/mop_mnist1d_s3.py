"""The demo's search (dags/mop_mnist1d.py: MLP vs 1-D CNN x 2 learning rates x 2 batch sizes, 4 shards,
3 iterations) with its data and its store on S3, for docker/docker-compose.yaml: the containers share no
file system, so the init service writes the example data to the S3 service's bucket ``mop`` and every
container reads it, and keeps the run's records, checkpoints and report there, through the connection
``aws_default`` (AIRFLOW_CONN_AWS_DEFAULT in the compose file)."""

from mop_airflow import build_mop_dag
from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec, mnist1d_grid_search

spec = {
    "data": {**mnist1d_data_spec("s3://mop/data/mnist1d"), "conn_id": "aws_default"},
    "search": mnist1d_grid_search(),
    "schedule": {"shards": 4, "iterations": 3, "epochs_per_hop": 1, "seed": 42},
    "store": {"root": "s3://mop/runs", "conn_id": "aws_default"},
}

dag = build_mop_dag(spec, dag_id="mop_mnist1d_s3", tags=["mop_airflow", "example"], doc_md=__doc__)
