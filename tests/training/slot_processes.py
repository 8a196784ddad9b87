"""Processes for shard slots in the tests, started as an Airflow worker starts its tasks.

A worker forks each task from a process that imported the training stack once
(:mod:`mop_airflow.deployment.preload`): a task starts with Keras loaded and nothing built. Spawned processes
each imported TensorFlow and Keras again instead, about 5 CPU-seconds a process on a 2-core machine, for
18 slot processes in the suite. A forkserver that imports them once and forks every slot process gives
each the same start as a worker's task: its own process, its own Keras session, no model and no state of
the test that started it.
"""

from __future__ import annotations

import multiprocessing

# What the forkserver imports before it forks: the training stack (as the preload does) and the test
# modules' own imports. The first test of a pytest process to ask starts the server.
PRELOAD = ["keras", "numpy", "pyarrow.parquet", "mop_airflow.slots.driver", "mop_airflow.training.model_hop",
           "mop_airflow.data.shard", "mop_airflow.planning.resolve", "tests.training.toys"]


def slot_context() -> multiprocessing.context.BaseContext:
    """The context to start slot processes with (``context.Process``)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context
