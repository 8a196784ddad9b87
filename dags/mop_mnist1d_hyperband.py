"""Example: Hyperband on MNIST-1D with MOP — R=9 iterations, eta=3, 4 shards.

17 configurations drawn at random (MLP or 1-D CNN, log-uniform learning rate, batch size) over three
brackets that run side by side. The search trains in blocks to the rung ends (1, 3 and 9 iterations):
each block is one train task per shard, and its `decide` task promotes the best third of every rung
that ended there and prunes the rest. The 3 blocks fit one DAG run, so `airflow dags test` runs the
search whole. Print the schedule first with `mop-airflow plan --R 9 --eta 3 --shards 4`.

The trigger form picks the architectures, optimizers, the learning-rate range and the batch sizes
per run; R and eta are fixed here, as they decide the brackets, the rungs and the DAG's blocks.
"""

from mop_airflow import build_mop_dag
from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec, mnist1d_random_space

spec = {
    "data": mnist1d_data_spec(),
    "search": {
        "space": mnist1d_random_space(seed=7),
        "metric": "val_accuracy",
        "adaptive": {"method": "hyperband", "R": 9, "eta": 3},
    },
    "schedule": {"shards": 4, "seed": 42},
}

dag = build_mop_dag(spec, dag_id="mop_mnist1d_hyperband", tags=["mop_airflow", "example", "hyperband"], doc_md=__doc__)
