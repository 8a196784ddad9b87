"""ASHA's decisions in the slot simulation, as :class:`~mop_airflow.planning.asha_slots.Ledger` takes them.

A slot with nothing ready takes the search's next decision from the decisions and hop records it sees,
with production's :func:`~mop_airflow.search.asha.next_jobs` and
:func:`~mop_airflow.planning.blocks.completions`, then creates decision ``k`` exclusively: the first create
to land wins, a 409 is retried, a slot that lost reads the winner's. Every slot reads the decisions as
they land and adds the hops that fall on it.
"""

from __future__ import annotations

from mop_airflow.planning.blocks import completions as rung_completions
from mop_airflow.search.asha import next_jobs
from mop_airflow.slots import machine as sp
from mop_airflow.slots.driver import BlockHop
from slot_sim.shapes import metric


class AshaDecisions:
    """The World's ASHA part (a mixin: it reads the world's store, tasks and clock)."""

    def _asha_read(self, proc: Proc) -> None:
        new = []
        while len(proc.ledger) in self.decisions and self.decisions[len(proc.ledger)][0] <= self.now:
            proc.ledger.append(self.decisions[len(proc.ledger)][1])
        for decision in proc.ledger[proc.hops_taken:]:
            for job in decision["jobs"]:
                first, end, offset, start = job["first"], job["end"], job["offset"], job["from"]
                new += [BlockHop(config_id=job["config_id"], offset=offset, step=t, shard=(offset + t) % self.s.shards,
                                 slot=job["slot"], hop=t, rung_end=t == end - 1, start=start if t == first else None,
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
        job["offset"], job["slot"] = (proc.task.shard - job["first"]) % self.s.shards, proc.task.slot
        return {**decision, "jobs": [job]}

    def _decision(self, ledger: list) -> dict | None:
        """Ledger.decide, but where the job trains (the deciding slot's shard and index)."""
        plan, p = self.plan, self.s.shards
        jobs = [job["job"] for d in ledger for job in d["jobs"]]
        seen = list(ledger[-1]["completions"]) if ledger else []
        done = {(c.config_id, c.rung) for c in seen}
        in_flight = [j for j in jobs if (j.config_id, j.rung) not in done]
        new = self._completions(in_flight)
        if not new and len(in_flight) >= self.capacity:
            return None
        seen += new
        done |= {(c.config_id, c.rung) for c in new}
        in_flight = [j for j in in_flight if (j.config_id, j.rung) not in done]
        if len(in_flight) >= self.capacity:
            return None
        handed = sum(j.iterations - (plan.rungs[j.rung - 1] if j.rung else 0) for j in jobs)
        jobs_now = next_jobs(plan, seen, [(j.config_id, j.rung - 1) for j in jobs if j.kind == "promote"],
                             [j.config_id for j in jobs if j.kind == "start"], self.s.configs, 1, direction="min",
                             block=handed // self.capacity, slots=p * self.s.slots)
        k = len(ledger)
        if not jobs_now:
            return None if in_flight else {"k": k, "finished": True, "jobs": [], "completions": seen}
        (job,) = jobs_now
        first = 0 if job.kind == "start" else plan.rungs[job.rung - 1] * p
        record = self.records.get((job.config_id, first - 1))
        start = sp.State(job.config_id, first - 1, None if first == 0 else record.checkpoint_sha256)
        return {"k": k, "finished": False, "completions": seen, "jobs": [{
            "job": job, "config_id": job.config_id, "rung": job.rung, "kind": job.kind, "first": first,
            "end": job.iterations * p, "from": start}]}

    def _fail_dead_legs(self, proc: Proc) -> None:
        """Rules.asha_dead_legs: a job in flight whose next hop is on a slot ended for good (failed for good,
        or died on its last try) fails there: asha_source.AshaSource.idle."""
        p = self.s.shards
        for cid, (first, end, offset, slot) in sorted(self.legs.items()):
            t = first
            while t < end and (cid, t) in self.records and self.records[cid, t].status == "ok":
                t += 1
            if t == end or (cid, t) in self.records:
                continue
            owner = self.tasks[(offset + t) % p * self.s.slots + slot]
            status = owner.status(self.now)
            if status is not None and ((status.state == "failed" and status.final) or (
                    self.rules.last_try_dies and sp.died_on_last_try(status, self.now, self.s.wait))):
                self._put(sp.Record(cid, t, (offset + t) % p, "failed", try_number=proc.task.try_number,
                                    error=f"TrainingError: its hop {t} on shard {(offset + t) % p} was given up: "
                                          f"shard {owner.shard} slot {owner.slot} failed for good"), lambda: None)

    def _completions(self, in_flight: list) -> list:
        last = {}
        for cid, t in self.records:
            last[cid] = max(last.get(cid, -1), t)
        records = []
        for job in in_flight:
            t = last.get(job.config_id)
            if t is None:
                continue
            record = self.records[job.config_id, t]
            if record.status != "ok" or t == job.iterations * self.s.shards - 1:
                records.append(_Seen(record, self.landed[job.config_id, t]))
        return rung_completions(records, in_flight, shards=self.s.shards, metric="loss")

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
