"""Moved to :mod:`mop_airflow.deployment.preload` (the preload hook a task host's
``airflow_local_settings.py`` calls); importing this old path warns (DeprecationWarning) and gives
that module."""

from mop_airflow.airflow._moved import moved

moved("mop_airflow.airflow.preload", "mop_airflow.deployment.preload")
