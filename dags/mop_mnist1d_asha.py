"""Example: ASHA on MNIST-1D with MOP — 27 configurations, rungs at 1, 3 and 9 iterations, 4 shards.

Asynchronous successive halving (Li et al., MLSys 2020): whenever capacity frees up, the best third
of a rung that has not gone on yet is promoted to the next rung, and only when none can be does a
new configuration start. No slot waits for a rung to fill. The search is decided between blocks of
one iteration, one block a DAG run: each run trains a block of hops, then its ``decide`` task reads
the block's hop records, decides what trains next and starts the DAG's next run, until nothing is
left; the last run reports. So the DAG holds one block whatever ``n`` and ``R`` are.
It runs on Airflow (``mop-airflow up``, then trigger it), not under ``dag.test()``, which runs one run.
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
