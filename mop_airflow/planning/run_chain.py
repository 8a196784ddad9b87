"""A long plain search split over several DAG runs of the same DAG: one block of iterations each.

A run renders one train task per shard slot however many hops it trains, so a search stays in one
run unless ``schedule.iterations_per_run`` splits it (a search longer than you want one run to last,
say); then the DAG renders the hops of ``iterations_per_run`` iterations, and its runs take turns:

* the first run (the one a person or a schedule triggered) resolves, shards and plans the search
  as always and trains its first block of iterations;
* its ``next_run`` task then triggers the DAG's next run with a conf that says which search it
  continues and from which hop (:class:`Continuation`), and leaves a pointer in that run's folder;
* a continuing run reads the first run's records (its folder holds the whole search), resumes each
  configuration from its checkpoint, and trains the next block; the last block reports.

So the search's records, checkpoints, report and champion live under the first run's id; any run
of the chain resolves to that folder (:func:`mop_airflow.records.layout.run_folder`). Pure: no Airflow.
"""

from __future__ import annotations

from typing import Any, Mapping

from mop_airflow.errors import SpecError
from mop_airflow.records import Continuation

CONF_KEY = "mop_continues"  # the trigger conf key of a continuing run


def continuation_of(conf: Any) -> Continuation | None:
    """The continuation a run's trigger conf names, None for a search's first run. The ``next_run``
    task writes it; one written by hand that cannot be read is a :class:`SpecError`."""
    value = conf.get(CONF_KEY) if isinstance(conf, Mapping) else None
    if value is None:
        return None
    try:
        found = Continuation.from_dict(value)
    except (TypeError, AttributeError):  # not a mapping, or a field missing
        found = None
    if (found is None or not isinstance(found.first_run, str) or not found.first_run
            or any(type(n) is not int or n < 1 for n in (found.block, found.start))):
        raise SpecError(f"conf.{CONF_KEY}", value, "must be {\"first_run\": <run id>, \"block\": <1 or more>, "
                        "\"start\": <hop, 1 or more>}, as a search's next_run task writes it",
                        f"trigger without {CONF_KEY} to start a new search; a split search starts its next runs itself")
    return found


def next_run_id(first_run: str, block: int) -> str:
    """The run id of block ``block`` of the search that ``first_run`` started: readable in the grid,
    and the same on a retry, so a retried ``next_run`` task never starts a block twice."""
    return f"{first_run}__block_{block}"


def hops_per_run(iterations: int, shards: int, setting: int | str) -> int:
    """How many hops one DAG run of a plain search trains: whole iterations, as :func:`iterations_per_run`
    gives them (a run renders one train task per shard slot however many hops it trains, so nothing
    but the setting splits a search)."""
    return iterations_per_run(iterations, setting) * shards


def iterations_per_run(iterations: int, setting: int | str) -> int:
    """How many iterations one DAG run trains: all of them (``"auto"``), or a whole number that divides
    ``iterations``, so that every run renders the same tasks."""
    if setting == "auto":
        return iterations
    k = int(setting)
    if iterations % k:
        divisors = [d for d in range(1, iterations + 1) if iterations % d == 0]
        raise SpecError("schedule.iterations_per_run", setting,
                        f"must divide schedule.iterations ({iterations}): every DAG run trains the same number of "
                        "iterations", f"use one of {divisors}, or \"auto\"")
    return k
