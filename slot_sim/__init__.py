"""Deterministic simulation of the slot protocol (:mod:`mop_airflow.slots`), for the tests and the docs.

Not part of the runtime package: nothing under ``mop_airflow`` imports it. ``python -m slot_sim --help``
from the repository's root runs schedules; :mod:`slot_sim.run` says how.
"""
from slot_sim.run import RULES, check, diagnose, main, run_many, run_one  # noqa: F401
