"""ASHA's decisions in the slot simulation, taken by production's rules.

A slot with nothing ready takes the search's next decision from the decisions and hop records it sees,
with the functions :class:`~mop_airflow.planning.asha_slots.Ledger` calls
(:func:`~mop_airflow.planning.asha_slots.choose`, :func:`~mop_airflow.planning.asha_slots.leg_completions`), then creates decision ``k`` exclusively: the first create
to land wins, a 409 is retried, a slot that lost reads the winner's. Every slot reads the decisions as
they land and adds the hops that fall on it. Before it decides, a slot fails the legs whose next hop is
on a slot ended for good as production's driver does (:func:`~mop_airflow.planning.asha_slots.dead_legs`),
judging that slot through its own :class:`~mop_airflow.slots.peers.PeerView`, not the raw statuses.
Only the store's I/O is the simulation's: no rule is copied here.
"""

from __future__ import annotations

from mop_airflow.planning.asha_slots import (Leg, choose, dead_leg_error, dead_legs, leg_completions, leg_offset,
                                           leg_owner, next_hops_of)
from mop_airflow.slots import machine as sp
from mop_airflow.planning.placement import BlockHop
from slot_sim.shapes import metric

# A search of n configurations takes at most one decision a configuration and rung, and the last: past
# a few times that, it decides again and again (a configuration promoted twice) and runs away
DECISIONS_CAP = 8


class Runaway(Exception):
    """The schedule cannot go on (its violation says why): the world stops it."""


class AshaDecisions:
    """The World's ASHA part (a mixin: it reads the world's store, tasks and clock)."""

    def _asha_read(self, proc: Proc) -> None:
        new = []
        while len(proc.ledger) in self.decisions and self.decisions[len(proc.ledger)][0] <= self.now:
            proc.ledger.append(self.decisions[len(proc.ledger)][1])
        for decision in proc.ledger[proc.hops_taken:]:
            for job in decision["jobs"]:
                first, end, offset, start = job["first"], job["end"], job["offset"], job["from"]
                new += [BlockHop(config_id=job["config_id"], offset=offset, step=t,
                                 shard=leg_owner(offset, job["slot"], t, self.s.shards)[0], slot=job["slot"], hop=t,
                                 rung_end=t == end - 1, start=start if t == first else None,
                                 order=decision["k"] * 100_000 + t) for t in range(first, end)]
        proc.hops_taken = len(proc.ledger)
        ended = bool(proc.ledger) and proc.ledger[-1]["finished"]
        if new or (ended and not proc.machine.ended):
            proc.machine.asha_hops(new, ended)

    def _decide(self, proc: Proc) -> None:
        """Ledger.decide for this slot: from the decisions and records it sees, then an exclusive create."""
        self._asha_read(proc)
        if self.rules.asha_dead_legs:
            self._fail_dead_legs(proc)
        decision = self._next_decision(proc)
        if decision is None:
            self.at(self.now + self.latency(), self._step, proc)
            return

        def create() -> None:
            if self.rng.random() < self.s.conflict:  # 409 ConditionalRequestConflict: decides nothing, retried
                self._op(proc, create)
                return
            k = decision["k"]
            if k in self.decisions:
                self.note("decision lost", k, proc.task.shard, proc.task.slot)
            else:
                self.decisions[k] = (self.now, decision)
                self.moved = self.now
                self.version += 1
                self.note("decision", k, proc.task.shard, proc.task.slot, "finished" if decision["finished"] else
                          [(j["config_id"], j["rung"], j["kind"]) for j in decision["jobs"]])
                for job in decision["jobs"]:
                    self.legs[job["config_id"]] = (job["first"], job["end"], job["offset"], job["slot"])
                for task in self.tasks:
                    other = task.proc
                    if other is not None and self._live(other):
                        other.machine.store_changed()
                        self._wake(other)
            proc.machine.store_changed()
            self._step(proc)
        self._op(proc, create)

    def _next_decision(self, proc: Proc) -> dict | None:
        ledger = proc.ledger
        if ledger and ledger[-1]["finished"]:
            return None
        cache = (len(ledger), self.version)  # every slot that decides on the same view decides the same
        if self.cached[0] != cache:
            self.cached = (cache, self._decision(ledger))
        decision = self.cached[1]
        if decision is None or decision["finished"]:
            return decision
        job = dict(decision["jobs"][0])
        job["offset"], job["slot"] = leg_offset(proc.task.shard, job["first"], self.s.shards), proc.task.slot
        return {**decision, "jobs": [job]}

    def _decision(self, ledger: list) -> dict | None:
        """Ledger.decide's choice (where the job trains is the deciding slot's: _next_decision)."""
        plan, p = self.plan, self.s.shards
        jobs = [job["job"] for d in ledger for job in d["jobs"]]
        seen = list(ledger[-1]["completions"]) if ledger else []
        choice = choose(plan, self.capacity, jobs, seen, self._completions, self.s.configs, direction="min",
                        shards=p, slots=self.s.slots)
        k = len(ledger)
        if choice is None or choice.finished:
            return None if choice is None else {"k": k, "finished": True, "jobs": [], "completions": choice.completions}
        job, first = choice.job, choice.first
        record = self.records.get((job.config_id, first - 1))
        if first > 0 and (record is None or record.status != "ok"):  # production's resume_at raises
            self.violate(f"ASHA promoted {job.config_id} to rung {job.rung} from its hop {first - 1}, "
                         f"which is {'not recorded' if record is None else record.status}")
            raise Runaway
        if k > DECISIONS_CAP * len(self.s.configs):
            self.violate(f"ASHA took {k} decisions for {len(self.s.configs)} configurations: it runs away")
            raise Runaway
        start = sp.State(job.config_id, first - 1, None if first == 0 else record.checkpoint_sha256)
        return {"k": k, "finished": False, "completions": choice.completions, "jobs": [{
            "job": job, "config_id": job.config_id, "rung": job.rung, "kind": job.kind, "first": first,
            "end": job.iterations * p, "from": start}]}

    def _fail_dead_legs(self, proc: Proc) -> None:
        """The driver's DeadLegs._fail_dead_legs: the legs in flight by the decisions this slot read, each
        slot judged by this slot's PeerView (its status read at most every min(heartbeat, wait / 2))."""
        p, m, now = self.s.shards, proc.machine, self.now
        done = {(c.config_id, c.rung) for c in (proc.ledger[-1]["completions"] if proc.ledger else [])}
        legs, flying = {}, set()
        for d in proc.ledger:
            for j in d["jobs"]:
                legs[j["config_id"]] = Leg(d["k"], j["config_id"], j["first"], j["end"], j["offset"], j["slot"],
                                           j["from"])
                if (j["config_id"], j["rung"]) not in done:
                    flying.add(j["config_id"])
                else:
                    flying.discard(j["config_id"])
        if not flying:
            return
        recorded = self.recorded

        def gone(owner: tuple) -> tuple | None:
            peer = m.peer(owner, now)
            if now - peer.read_at >= min(sp.HEARTBEAT, self.s.wait / 2):
                peer.read_at = now
                peer.read(self.tasks[owner[0] * self.s.slots + owner[1]].status(now), now)
            return peer.gone(now, self.s.wait)

        def failed(cid: str, t: int) -> bool:
            return (cid, t) in self.records and self.records[cid, t].status != "ok"

        for leg, t, shard, why in dead_legs(next_hops_of(legs, flying, recorded), shards=p,
                                            me=proc.task.shard_slot, gone=gone, failed=failed):
            record = sp.Record(leg.config_id, t, shard, "failed", try_number=proc.task.try_number,
                               error="TrainingError: " + dead_leg_error(t, shard, why))
            m.recorded(record)
            self._put(record, lambda record=record: self._mark(proc, record, lambda: None))

    def _completions(self, in_flight: list) -> list:
        last = {}
        for cid, t in self.records:
            last[cid] = max(last.get(cid, -1), t)
        latest = [_Seen(self.records[j.config_id, last[j.config_id]], self.landed[j.config_id, last[j.config_id]])
                  for j in in_flight if j.config_id in last]
        return leg_completions(latest, in_flight, shards=self.s.shards, metric="loss")

    def _asha_landed(self, record: sp.Record) -> None:
        if self.s.method != "asha":
            return
        leg = self.legs.get(record.config_id)
        # with a slot dead for good, any hop landing may bring a leg's next hop onto it: the idle slots
        # check the legs in flight again (production: at most once a heartbeat while idle)
        dead = self.rules.asha_dead_legs and any(t.state == "failed" for t in self.tasks)
        if record.status != "ok" or (leg is not None and record.t == leg[1] - 1) or dead:
            self.version += 1
            self._asha_changed()

    def _asha_changed(self) -> None:
        """What ASHA's idle slots decide on changed: each decides again (production: every 50 ms)."""
        if self.s.method == "asha":
            for task in self.tasks:
                if task.proc is not None and self._live(task.proc):
                    task.proc.machine.store_changed()
                    self._wake(task.proc)


class _Seen:
    """A record as Ledger._completions hands it to planning.blocks.completions."""

    def __init__(self, record: sp.Record, landed: float) -> None:
        self.config_id, self.t, self.status, self.error = record.config_id, record.t, record.status, record.error
        self.saved_at = landed
        self.val_metrics = {"loss": metric(record.checkpoint_sha256)} if record.status == "ok" else None
