"""mop_airflow: model hopper parallelism (MOP) model selection for Keras on Apache Airflow 3.

The core (spec, search, schedule, data, training, store) imports neither Airflow nor TensorFlow at
import time. ``build_mop_dag`` (:mod:`mop_airflow.airflow.dag`) and ``MopTaskGroup``
(:mod:`mop_airflow.airflow.group`) are loaded on first use.
"""

from mop_airflow.errors import DataValidationError, MopError, PoolsMissingError, SpecError
from mop_airflow.config import DataSpec, MopSpec, ScheduleSpec, SearchSpec, StoreSpec
from mop_airflow.search.space import SearchSpace

__version__ = "0.1.0"

__all__ = ["DataSpec", "DataValidationError", "MopError", "MopSpec", "PoolsMissingError", "ScheduleSpec",
           "SearchSpace", "SearchSpec", "SpecError", "StoreSpec", "MopTaskGroup", "build_mop_dag", "__version__"]


def __getattr__(name: str):
    if name == "build_mop_dag":
        from mop_airflow.airflow.dag import build_mop_dag

        return build_mop_dag
    if name == "MopTaskGroup":
        from mop_airflow.airflow.group import MopTaskGroup

        return MopTaskGroup
    raise AttributeError(name)
