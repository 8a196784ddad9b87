"""Moved to :mod:`mop_airflow.deployment.local` (a real Airflow on this machine: LocalAirflow,
throwaway_postgres, CeleryWorker, worker_hostname); importing this old path warns
(DeprecationWarning) and gives that module."""

from mop_airflow.airflow._moved import moved

moved("mop_airflow.airflow.local", "mop_airflow.deployment.local")
