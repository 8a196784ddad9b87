"""Example: population-based training on MNIST-1D with MOP — 8 members, 12 iterations, 4 shards.

Jaderberg et al.'s PBT with Ray Tune's options: every 2 iterations the population is ranked on the
validation accuracy, and each of the bottom quarter copies one of the top quarter (its checkpoint,
weights and Adam moments) and goes on with the learning rate and batch size explored (x1.2 or x0.8,
a neighbouring batch size, or a fresh draw a quarter of the time). The copies are new
configurations whose records say who copied whom, when, and what changed; the results page draws
the family tree. Decided between blocks of one interval (2 iterations); its 6 blocks fit one DAG run
(each block's train tasks wait for the decision after the one before), so ``airflow dags test`` runs
it whole.
"""

from mop_airflow import build_mop_dag
from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec

LEARNING_RATE = {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2}
spec = {
    "data": mnist1d_data_spec(),
    "search": {
        "space": {"method": "random", "seed": 7, "params": {
            "model": "mop_airflow.examples.mnist1d_models:cnn",
            "learning_rate": LEARNING_RATE, "batch_size": [32, 64, 128]}},
        "metric": "val_accuracy",
        "adaptive": {"method": "pbt", "population": 8, "iterations": 12, "interval": 2, "quantile": 0.25,
                     "resample_probability": 0.25,
                     "mutations": {"learning_rate": LEARNING_RATE, "batch_size": [32, 64, 128]}},
    },
    "schedule": {"shards": 4, "seed": 42},
}

dag = build_mop_dag(spec, dag_id="mop_mnist1d_pbt", tags=["mop_airflow", "example", "pbt"], doc_md=__doc__)
