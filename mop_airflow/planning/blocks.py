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

:func:`first_block` (the plan task) and :func:`decide_next_block` (the ``decide`` task at the end of
every block's run) write each block's :class:`~mop_airflow.records.BlockDecision`; the stage tasks of
the block's run hand its bundles to the chains. Reads and writes records only: no Airflow, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from mop_airflow.errors import StoreError
from mop_airflow.planning.plan import bundle_classes, class_chains, rung_classes
from mop_airflow.records import BlockDecision, HopRecord, Plan, RunRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.search.adaptive import adaptive_plan, brackets_of, split_by_bracket
from mop_airflow.search.asha import AshaPlan, next_jobs
from mop_airflow.search.halving import halving_jobs
from mop_airflow.search.jobs import Completion, Job

# Configurations a block trains per slot of every shard: more than one, so that each shard has a
# configuration heading to it while another waits (simulated at R=81 on 16 shards: slot use 0.747
# with two per slot against 0.730 with one; benchmarks/schedule_sim.py --adaptive).
PER_SLOT = 2


def block_capacity(shards: int, slots: int, plan: Any) -> int:
    """How many configurations one block trains at most (the chains the DAG renders hold them):
    ASHA keeps two per slot busy; Hyperband starts every bracket at once, side by side (MADlib's
    "on the diagonal"), so every configuration of its first rungs."""
    return PER_SLOT * shards * slots if isinstance(plan, AshaPlan) else plan.total_configurations


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
                 rotation: Mapping[str, int], placed: Mapping[str, int] | None = None
                 ) -> tuple[list[list[str]], dict[str, int]]:
    """The next block's offset classes, and every configuration's rotation.

    ``training``: configuration -> hops it has trained (all at an iteration's start here, since a
    block is an iteration); ``rotation``: the offset each had (its hop ``t`` was on shard
    ``(offset + t) mod shards``). A configuration in the middle of a job keeps its rotation; ``new``
    ones (just started or promoted, listed in the order the method handed them out) take the offset
    ``placed`` gives them, or join the class with the fewest configurations, the lowest first."""
    classes: list[list[str]] = [[] for _ in range(shards)]
    offsets: dict[str, int] = {}
    for cid in sorted(c for c in training if c not in new):
        offset = rotation.get(cid, 0)
        classes[(offset + training[cid]) % shards].append(cid)
        offsets[cid] = offset
    for cid in new:
        if placed is not None and cid in placed:
            offsets[cid] = placed[cid]
            classes[(placed[cid] + training.get(cid, 0)) % shards].append(cid)
            continue
        o = min(range(shards), key=lambda k: (len(classes[k]), k))
        classes[o].append(cid)
        offsets[cid] = (o - training.get(cid, 0)) % shards
    return classes, offsets


def first_block(run: RunRecord, plan: Plan) -> BlockDecision:
    """Block 0: what the method starts with an empty record and the whole capacity free."""
    return _decision(run, plan, block=0, previous=None, new=[], jobs_so_far=[])


def decide_next_block(layout: RunLayout, run: RunRecord, plan: Plan, block: int) -> BlockDecision:
    """After block ``block`` trained: its completions, the method's jobs for the capacity they freed,
    and block ``block + 1``'s classes and bundles, written to the store (and returned)."""
    store = layout.store
    decisions = [BlockDecision.read(store, layout.block_decision_uri(b)) for b in range(block + 1)]
    jobs = [Job(**job) for d in decisions for job in d.jobs]
    current = {job.config_id: job for job in jobs}  # each configuration's latest job
    here = decisions[-1]
    shards = plan.shards
    records = [r for cid, hops in here.training.items() for r in _block_records(layout, cid, hops, shards)]
    new = completions(records, [current[cid] for cid in here.training], shards=shards, metric=run.metric)
    out = _decision(run, plan, block=block + 1, previous=here, new=new, jobs_so_far=jobs)
    out.write(store, layout.block_decision_uri(block + 1))
    return out


def _decision(run: RunRecord, plan: Plan, *, block: int, previous: BlockDecision | None,
              new: list[Completion], jobs_so_far: list[Job]) -> BlockDecision:
    shards, schedule = plan.shards, run.schedule
    method = adaptive_plan(run.adaptive, shards)
    capacity = block_capacity(shards, schedule.slots_per_shard, method)
    seen = [Completion(**c) for c in (previous.completions if previous else [])] + new
    ended = {c.config_id for c in new}
    busy = {cid: hops + shards for cid, hops in (previous.training if previous else {}).items() if cid not in ended}
    promoted = [(j.config_id, j.rung - 1) for j in jobs_so_far if j.kind == "promote"]
    started = [j.config_id for j in jobs_so_far if j.kind == "start"]
    draw, free = [c["config_id"] for c in run.configs], max(0, capacity - len(busy))
    if isinstance(method, AshaPlan):
        handed = next_jobs(method, seen, promoted, started, draw, free, direction=run.direction)
    else:
        handed = halving_jobs(brackets_of(method), split_by_bracket(draw, method), seen, promoted, started, free,
                              direction=run.direction)
    trained = {j.config_id: j.iterations * shards for j in jobs_so_far}  # where a finished job left each one
    training = {**busy, **{j.config_id: (0 if j.kind == "start" else trained[j.config_id]) for j in handed}}
    classes, offsets = next_classes(training, [j.config_id for j in handed], shards=shards,
                                    rotation=previous.offsets if previous else {},
                                    placed=None if isinstance(method, AshaPlan) else _rung_deal(run, plan, handed))
    bundles = bundle_classes(run, classes, hops=shards, rows=plan.shard_rows, chains=class_chains(plan.chains, "", shards))
    return BlockDecision(block=block, capacity=capacity, jobs=[j.to_dict() for j in handed],
                         completions=[dataclasses.asdict(c) for c in seen], training=training, offsets=offsets,
                         bundles=bundles, finished=not training)


def _rung_deal(run: RunRecord, plan: Plan, handed: Sequence[Job]) -> dict[str, int]:
    """Hyperband's new rung members take the offsets the rung's seeded deal gives them, the same deal a
    search drawn into one DAG makes (:func:`mop_airflow.planning.plan.rung_classes`), so a search
    decided between blocks visits the shards in the same order and trains the same models."""
    groups: dict[tuple[int | None, int], list[str]] = {}
    for job in handed:
        groups.setdefault((job.bracket, job.rung), []).append(job.config_id)
    placed = {}
    for (bracket, rung), ids in groups.items():
        for offset, members in enumerate(rung_classes(run, ids, rows=plan.shard_rows, seed=plan.seed,
                                                      bracket=bracket, rung=rung)):
            placed.update({cid: offset for cid in members})
    return placed


def _block_records(layout: RunLayout, cid: str, hops: int, shards: int) -> list[HopRecord]:
    """The records of the hops ``cid`` trained in one block (from hop ``hops``); a hop it has none of
    (its task failed or was skipped) is a failure, so the configuration trains no further."""
    out = []
    for t in range(hops, hops + shards):
        try:
            record = HopRecord.read(layout.store, layout.hop_record_uri(cid, t))
        except StoreError:
            out.append(HopRecord(config_id=cid, t=t, iteration=t // shards, hop=t % shards, shard=-1, status="failed",
                                 error=f"no record of hop {t}: its task did not train it"))
            break
        out.append(record)
        if record.status != "ok":
            break
    return out
