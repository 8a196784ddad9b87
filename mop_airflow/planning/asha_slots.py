"""ASHA decided inside the shard slots: a slot with nothing ready to train asks what trains next.

ASHA's point (Li et al., MLSys 2020) is that no worker waits for a decision. So an ASHA search is
one block whose train tasks, one per shard slot, never end at a barrier: a slot that finds no ready
hop asks :func:`~mop_airflow.search.asha.next_jobs` for one job (promote the best of a rung's
completions not promoted yet, else start a new configuration), from the hop records in the store.

Each decision is taken once, whoever asks first: decision ``k`` is written to ``<run>/blocks/k`` with
an atomic create (:meth:`~mop_airflow.store.Store.create_json`: ``link`` on ``file://``, a conditional
PUT on S3), and a slot that loses the race reads the winner's. A decision records the completions it
saw (in the order their hops were saved), its job, and where the job trains: the configuration's
first hop of the job is on the deciding slot's shard (so that slot can take it at once), its hop
``t`` on shard ``(offset + t) mod shards``, always on the deciding slot's index, and the state it
starts from. Every slot reads the decisions (one listing per poll) and trains the hops that fall
on it, each waiting only for the configuration's previous hop, as in any block. A retried or
restarted slot reads the same decisions, so it resumes from them and skips what was committed.

The search ends when ``n`` have started, nothing can be promoted and no job is in flight: the slot
that finds so writes a last decision, ``finished``, with every completion; the report reads the
decisions as it reads those taken between blocks. With a ``budget``, a job is handed out only if its
leg ends within the budget, counted as blocks of one iteration at full capacity, as between blocks.

Reads and writes records only: no Airflow, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

from mop_airflow.planning.blocks import block_capacity, completions
from mop_airflow.planning.resume import resume_at
from mop_airflow.records import Assignment, BlockDecision, HopRecord, RunRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.search.adaptive import adaptive_plan
from mop_airflow.search.asha import AshaPlan, next_jobs
from mop_airflow.search.jobs import Completion, Job


@dataclasses.dataclass(frozen=True)
class Leg:
    """One job's hops: configuration ``config_id`` from its hop ``first`` to ``end - 1``, hop ``t`` on
    shard ``(offset + t) mod shards`` and slot ``slot``, starting from ``start``."""

    decision: int
    config_id: str
    first: int
    end: int
    offset: int
    slot: int
    start: Assignment


def leg_offset(shard: int, first: int, shards: int) -> int:
    """The rotation of a job decided by a slot of shard ``shard`` whose leg begins at the configuration's hop
    ``first``: that hop lands on the deciding slot's shard, so the slot can take it at once."""
    return (shard - first) % shards


def leg_owner(offset: int, slot: int, t: int, shards: int) -> tuple[int, int]:
    """The shard slot ``(shard, slot)`` that trains hop ``t`` of a leg of rotation ``offset`` decided by a slot of
    index ``slot``: shard ``(offset + t) mod shards``, always the deciding slot's index. Production
    (:class:`Ledger`, :class:`~mop_airflow.slots.asha_source.AshaSource`) and the plan's replay
    (:func:`mop_airflow.planning.search_sim.simulate_search`) both place hops with it."""
    return (offset + t) % shards, slot


def legs_of(decision: BlockDecision) -> list[Leg]:
    """The leg each job of ``decision`` trains."""
    return [Leg(decision.block, job["config_id"], decision.training[job["config_id"]],
                job["iterations"] * job["shards"], job["offset"], job["slot"], Assignment.from_dict(job["from"]))
            for job in decision.jobs]


# The rules below are the ledger's decisions as pure functions of what a slot has read: the Ledger
# (production, over the store) and the slot protocol's simulation (slot_sim, over its virtual store)
# both call them, so the simulation checks the rule production runs, not a copy of it.

@dataclasses.dataclass(frozen=True)
class Choice:
    """The next decision of an ASHA search: the completions it saw and its job (None: the search is
    finished), whose leg trains from hop ``first``."""

    completions: list[Completion]
    job: Job | None
    first: int = 0

    @property
    def finished(self) -> bool:
        return self.job is None


def choose(plan: AshaPlan, capacity: int, jobs: Sequence[Job], seen: Sequence[Completion],
           completed: Callable[[list[Job]], list[Completion]], candidates: Sequence[str], *, direction: str,
           shards: int, slots: int) -> Choice | None:
    """ASHA's next decision from the jobs handed out so far (``jobs``), the completions the last decision
    saw (``seen``) and ``completed(in_flight)``: the jobs in flight that completed their rung or failed
    since, in the order their hops were saved. None when nothing can be decided now (every job in
    flight, or the capacity full)."""
    seen = list(seen)
    done = {(c.config_id, c.rung) for c in seen}
    in_flight = [j for j in jobs if (j.config_id, j.rung) not in done]
    new = completed(in_flight)
    if not new and len(in_flight) >= capacity:
        return None
    seen += new
    done |= {(c.config_id, c.rung) for c in new}
    in_flight = [j for j in in_flight if (j.config_id, j.rung) not in done]
    if len(in_flight) >= capacity:
        return None
    handed_iterations = sum(j.iterations - (plan.rungs[j.rung - 1] if j.rung else 0) for j in jobs)
    handed = next_jobs(plan, seen, [(j.config_id, j.rung - 1) for j in jobs if j.kind == "promote"],
                       [j.config_id for j in jobs if j.kind == "start"], candidates, 1, direction=direction,
                       block=handed_iterations // capacity, slots=shards * slots)
    if not handed:
        return None if in_flight else Choice(seen, None)  # with a job in flight, its completion may be promoted
    (job,) = handed
    return Choice(seen, job, 0 if job.kind == "start" else plan.rungs[job.rung - 1] * shards)


def ends_leg(record: Any, job: Job, shards: int) -> bool:
    """Whether ``record``, the latest of ``job``'s configuration, completes the job: a failure, or the hop
    that ends its rung (read then, to take its metric)."""
    return record.status != "ok" or record.t == job.iterations * shards - 1


def leg_completions(latest: Iterable[Any], in_flight: Sequence[Job], *, shards: int, metric: str) -> list[Completion]:
    """What the jobs in flight came to, from each one's configuration's latest hop record (``latest``: a
    ``HopRecord``, or anything with its fields): those that complete the job (:func:`ends_leg`), in the
    order their hops were saved (:func:`~mop_airflow.planning.blocks.completions`)."""
    by_config = {r.config_id: r for r in latest}
    ended = [by_config[j.config_id] for j in in_flight
             if j.config_id in by_config and ends_leg(by_config[j.config_id], j, shards)]
    return completions(ended, in_flight, shards=shards, metric=metric)


def next_hops_of(legs: Mapping[str, Leg], flying: Iterable[str],
                 recorded: Mapping[str, Iterable[int]]) -> list[tuple[Leg, int]]:
    """Each configuration in flight (``flying``) with its latest leg (``legs``) and the hop that leg trains
    next: the first of the leg with no record (``recorded``: each configuration's hops with one)."""
    out = []
    for cid in sorted(flying):
        leg, t = legs[cid], legs[cid].first
        done = set(recorded.get(cid, ()))
        while t in done:
            t += 1
        if t < leg.end:
            out.append((leg, t))
    return out


def dead_legs(next_hops: Iterable[tuple[Leg, int]], *, shards: int, me: tuple[int, int],
              gone: Callable[[tuple[int, int]], tuple[str, bool] | None],
              failed: Callable[[str, int], bool]) -> list[tuple[Leg, int, int, str]]:
    """The legs in flight to fail because their next hop is on a slot that ended for good:
    ``(leg, hop, shard, why)``. ``gone(owner)``: the waiting slot's view of slot ``owner``
    (:meth:`~mop_airflow.slots.peers.PeerView.gone`); ``failed(config_id, t)``: whether hop ``t``'s record
    is a failure (then the leg's completion is on its way to the next decision). When that hop is its
    leg's last, no slot waits for it, and the search would wait for the job for ever (seed 539)."""
    out = []
    for leg, t in next_hops:
        owner = leg_owner(leg.offset, leg.slot, t, shards)
        if owner == me:
            continue
        why = gone(owner)
        if why is None or not why[1]:
            continue
        if t > leg.first and failed(leg.config_id, t - 1):
            continue
        out.append((leg, t, owner[0], f"never trained: {why[0]}"))
    return out


def dead_leg_error(t: int, shard: int, why: str) -> str:
    """The cause a dead leg's failure record gives (a TrainingError's message)."""
    return f"its hop {t} on shard {shard} {why}"


class Ledger:
    """The decisions of one ASHA search as this slot has read them, and what they add up to."""

    def __init__(self, layout: RunLayout, run: RunRecord, shards: int, slots: int) -> None:
        self.layout, self.run, self.shards, self.slots = layout, run, shards, slots
        self.plan = adaptive_plan(run.adaptive, shards)
        self.capacity = block_capacity(shards, slots, self.plan)
        self.decisions: list[BlockDecision] = []

    @property
    def finished(self) -> bool:
        return bool(self.decisions) and self.decisions[-1].finished

    def read(self) -> list[BlockDecision]:
        """The decisions taken since the last read, in order (one listing, and a read of each new one)."""
        store = self.layout.store
        known = len(self.decisions)
        found = sorted(int(uri.rsplit("_", 1)[-1].split(".")[0]) for uri in
                       store.glob(self.layout.block_decision_uri("*")))
        new = []
        for k in found:
            if k < known:
                continue
            if k != known + len(new):
                break  # decisions are taken in sequence: a gap is one being written
            new.append(BlockDecision.read(store, self.layout.block_decision_uri(k)))
        self.decisions += new
        return new

    def jobs(self) -> list[Job]:
        return [Job(**{k: v for k, v in job.items() if k in Job.__dataclass_fields__})
                for d in self.decisions for job in d.jobs]

    def seen(self) -> list[Completion]:
        return [Completion(**c) for c in (self.decisions[-1].completions if self.decisions else [])]

    def decide(self, *, shard: int, slot: int) -> BlockDecision | None:
        """Take the next decision for a slot with nothing ready (shard ``shard``, slot ``slot``): a job,
        the search's end, or None when nothing can be decided now (every job in flight, or capacity full).
        Another slot may have taken it first: then its decision is returned."""
        self.read()
        if self.finished:
            return None
        p, plan, k = self.shards, self.plan, len(self.decisions)
        choice = choose(plan, self.capacity, self.jobs(), self.seen(), self._completions,
                        [c["config_id"] for c in self.run.configs], direction=self.run.direction, shards=p,
                        slots=self.slots)
        if choice is None:
            return None
        seen = choice.completions
        if choice.finished:
            return self._take(BlockDecision(block=k, capacity=self.capacity, finished=True,
                                            completions=[dataclasses.asdict(c) for c in seen]), shard, slot)
        job, first = choice.job, choice.first
        offset = leg_offset(shard, first, p)  # its first hop of the job on the deciding slot's shard
        start = (Assignment(config_id=job.config_id, t=-1, checkpoint=None) if first == 0
                 else resume_at(self.layout, job.config_id, first - 1))
        return self._take(BlockDecision(
            block=k, capacity=self.capacity, completions=[dataclasses.asdict(c) for c in seen],
            jobs=[{**job.to_dict(), "shards": p, "offset": offset, "slot": slot, "from": start.to_dict(),
                   "decided_on": [shard, slot]}],
            training={job.config_id: first}, offsets={job.config_id: offset}, hops=job.iterations * p - first,
            start=first, ends=[job.config_id]), shard, slot)

    def next_hops(self) -> list[tuple[Leg, int]]:
        """Each job in flight (by the decisions read) with the hop its leg trains next: the first of its
        leg with no record yet. One listing of the run's hop records."""
        done = {(c.config_id, c.rung) for c in self.seen()}
        legs = {leg.config_id: leg for d in self.decisions for leg in legs_of(d)}  # a configuration's latest
        flying = {j.config_id for j in self.jobs() if (j.config_id, j.rung) not in done}
        if not flying:
            return []
        recorded: dict[str, set[int]] = {}
        for uri in self.layout.store.glob(self.layout.hops_glob):
            cid, name = uri.rsplit("/", 2)[-2:]
            recorded.setdefault(cid, set()).add(int(name[1:].split(".")[0]))
        return next_hops_of(legs, flying, recorded)

    def _take(self, decision: BlockDecision, shard: int, slot: int) -> BlockDecision:
        """Write ``decision`` unless another slot took decision ``k`` first; either way, the decision ``k`` is."""
        store, uri = self.layout.store, self.layout.block_decision_uri(decision.block)
        if store.create_json(uri, decision.to_dict()):
            self.decisions.append(decision)
            return decision
        winner = BlockDecision.read(store, uri)
        self.read()
        return winner

    def _completions(self, in_flight: Iterable[Job]) -> list[Completion]:
        """The jobs in flight that completed their rung or failed, in the order their hops were saved:
        one listing of the run's hop records, then a read of each such job's last record."""
        jobs = list(in_flight)
        if not jobs:
            return []
        listed: dict[str, int] = {}
        for uri in self.layout.store.glob(self.layout.hops_glob):
            cid, name = uri.rsplit("/", 2)[-2:]
            listed[cid] = max(listed.get(cid, -1), int(name[1:].split(".")[0]))
        records: list[HopRecord] = []
        for job in jobs:
            last = listed.get(job.config_id)
            if last is not None:
                records.append(HopRecord.read(self.layout.store, self.layout.hop_record_uri(job.config_id, last)))
        return leg_completions(records, jobs, shards=self.shards, metric=self.run.metric)
