"""Airflow operators of mop_airflow (installed as mop_airflow.operators)."""
