"""A long plain search split over several DAG runs of the same DAG: one block of iterations each.

Airflow's scheduler checks every waiting task instance of a run against the run's finished ones in
every loop (TriggerRuleDep and NotPreviouslySkippedDep), so a loop costs about waiting x finished
task instances: 256 configurations x 16 shards x 10 iterations in one run (2,560 hop task
instances) took 2.6 s a loop. Past ``RUN_HOP_BUDGET`` hop task instances a run, the DAG renders
the hops of ``iterations_per_run`` iterations only, and its runs take turns:

* the first run (the one a person or a schedule triggered) resolves, shards and plans the search
  as always and trains its first block of iterations;
* its ``next_run`` task then triggers the DAG's next run with a conf that says which search it
  continues and from which hop (:class:`Continuation`), and leaves a pointer in that run's folder;
* a continuing run reads the first run's records (its folder holds the whole search), resumes each
  bundle from its configurations' checkpoints, and trains the next block; the last block reports.

So the search's records, checkpoints, report and champion live under the first run's id; any run
of the chain resolves to that folder (:func:`mop_airflow.records.layout.run_folder`). Pure: no Airflow.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mop_airflow.errors import SpecError
from mop_airflow.records import Continuation

# The hop task instances one DAG run holds at most when the split is automatic. The scheduling
# loop grows with waiting x finished task instances. 256 x 16 x 10 on the embedded Airflow
# (benchmarks/dag_scale.py, 2 cores): 2,560 a run, loop median 2.6 s; 512, 0.44 s (p90 1.4 s);
# 256, 0.21 s (p90 0.42 s).
RUN_HOP_BUDGET = 256
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


def hops_per_run(iterations: int, shards: int, setting: int | float | str, hop_tasks: Callable[[int], int],
                 budget: int = RUN_HOP_BUDGET) -> int:
    """How many hops one DAG run trains. ``hop_tasks(h)`` is the hop task instances a run of ``h``
    hops renders.

    Whole iterations as :func:`iterations_per_run` gives them; when even one iteration's hop tasks
    pass ``budget`` under ``"auto"`` (a run's tasks grow with shards squared: 64 shards render 4,169
    a run), a block shorter than an iteration: the most hops that fit, a divisor of ``shards`` so that
    every run renders the same tasks. A fraction below 1 (validated by the spec: it times ``shards`` is
    a divisor of ``shards``) sets such a block by hand."""
    if isinstance(setting, float):
        return round(setting * shards)
    k = iterations_per_run(iterations, setting, lambda n: hop_tasks(n * shards), budget)
    if setting != "auto" or hop_tasks(k * shards) <= budget:
        return k * shards
    return max((d for d in range(1, shards + 1) if shards % d == 0 and hop_tasks(d) <= budget), default=1)


def iterations_per_run(iterations: int, setting: int | str, hops_of: Callable[[int], int],
                       budget: int = RUN_HOP_BUDGET) -> int:
    """How many iterations one DAG run trains. ``hops_of(k)`` is the hop task instances a run of
    ``k`` iterations renders.

    ``"auto"``: every iteration in one run when that fits ``budget``; else the largest divisor of
    ``iterations`` that fits (every run then renders the same tasks), at least one. A whole number
    must divide ``iterations``.
    """
    if setting != "auto":
        k = int(setting)
        if iterations % k:
            divisors = [d for d in range(1, iterations + 1) if iterations % d == 0]
            raise SpecError("schedule.iterations_per_run", setting,
                            f"must divide schedule.iterations ({iterations}): every DAG run trains the same number of "
                            "iterations", f"use one of {divisors}, or \"auto\"")
        return k
    fitting = [k for k in range(1, iterations + 1) if iterations % k == 0 and hops_of(k) <= budget]
    return max(fitting, default=1)
