"""Example: a model-based random search (TPE) on MNIST-1D with MOP — 16 configurations, 4 shards.

The first 8 configurations are drawn at random; each later one is proposed by Optuna's TPE sampler
from the validation accuracy of those that finished, instead of drawn blindly. A block holds 8
configurations (two per shard), so the search trains in two waves of 3 iterations each: the second
wave is TPE's. Its 2 blocks, one a wave, fit one DAG run, so ``airflow dags test`` runs it whole.
"""

from mop_airflow import build_mop_dag
from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec, mnist1d_random_space

space = {**mnist1d_random_space(seed=7), "num_samples": 16, "sampler": "tpe", "startup": 8}
spec = {
    "data": mnist1d_data_spec(),
    "search": {"space": space, "metric": "val_accuracy"},
    "schedule": {"shards": 4, "iterations": 3, "seed": 42},
}

dag = build_mop_dag(spec, dag_id="mop_mnist1d_tpe", tags=["mop_airflow", "example", "tpe"], doc_md=__doc__)
