"""Faults of a deployment on many machines in the slot simulation: a mixin of :class:`~slot_sim.world.World`.

- **two copies of one slot** (``zombie``): a try's host pauses (or is cut off) and Airflow, taking the try
  for dead, starts its retry; later the old copy comes back and goes on where it was, its writes landing
  after its retry began. What it had in flight lands when it is back. Airflow heeds none of its ends;
  its heartbeats once back are not modelled (a status's readers heed the latest try's);
- **a commit that fails** (``commit_fails``): the slot's next commit fails past the store's retries at its
  checkpoint, its record or its marker. A store error ends the task (the driver's ``fatal``), its status
  says failed (for good on its last try) and Airflow retries it; a marker refused for another reason (a
  403) fails only the configuration, whose record landed;
- **a graceful stop mid-block** (``sigterm``): the machine is told to stop (``SlotMachine.stop``, as the
  driver tells it), ends after its action in progress, its commits and its writes, saying failed (for
  good only on its last try), and Airflow retries it;
- **a listing that loses an entry**: a marker that no listing ever shows (the slot waiting for it looks
  the record up after ``Rules.look_after``).

Drawn from a generator of their own (seeded from the schedule's seed), so the schedules drawn before keep
their faults and their seeds; about a third of the schedules get some.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from typing import Any

from mop_airflow.errors import StoreError, fails_for_good
from mop_airflow.slots import machine as sp
from mop_airflow.slots.endings import SlotStopped, says_final
from mop_airflow.store import fails_the_try
from mop_airflow.training.model_hop import failure_of
from slot_sim.shapes import Search, hops_each

NEVER = math.inf
SHARE = 0.35  # of the schedules: some of these faults


class ManyMachines:
    """The World's faults of many machines (it reads the world's store, tasks, clock and heap)."""

    MANY_MACHINES = {"zombie": "_zombie", "commit_fails": "_arm_commit_fails", "sigterm": "_sigterm"}

    def _draw_many_machines(self, on: bool = True) -> None:
        s = self.s
        # salted so that the seeds the tests keep (each a bug found before these faults) draw none of them
        rng = self.fault_rng = random.Random(self.seed * 1_000_003 + 383)
        self.lose_left, self.lose_share, self.fault_allowance = 0, 0.0, 0.0
        if not on or rng.random() >= SHARE:
            return
        blocks = 1 if s.method == "asha" else len(Search(s).bounds) - 1
        span = hops_each(s) * sum(s.durations.values()) / max(1, s.shards * s.slots) + 10.0
        places = [(b, shard, slot) for b in range(blocks) for shard in range(s.shards) for slot in range(s.slots)]
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            kind = rng.choice(("zombie", "zombie", "zombie", "commit_fails", "sigterm"))
            s.faults.append((*rng.choice(places), rng.uniform(0.0, span / blocks), kind))
        # each of these ends a try, as a kill does: within the envelope while a retry follows each
        tries = Counter(fault[:3] for fault in s.faults)
        s.benign = s.benign and all(count <= s.retries for count in tries.values())
        if rng.random() < 0.5:
            self.lose_left, self.lose_share = rng.choice((1, 2, 3)), rng.choice((0.05, 0.2))
            # each costs the wait until the slot waiting for it looks its record up, and a poll
            look = self.rules.look_after if self.rules.look_after is not None else s.wait
            self.fault_allowance = self.lose_left * (look + 2 * s.poll_most + 4 * s.latency[1] + 1.0)

    # ------------------------------------------------------------------ two copies of one slot
    def _zombie(self, proc: Any) -> None:
        task = proc.task
        proc.frozen, proc.taken_for_dead = self.now, True
        task.beat = (task.beat[0], task.beat[1], min(task.beat[2], self.now))
        self.moved = self.now
        back = (self.now + self.s.detect + self.s.retry_delay[1] + self.s.scheduler_late
                + self.fault_rng.uniform(0.5, 40.0))
        shift = back - self.now  # its own events wait for it: what it had in flight lands once it is back
        self.heap = [(when + shift, seq, fn, args) if args and args[0] is proc else (when, seq, fn, args)
                     for when, seq, fn, args in self.heap]
        heapq.heapify(self.heap)
        self.at(back, self._back, proc)
        self._retry_or_fail(task, self.now + self.rng.uniform(0, self.s.detect), died=True)

    def _back(self, proc: Any) -> None:
        if not proc.alive:
            return
        proc.frozen = NEVER
        self.note("back", proc.task.shard, proc.task.slot, f"try {proc.machine.try_number}")
        proc.poll_at = NEVER  # the polls scheduled for it while it was away were dropped
        self._wake(proc)
        self._copy_polls(proc)

    def _copy_polls(self, proc: Any) -> None:
        """Its poller lists while it waits, as CommitPoller does (no marker landing wakes a copy that is no
        task's process any more)."""
        if not proc.alive:
            return
        if self._live(proc) and proc.machine.wants_poll and self._poll(proc):
            self._wake(proc)
        self.at(self.now + max(self.s.poll_most, 0.25), self._copy_polls, proc)

    def _copy_finds_gone(self, proc: Any, act: Any) -> bool:
        """A copy taken for dead that finds its hop's input checkpoint gone (the hop was trained meanwhile by
        its retry, and the hops after it deleted it) fails there: read_bytes raises a StoreError, which
        ends its task (Airflow heeds nothing of it)."""
        for hop, state in act.members:
            if state.t >= 0 and self.checkpoints.get((hop.config_id, state.t)) != state.checkpoint_sha256:
                self._copy_ends(proc, f"{hop.config_id} t={state.t}'s checkpoint is gone")
                return True
        return False

    def _copy_ends(self, proc: Any, act: Any) -> None:
        """A try Airflow took for dead ends (superseded, or done): no last word it says changes a task."""
        proc.alive = False
        self.note("copy ends", proc.task.shard, proc.task.slot, f"try {proc.machine.try_number}", act)

    def _own_folder(self, proc: Any, folder: tuple, names: list) -> None:
        """CommitPoller.later_try: a marker a later try of this slot left since this try began."""
        if folder[1:] != proc.task.shard_slot:
            return
        began = int((proc.machine.began + proc.skew) * 1e9)
        later = max((number for (number, sequence), _ in names
                     if number > proc.machine.try_number and sequence > began), default=0)
        if later:
            proc.machine.later_try(later)

    def _commit_lost(self, proc: Any, key: tuple) -> None:
        """The writer's fenced create of its oldest commit's record found another copy's: it stands."""
        proc.writer.popleft()
        proc.writing = False
        self.note("commit lost", key[0], key[1], f"try {proc.machine.try_number}")
        proc.machine.commit_lost(self.records[key])
        self._wake(proc)
        self._commit_next(proc)

    def _create(self, proc: Any, record: sp.Record, how: str, go_on: Any) -> None:
        """A fenced write of the training thread: the record created only where none is, one request."""
        key = (record.config_id, record.t)

        def land() -> None:
            if key in self.records:
                proc.machine.lost(record, self.records[key] if sp.takes_standing(how) else None)
                go_on()
            else:
                self._put(record, lambda: self._mark(proc, record, go_on))
        self._op(proc, land)

    # ------------------------------------------------------------------ a commit that fails
    def _arm_commit_fails(self, proc: Any) -> None:
        proc.commit_fails = True

    def _commit_fails(self, proc: Any) -> None:
        proc.commit_fails = False
        proc.writing = True
        record = proc.writer[0]
        key = (record.config_id, record.t)
        stage = self.fault_rng.choice(("checkpoint", "record", "marker"))
        # what the store says: no answer past its retries, or (a marker only) a refusal; production's rule
        # (store.fails_the_try) says which ends the try and which fails the configuration
        if stage != "marker" or self.fault_rng.random() < 0.5:
            error: BaseException = StoreError(f"the store did not answer while writing the {stage} of "
                                              f"{key[0]} t={key[1]}", transient=True)
        else:
            error = PermissionError(f"the marker of {key[0]} t={key[1]} was refused (403)")
        fatal = fails_the_try(error)
        self.note("commit fails", key[0], key[1], stage, "fatal" if fatal else "refused")

        def failed() -> None:
            if stage == "marker":
                if self.rules.fence and key in self.records:
                    self._commit_lost(proc, key)
                    return
                self.checkpoints[key] = record.checkpoint_sha256
                self._drop_stale(record)
                self._put(record, lambda: None)
            if fatal:
                self._fatal(proc, error)
                return
            proc.writer.popleft()
            proc.writing = False
            hop = proc.machine.commits[0]
            proc.machine.commit_failed(hop, sp.State(key[0], key[1] - 1, record.input_sha256),
                                       *failure_of(error))
            self._wake(proc)
            self._commit_next(proc)

        self._op(proc, failed, latency=self.latency() + self.latency())

    def _fatal(self, proc: Any, exc: BaseException) -> None:
        """run_slot: an error the driver's ``fatal`` says ends the task: its last word, failed (for good on its
        last try, as production's endings.says_final says), and Airflow's retry."""
        task = proc.task
        proc.alive = False
        task.beat = (task.beat[0], task.beat[1], min(task.beat[2], self.now))
        last_try = task.try_number > self.s.retries
        final = says_final(exc, last_try=last_try, final=lambda e: fails_for_good(e, last_try=last_try))
        error = f"{type(exc).__name__}: {exc}"
        task.word = (self.now + self.latency(), sp.PeerStatus(task.try_number, "failed", self.now, final=final,
                                                              error=error))
        self.moved = self.now
        self.note("task failed", task.shard, task.slot, error)
        if final:
            task.state = "failed"
            self._end_absent()  # the slots that never started end with it (PeerWorld)
            self._asha_changed()
            self._block_over()
        else:
            self._retry_or_fail(task, self.now)

    # ------------------------------------------------------------------ a graceful stop
    def _sigterm(self, proc: Any) -> None:
        proc.machine.stop()  # the machine takes nothing more; its commits and writes, then Stopped
        self._wake(proc)

    def _stopped(self, proc: Any, act: Any) -> None:
        """run_slot on SlotStopped: the last word says failed, for good only on its last try."""
        task = proc.task
        last_try = task.try_number > self.s.retries
        final = says_final(SlotStopped(act.why), last_try=last_try,
                           final=lambda exc: fails_for_good(exc, last_try=last_try))
        word = sp.PeerStatus(task.try_number, "failed", self.now, final=final)
        task.beat = (task.beat[0], task.beat[1], self.now)
        self.at(self.now + self.latency(), self._ended, proc, sp.End({"stopped": act.why}, frozenset()), word)

    # ------------------------------------------------------------------ a listing that loses an entry
    def _listing_loses(self, lag: float) -> float:
        if self.lose_left and self.fault_rng.random() < self.lose_share:
            self.lose_left -= 1
            self.note("listing loses a marker")
            return NEVER
        return lag
