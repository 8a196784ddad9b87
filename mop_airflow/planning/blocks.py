"""The step between two blocks of an adaptive search: read what the block's hops recorded, ask the
search method what trains next, and deal the next block's configurations into offset classes.

A block is one iteration of hops (every class's chains visit every shard once), so every rung,
which ends at a whole number of iterations, ends at a block's end, where every configuration has
seen every shard equally often. Between blocks:

1. :func:`completions` turns the hop records into what the methods read: which configuration
   completed which rung with which metric (its evaluation at the rung's last hop), or failed, in the
   order the records were saved (ties by configuration id), so the same records always give the
   same order;
2. the method (:mod:`mop_airflow.search.asha`, :mod:`mop_airflow.search.halving`) hands out jobs
   for the capacity that is free;
3. :func:`next_classes` places each configuration that trains in the next block, the ones still
   on their job and the new ones, in the offset class of the shard its next hop visits. A
   configuration keeps its rotation inside an iteration; at an iteration's start it may take any,
   so new jobs go to the classes with the fewest configurations.

Pure: reads records, no Airflow, no TensorFlow.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from mop_airflow.records import HopRecord
from mop_airflow.search.jobs import Completion, Job


def completions(records: Sequence[HopRecord], jobs: Sequence[Job], *, shards: int, metric: str) -> list[Completion]:
    """What ``jobs`` came to, in the order their hops were saved: a rung completed with the
    configuration's ``metric`` at the job's last hop, or a failure on the way. Jobs still training
    give nothing."""
    by_hop = {(r.config_id, r.t): r for r in records}
    failures = sorted((r for r in records if r.status != "ok"), key=lambda r: r.t)
    found: list[tuple[float, str, Completion]] = []
    for job in jobs:
        last = job.iterations * shards - 1
        record = by_hop.get((job.config_id, last))
        failed = next((r for r in failures if r.config_id == job.config_id and r.t <= last), None)
        if failed is not None:
            found.append((failed.saved_at or 0.0, job.config_id, Completion(
                job.config_id, job.rung, None, failed.status, failed.error, bracket=job.bracket)))
        elif record is not None and record.status == "ok":
            value = (record.val_metrics or {}).get(metric)
            finite = isinstance(value, (int, float)) and math.isfinite(value)
            found.append((record.saved_at or 0.0, job.config_id, Completion(
                job.config_id, job.rung, value if finite else None, "ok" if finite else "diverged",
                None if finite else f"{metric} is {value!r} after the rung", bracket=job.bracket)))
    return [c for _, _, c in sorted(found, key=lambda f: (f[0], f[1]))]


def next_classes(training: Mapping[str, int], new: Sequence[str], *, shards: int,
                 rotation: Mapping[str, int]) -> tuple[list[list[str]], dict[str, int]]:
    """The next block's offset classes, and every configuration's rotation.

    ``training``: configuration -> hops it has trained (all at an iteration's start here, since a
    block is an iteration); ``rotation``: the offset each had (its hop ``t`` was on shard
    ``(offset + t) mod shards``). A configuration in the middle of a job keeps its rotation; ``new``
    ones (just started or promoted, listed in the order the method handed them out) join the class
    with the fewest configurations, the lowest first."""
    classes: list[list[str]] = [[] for _ in range(shards)]
    offsets: dict[str, int] = {}
    for cid in sorted(c for c in training if c not in new):
        offset = rotation.get(cid, 0)
        classes[(offset + training[cid]) % shards].append(cid)
        offsets[cid] = offset
    for cid in new:
        o = min(range(shards), key=lambda k: (len(classes[k]), k))
        classes[o].append(cid)
        offsets[cid] = (o - training.get(cid, 0)) % shards
    return classes, offsets
