"""Example: ASHA on MNIST-1D with MOP — 27 configurations, rungs at 1, 3 and 9 iterations, 4 shards.

Asynchronous successive halving (Li et al., MLSys 2020): whenever a shard slot has nothing ready to
train, it asks what trains next: the best third of a rung that has not gone on yet is promoted to the
next rung, and only when none can be does a new configuration start. No slot waits for a rung to fill,
and no DAG run waits for a decision: the search is one block of train tasks, one per shard slot, whose
slots decide as they go (each decision taken once, whoever asks first, and recorded with what it saw).
It runs whole in one DAG run, on Airflow (``mop-airflow up``, then trigger it) or under ``dag.test()``.
"""

from mop_airflow import build_mop_dag
from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec, mnist1d_random_space

spec = {
    "data": mnist1d_data_spec(),
    "search": {
        "space": mnist1d_random_space(seed=7),
        "metric": "val_accuracy",
        "adaptive": {"method": "asha", "n": 27, "r": 1, "R": 9, "eta": 3},
    },
    "schedule": {"shards": 4, "seed": 42},
}

dag = build_mop_dag(spec, dag_id="mop_mnist1d_asha", tags=["mop_airflow", "example", "asha"], doc_md=__doc__)
