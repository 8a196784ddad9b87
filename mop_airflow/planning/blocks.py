"""The step between two blocks of an adaptive search: read what the block's hops recorded, ask the
search method what trains next, and deal the next block's configurations into offset classes.

A block trains every configuration in it from where it stands to the next decision point: the
earliest end of any of its jobs (:func:`block_length`). Jobs end at whole iterations (a rung's end,
PBT's boundary), where every configuration has seen every shard equally often, so Hyperband's brackets
side by side (R=81, eta=3: rungs end at iteration 1, 3, 9, 27 or 81) take five blocks, PBT one block
per ``interval``, and ASHA a block each time one of its jobs ends. Between blocks:

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
every block's run) write each block's :class:`~mop_airflow.records.BlockDecision`, which the block's
train tasks read as they start (:func:`mop_airflow.planning.resume.decision_classes`). Reads and writes
records only: no Airflow, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Mapping, Sequence

from mop_airflow.errors import StoreError
from mop_airflow.planning.plan import lineup_classes, rung_classes
from mop_airflow.records import BlockDecision, HopRecord, Plan, RunRecord
from mop_airflow.records.layout import RunLayout, with_proposed
from mop_airflow.search.adaptive import LADDERS, adaptive_plan, brackets_of, split_by_bracket
from mop_airflow.search.asha import AshaPlan, next_jobs
from mop_airflow.search.halving import halving_jobs
from mop_airflow.search.jobs import Completion, Job
from mop_airflow.search.pbt import Exploit, PbtPlan, pbt_decision
from mop_airflow.search.space import config_id


def block_capacity(shards: int, slots: int, plan: Any) -> int:
    """How many configurations one block trains at most (the chains the DAG renders hold them):
    ASHA keeps two per slot busy, or one under a budget (:meth:`AshaPlan.capacity`); Hyperband
    starts every bracket at once, side by side (MADlib's "on the diagonal"), so every configuration
    of its first rungs; PBT's whole population trains together."""
    return plan.capacity(shards * slots) if isinstance(plan, AshaPlan) else plan.total_configurations


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


def block_length(training: Mapping[str, int], jobs: Sequence[Job], shards: int) -> tuple[int, list[str]]:
    """How many hops a block trains, and whose job ends at its end: every configuration trains to the
    next decision point, the earliest end of any job in the block (a rung's end, PBT's next
    boundary); the search decides nothing in between, so a block never stops short of one."""
    end = {job.config_id: job.iterations * shards for job in jobs}  # each configuration's latest job
    if not training:
        return shards, []
    length = max(1, min(end[cid] - hops for cid, hops in training.items()))
    return length, sorted(cid for cid, hops in training.items() if hops + length == end[cid])


def decision_or_end(layout: RunLayout, block: int) -> BlockDecision | None:
    """Block ``block``'s decision, or None when the search ended at an earlier block of the same run:
    the decide steps after the one that found nothing left write no decision, and their blocks train
    nothing. A decision missing while the search goes on is a :class:`StoreError` naming the step to clear."""
    store = layout.store
    uri = layout.block_decision_uri(block)
    if store.exists(uri):
        return BlockDecision.read(store, uri)
    earlier = next((b for b in range(block - 1, -1, -1) if store.exists(layout.block_decision_uri(b))), None)
    if earlier is not None and BlockDecision.read(store, layout.block_decision_uri(earlier)).finished:
        return None
    raise StoreError(f"no decision for block {block + 1} ({uri}), and the search has not ended. Fix: clear the "
                     f"decide task of block {block} so it decides again")


def first_block(layout: RunLayout, run: RunRecord, plan: Plan) -> BlockDecision:
    """Block 0: what the method starts with an empty record and the whole capacity free, written to
    the store (and returned), with the configurations it proposed (TPE past its start-up draw)."""
    decision, made = _decision(run, plan, block=0, previous=None, new=[], jobs_so_far=[])
    return _commit(layout, decision, made, plan.shards)


def decide_next_block(layout: RunLayout, run: RunRecord, plan: Plan, block: int) -> BlockDecision:
    """After block ``block`` trained: its completions, the method's jobs for the capacity they freed,
    and block ``block + 1``'s classes and their lineup, written to the store (and returned). Configurations
    made here (PBT's copies) are added to the search's ``proposed.json`` and copies' checkpoints
    written before the decision that names them."""
    store = layout.store
    decisions = [BlockDecision.read(store, layout.block_decision_uri(b)) for b in range(block + 1)]
    jobs = [Job(**job) for d in decisions for job in d.jobs]
    current = {job.config_id: job for job in jobs}  # each configuration's latest job
    here = decisions[-1]
    shards = plan.shards
    length = here.length(shards)
    records = [r for cid, hops in here.training.items() for r in _block_records(layout, cid, hops, length, shards)]
    new = completions(records, [current[cid] for cid in here.training], shards=shards, metric=run.metric)
    out, made = _decision(with_proposed(layout, run), plan, block=block + 1, previous=here, new=new, jobs_so_far=jobs)
    return _commit(layout, out, made, shards)


def _commit(layout: RunLayout, decision: BlockDecision, made: list[dict[str, Any]], shards: int) -> BlockDecision:
    """Write what ``decision`` made (new configurations, copied checkpoints), then the decision itself,
    which names them: a reader never meets a configuration or checkpoint that is not there yet."""
    store = layout.store
    if made:
        known = store.read_json(layout.proposed_uri)["configs"] if store.exists(layout.proposed_uri) else []
        ids = {c["config_id"] for c in known}
        store.write_json(layout.proposed_uri, {"configs": [*known, *(c for c in made if c["config_id"] not in ids)]})
    out = dataclasses.replace(decision, copies=[copy_checkpoint(layout, c, shards) for c in decision.copies])
    out.write(store, layout.block_decision_uri(decision.block))
    return out


def copy_checkpoint(layout: RunLayout, copy: Mapping[str, Any], shards: int) -> dict[str, Any]:
    """Write PBT's copy of its parent's checkpoint as the copy's own state after the parent's last hop
    (its id, and ``copied_from`` the parent's), and return the copy's record with its uri and sha256.
    A copy is its own object: the parent's later hops may delete the parent's checkpoint."""
    from mop_airflow.records.checkpoint_file import retag_state  # noqa: PLC0415 - NumPy only

    store = layout.store
    t = copy["iteration"] * shards - 1
    source = HopRecord.read(store, layout.hop_record_uri(copy["parent"], t))
    data = store.read_bytes(source.checkpoint or layout.checkpoint_uri(copy["parent"], t))
    found = hashlib.sha256(data).hexdigest()
    if source.checkpoint_sha256 and found != source.checkpoint_sha256:
        raise StoreError(f"checkpoint of {copy['parent']} after hop {t} is corrupt: its sha256 is {found}, its hop "
                         f"wrote {source.checkpoint_sha256}. Fix: clear {copy['parent']}'s hop {t} so it is written again")
    state = retag_state(data, {"config_id": copy["config_id"], "t": t, "copied_from": copy["parent"]})
    uri = layout.checkpoint_uri(copy["config_id"], t)
    store.write_bytes(uri, state)
    return {**copy, "t": t, "checkpoint": uri, "checkpoint_sha256": hashlib.sha256(state).hexdigest(),
            "source_checkpoint": source.checkpoint, "source_sha256": found}


def _decision(run: RunRecord, plan: Plan, *, block: int, previous: BlockDecision | None,
              new: list[Completion], jobs_so_far: list[Job]) -> tuple[BlockDecision, list[dict[str, Any]]]:
    shards, schedule = plan.shards, run.schedule
    method = adaptive_plan(run.adaptive, shards)
    capacity = block_capacity(shards, schedule.slots_per_shard, method)
    seen = [Completion(**c) for c in (previous.completions if previous else [])] + new
    ended = {c.config_id for c in new}
    done = previous.length(shards) if previous else 0  # the hops the block before trained each configuration
    start = previous.start + done if previous else 0  # where this block starts, in the search's hops
    busy = {cid: hops + done for cid, hops in (previous.training if previous else {}).items() if cid not in ended}
    promoted = [(j.config_id, j.rung - 1) for j in jobs_so_far if j.kind == "promote"]
    started = [j.config_id for j in jobs_so_far if j.kind == "start"]
    draw, free = [c["config_id"] for c in run.configs], max(0, capacity - len(busy))
    trained = {j.config_id: j.iterations * shards for j in jobs_so_far}  # where a finished job left each one
    members: list[str] = []
    copies: list[Exploit] = []
    made: list[dict[str, Any]] = []
    if isinstance(method, PbtPlan):
        members = list(previous.members) if previous else draw[:method.population]
        handed, copies, made = _pbt_jobs(method, run, members, seen, jobs_so_far)
        for copy in copies:
            members[copy.member] = copy.config_id
            trained[copy.config_id] = copy.iteration * shards  # it goes on from its parent's state
    elif isinstance(method, AshaPlan):
        model_based = run.spec["search"]["space"].get("sampler") == "tpe"
        propose = _tpe(run, method, seen, set(busy), block, made) if model_based else None
        # the budget's deadline counts iterations trained since the search began (blocks of one iteration before)
        handed = next_jobs(method, seen, promoted, started, draw, free, direction=run.direction, propose=propose,
                           block=start // shards, slots=shards * schedule.slots_per_shard)
    else:
        handed = halving_jobs(brackets_of(method), split_by_bracket(draw, method), seen, promoted, started, free,
                              direction=run.direction)
    training = {**busy, **{j.config_id: (0 if j.kind == "start" else trained[j.config_id]) for j in handed}}
    run = dataclasses.replace(run, configs=[*run.configs, *made])
    classes, offsets = next_classes(training, [j.config_id for j in handed if j.kind != "continue"], shards=shards,
                                    rotation=previous.offsets if previous else {},
                                    placed=None if isinstance(method, LADDERS) else _rung_deal(run, plan, handed))
    length, ends = block_length(training, [*jobs_so_far, *handed], shards)
    return BlockDecision(block=block, capacity=capacity, jobs=[j.to_dict() for j in handed], hops=length, start=start,
                         ends=ends,
                         completions=[dataclasses.asdict(c) for c in seen], training=training, offsets=offsets,
                         lineup=lineup_classes(run, classes, rows=plan.shard_rows), finished=not training, members=members,
                         copies=[dataclasses.asdict(c) for c in copies],
                         proposed=[c["config_id"] for c in made]), made


def _tpe(run: RunRecord, method: AshaPlan, seen: list[Completion], busy: set[str], block: int,
         made: list[dict[str, Any]]) -> Any:
    """ASHA's source of new configurations once the random start-up draw is used up: TPE's proposals
    from the records so far (:mod:`mop_airflow.search.tpe`), each added to ``made``."""
    from mop_airflow.search.space import SearchSpace  # noqa: PLC0415
    from mop_airflow.search.tpe import proposer  # noqa: PLC0415 - Optuna loads here

    count = len(run.configs)

    def new_id(config: Mapping[str, Any]) -> str:
        return config_id(count + len(made), config)

    ask = proposer(SearchSpace.from_dict(run.spec["search"]["space"]), run.configs, seen, sorted(busy),
                   top_rung=method.top, direction=run.direction, block=block,
                   default_epochs_per_hop=run.schedule.epochs_per_hop, new_id=new_id)

    def propose() -> str:
        config = ask()
        made.append(config)
        return config["config_id"]

    return propose


def _pbt_jobs(method: PbtPlan, run: RunRecord, members: list[str], seen: list[Completion],
              jobs_so_far: list[Job]) -> tuple[list[Job], list[Exploit], list[dict[str, Any]]]:
    """PBT's jobs: the whole population at the start, then at each boundary every member going on or
    replaced by a copy (:func:`mop_airflow.search.pbt.pbt_decision`). A block ends at the boundary, the
    same for every member, so each one has finished its segment (or failed in it) by then. After a block
    decided before blocks ran to the boundary (one iteration long, in a search begun before the
    upgrade) the members may still be on their segment: none has a result to rank, so the decision
    hands out nothing and the next block takes them on to the boundary."""
    if not jobs_so_far:
        return [Job(cid, 0, "start", method.segment_end(0)) for cid in members], [], []
    segment = max(j.rung for j in jobs_so_far)
    done = [c for c in seen if c.rung == segment and c.config_id in set(members)]
    configs = {c["config_id"]: c for c in run.configs}
    count = len(run.configs)

    def new_id(config: Mapping[str, Any]) -> str:
        nonlocal count
        count += 1
        return config_id(count - 1, config)

    return pbt_decision(method, members, done, configs, segment=segment, seed=run.schedule.seed,
                        direction=run.direction, new_id=new_id)


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


def _block_records(layout: RunLayout, cid: str, hops: int, length: int, shards: int) -> list[HopRecord]:
    """The records of the ``length`` hops ``cid`` trained in one block (from hop ``hops``); a hop it has
    none of (its task failed or was skipped) is a failure, so the configuration trains no further."""
    out = []
    for t in range(hops, hops + length):
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
