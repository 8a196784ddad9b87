"""Airflow plugins of mop_airflow (installed as mop_airflow.plugins)."""
