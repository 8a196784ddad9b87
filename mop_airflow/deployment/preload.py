"""Import the training stack (and the data validation's) once in the process that forks task processes.

Importing TensorFlow/Keras costs ~4 s of CPU per process (far more when several hops start at once
on a small machine), and every Airflow task is a fresh process. Airflow 3 forks each task from its
executor's worker (LocalExecutor: forked from the scheduler; Celery: from the worker's pool), so a
module imported there before the fork is already loaded in every task: the hop skips the import.
Nothing is executed on TensorFlow before the fork (no op, no thread pool), which keeps it fork-safe.

Enable it in ``$AIRFLOW_HOME/config/airflow_local_settings.py``::

    from mop_airflow.deployment.preload import preload_if_task_host
    preload_if_task_host()

``mop-airflow demo`` does this for its embedded Airflow.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Sequence

from mop_airflow.config.environment import env

LOCAL_SETTINGS = (
    "# Written by mop_airflow: preload Keras in the processes that fork task processes.\n"
    "from mop_airflow.deployment.preload import preload_if_task_host\n\n"
    "preload_if_task_host()\n"
)


def is_task_host(argv: Sequence[str], executor: str) -> bool:
    """True for Celery workers, and for the scheduler when its LocalExecutor forks the tasks."""
    args = [a for a in argv[1:] if not a.startswith("-")]
    return args[:2] == ["celery", "worker"] or (args[:1] == ["scheduler"] and "LocalExecutor" in executor)


def preload_training_stack() -> float:
    started = time.time()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras  # noqa: F401, PLC0415
    import numpy  # noqa: F401, PLC0415
    import pyarrow.parquet  # noqa: F401, PLC0415
    # The scatter tasks validate the data with Great Expectations: 2.8 s more to import, on the
    # critical path of every run before the first hop. It starts no thread when imported.
    import great_expectations  # noqa: F401, PLC0415

    import mop_airflow.data.cache  # noqa: F401, PLC0415
    import mop_airflow.training.builder  # noqa: F401, PLC0415
    import mop_airflow.training.checkpoint  # noqa: F401, PLC0415
    import mop_airflow.training.hop  # noqa: F401, PLC0415

    return time.time() - started


def preload_if_task_host(argv: Sequence[str] | None = None) -> bool:
    if env("MOP_PRELOAD", "1") == "0":
        return False
    from airflow.configuration import conf  # noqa: PLC0415 - loaded before local settings are imported

    if not is_task_host(argv or sys.argv, conf.get("core", "executor", fallback="")):
        return False
    try:
        preload_training_stack()
    except Exception as exc:  # noqa: BLE001 - a broken preload must never take the scheduler down
        print(f"mop_airflow: preload skipped ({exc!r}); tasks will import Keras themselves", file=sys.stderr)
        return False
    return True
