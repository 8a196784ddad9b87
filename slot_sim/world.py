"""The virtual world of the slot simulation: a clock, a store, an Airflow, and every slot's process.

:class:`World` runs one schedule (a :class:`~slot_sim.shapes.Shape`, drawn from its
seed): each shard slot's task is a :class:`~mop_airflow.slots.machine.SlotMachine` whose actions
the world carries out on a virtual clock, a heap of events, in a deterministic order:

- **the store** keeps hop records, checkpoints (a hop's commit writes its checkpoint and record, deletes
  the checkpoints that makes stale (:func:`~mop_airflow.records.retention.stale_checkpoints`), then
  leaves its marker), markers and ASHA's decisions. Every request
  takes a drawn latency, and a request that fails is retried after a backoff (``Shape.transient``); a
  request takes effect when it completes, and not at all when its process died first. A marker's name
  takes the process's clock when it is named (``CommitLog.mark``), and a listing shows it from when it
  lands, or later (``Shape.lag``); a poller lists from the last name it saw (``store.names_after``);
- **Airflow** starts each task when due (late by up to ``scheduler_late``, or held by another pool);
  a try SIGKILLed or stopped (its watchdog kills it after ``stall``) is seen gone after up to ``detect``
  and retried after ``retry_delay``, up to ``retries`` times; a slot that yields is rescheduled 10-20 s
  later with the same try; a failed block fails the search;
- **each slot's process** has a training thread (the machine's actions, one at a time), a writer thread
  (commits, in order, at most two waiting) and a poller (it lists its folders while the machine waits for
  a hop; the machine reads the record a marker names when it needs it); a slot's status file says "running" with a heartbeat every 5 s from its start until it ends,
  is killed or stops, then its last word.

Everything random comes from one ``random.Random(seed)`` in event order, so a seed replays exactly.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import defaultdict, deque
from typing import Any, Callable

from mop_airflow.errors import BlockIncompleteError, fails_for_good
from mop_airflow.search.asha import AshaPlan
from mop_airflow.slots import machine as sp
from mop_airflow.slots.endings import says_final
from mop_airflow.slots.status import ended_or_never_started
from mop_airflow.slots.outcomes import ask_facts
from mop_airflow.config import StoreSpec
from mop_airflow.planning.placement import block_hops, fused_partners
from mop_airflow.records.retention import stale_checkpoints
from slot_sim.asha import AshaDecisions, Runaway
from slot_sim.machines import ManyMachines
from slot_sim.peers import PeerFaults, PeerWorld, draw_peer_faults
from slot_sim.shapes import Block, Search, Shape, after, draw

NEVER = math.inf
# A schedule's cap in events (its cap in virtual time is its bound): the most any of the first 100,000
# schedules took was a few thousand, so a schedule past this has run away (a decision taken again and
# again, actions that never end), and fails with its seed instead of running for ever. A slot's
# actions answered at once (reads) count too, each as an event.
EVENT_CAP = 100_000
# From a lost try's failure for good to its failure callback's effect: the dag-processor takes the callback
# Airflow's scheduler sends it on its next loop, then two REST calls a task of the block
FAILURE_CALLBACK_S = 5.0
KEEP_CHECKPOINTS = StoreSpec().keep_checkpoints  # store.keep_checkpoints by default
DRIVER_WAKE = 1.0  # SlotDriver: a slot waiting for others wakes at least this often (its poller's wait)




class Task:
    """One shard slot's Airflow task in one block: its tries and what its status file says."""

    def __init__(self, block: Block, shard: int, slot: int, retries: int) -> None:
        self.block, self.shard, self.slot, self.retries = block, shard, slot, retries
        self.shard_slot = (shard, slot)
        self.yields = 0
        self.yielding_since: float | None = None
        self.try_number, self.state, self.proc = 1, "queued", None
        self.beat: tuple | None = None  # (try, began, stopped): "running" and a heartbeat every 5 s meanwhile
        self.word: tuple | None = None  # (landed at, PeerStatus): the last word a try said

    def status(self, now: float) -> sp.PeerStatus | None:
        word = self.word if self.word is not None and self.word[0] <= now else None
        if self.beat is not None and self.beat[1] <= now and (word is None or self.beat[1] >= word[0]):
            number, began, stopped = self.beat
            beats = int((min(now, stopped) - began) // sp.HEARTBEAT)
            return sp.PeerStatus(number, "running", began + beats * sp.HEARTBEAT, progress=beats + 1,
                                 last_try=number > self.retries)
        return None if word is None else word[1]


class Proc:
    """One try's process: its state machine, its writer thread's queue, its poller's cursor."""

    def __init__(self, task: Task, machine: sp.SlotMachine, skew: float) -> None:
        self.task, self.machine, self.skew = task, machine, skew
        self.alive, self.frozen, self.waiting, self.token = True, NEVER, False, 0
        self.writer: deque = deque()
        self.writing = False
        self.after: dict = defaultdict(tuple)  # folder -> the last name listed
        self.scanned: dict = defaultdict(int)
        self.poll_at = NEVER
        self.wanted = False
        self.last_name = 0
        self.marking_until = 0.0  # when the marker PUT in flight lands (CommitLog's lock)
        self.ledger: list = []  # ASHA: the decisions read, in order
        self.hops_taken = 0


class World(AshaDecisions, PeerWorld, ManyMachines):
    """One schedule: its shape, store, Airflow and slots on a virtual clock."""

    def __init__(self, seed: int, rules: sp.Rules = sp.Rules(), shape: Shape | None = None, trace: bool = False,
                 peers: bool = True):
        self.seed, self.rules = seed, rules
        self.rng = random.Random(seed)
        self.s = shape or draw(self.rng)
        self.pf = draw_peer_faults(seed, self.s) if shape is None and peers else PeerFaults()  # slot_sim.peers
        self.index = self.s.index
        self.now, self.heap, self.seq = 0.0, [], 0
        self.keep_trace = trace
        self.trace: list = []
        self.records: dict = {}  # (config, hop) -> Record
        self.recorded: dict = defaultdict(set)  # config -> the hops recorded (ASHA's dead legs read it)
        self.landed: dict = {}  # (config, hop) -> when its record landed
        self._landed_mark: dict = {}  # (folder, name) -> when the marker landed
        self.writes: dict = defaultdict(list)  # (config, hop) -> every record written there
        self.checkpoints: dict = {}
        self.folders: dict = defaultdict(list)  # (block, shard, slot) -> [(name, visible at, key)]
        self.decisions: dict = {}  # ASHA: k -> (landed at, decision)
        self.violations: list = []
        self.missed: dict = {}  # (block, shard, slot, config, hop) -> why a poll never listed its input's marker
        self.unmarked: set = set()  # (config, hop): found committed by a retry, with no marker
        self.tasks: list = []
        self.search = None if self.s.method == "asha" else Search(self.s)
        self.block: Block | None = None
        self.outcome = "running"
        # issue 70's faults, from a generator of their own (ManyMachines); none in a reference run (its shape
        # given, its faults taken off)
        self._draw_many_machines(shape is None)
        self.bound = self._bound() + self.fault_allowance
        s = self.s
        # the longest a search may go without a record, a decision or a task starting or ending: a pool
        # held elsewhere, then a slot waited out, killed by its watchdog, seen gone and retried
        self.quiet = (max(s.late.values(), default=0.0) + s.wait + 3 * sp.HEARTBEAT + s.stall + s.detect
                      + s.retry_delay[1] + s.scheduler_late + s.give_back + 20.0 + s.lag_most
                      + 1.25 * max(s.durations.values()) + 60.0)
        self.quiet += self._absent_quiet()  # slot_sim.peers
        self.moved = 0.0
        self.events = 0
        self.task_ended = False  # a task of the block has ended (done, or failed for good)

    # ------------------------------------------------------------------ the clock
    def at(self, when: float, fn: Callable, *args: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (when, self.seq, fn, args))

    def run(self) -> "World":
        if self.s.method == "asha":
            self._start_asha()
        else:
            self._start_block(self.search.first(), 0.0)
        while self.heap and self.outcome == "running":
            if self.events > EVENT_CAP:
                self.violate(f"the schedule ran away: {self.events} events by {self.now:.0f} s of virtual time "
                             f"(its cap is {EVENT_CAP}): " + self._stuck())
                break
            when, _, fn, args = heapq.heappop(self.heap)
            if when > self.bound:
                self.violate(f"the search has not ended by {self.bound:.0f} s of virtual time (its bound): "
                             + self._stuck())
                break
            if when - self.moved > self.quiet:
                self.violate(f"nothing moved for {self.quiet:.0f} s (no record, decision, start or end: a hang, "
                             f"the slots waiting for each other) at {when:.0f} s: " + self._stuck())
                break
            self.now = when
            self.events += 1
            try:
                fn(*args)
            except Runaway:  # a cap passed, or a state the world cannot go on from: its violation says so
                if not self.violations:
                    self.violate(f"the schedule ran away: {self.events} events by {self.now:.0f} s of virtual "
                                 f"time (its cap is {EVENT_CAP})")
                break
        if self.outcome == "running" and not self.violations:
            # (before the failure callback, Rules.lost_ends_block, seed 4390: never-started tasks outlived the
            # last slot able to end them, killed on its last try)
            self.violate("no event left and the search has not ended (a deadlock): " + self._stuck())
        return self

    def note(self, what: str, *detail: Any) -> None:
        """A line of the trace (kept only when asked: a replay of a seed keeps it)."""
        if self.keep_trace:
            self.trace.append(f"{self.now:12.6f} {what} {' '.join(_brief(d) for d in detail)}")

    def violate(self, what: str) -> None:
        self.violations.append(what)
        self.note("VIOLATION", what)

    def latency(self) -> float:
        lo, hi = self.s.latency
        delay = self.rng.uniform(lo, hi)
        while self.rng.random() < self.s.transient:  # the store retries a failed request after a backoff
            delay += self.rng.uniform(0.2, 2.0) + self.rng.uniform(lo, hi)
        return delay

    # ------------------------------------------------------------------ Airflow
    def _start_block(self, block: Block, when: float) -> None:
        self.block = block
        self.note("block", block.index, block.start, block.end, [c for c, _ in block.members])
        classes = [[block.starts[cid] for cid, o in block.members if o == offset] for offset in range(self.s.shards)]
        index = self.index
        self.hops = block_hops(classes, shards=self.s.shards, slots=self.s.slots, start=block.start, end=block.end,
                               rung_end=bool(block.ends), ends=block.ends, key=lambda cid: str(index[cid] % 3),
                               fuse=self._fuse if self.s.fuse > 1 else None)
        self.partners = fused_partners(self.hops, self._fuse) if self.s.fuse > 1 else {}
        self.tasks = []
        for shard in range(self.s.shards):
            for slot in range(self.s.slots):
                task = Task(block, shard, slot, self.s.retries)
                self.tasks.append(task)
                if self.search is not None and not any(h.shard == shard and h.slot == slot for h in self.hops):
                    task.state = "skipped"  # AirflowSkipException: no hop on it
                    continue
                late = self.s.late.get((block.index, shard, slot), 0.0)
                self.at(when + late + self.rng.uniform(0, self.s.scheduler_late), self._start, task)
        for b, shard, slot, offset, kind in self.s.faults:
            if b == block.index:
                self.at(when + offset, self._fault, self.tasks[shard * self.s.slots + slot], kind)

    def _start_asha(self) -> None:
        s = self.s
        self.plan = AshaPlan(n=len(s.configs), r=s.rungs[0], R=s.rungs[-1], eta=s.eta, rungs=s.rungs, budget=s.budget)
        self.capacity = self.plan.capacity(s.shards * s.slots)
        self.legs: dict = {}  # config -> (first, end, offset, slot) of its last leg
        self.version, self.cached = 0, (None, None)  # what decisions may read changed; the last next_jobs
        self.hops, self.partners = [], {}
        self._start_block(Block(0, 0, 0, [], {}), 0.0)

    def _fuse(self, cids: list) -> list:
        groups, by_key = [], {}
        for cid in cids:
            by_key.setdefault(self.index[cid] % 2, []).append(cid)
        for members in by_key.values():
            groups += [members[i:i + self.s.fuse] for i in range(0, len(members), self.s.fuse)]
        return groups

    def _start(self, task: Task) -> None:
        if task.state != "queued" or self._never_starts(task):
            return
        task.state = "running"
        asha = self.s.method == "asha"
        machine = sp.SlotMachine([] if asha else self.hops, shard=task.shard, slot=task.slot,
                                 try_number=task.try_number, began=self.now, wait=self.s.wait,
                                 give_back=self.s.give_back, partners=self.partners, asha=asha,
                                 shards=self.s.shards, rules=self.rules, yielding_since=task.yielding_since,
                                 slots=self.s.slots, absent_wait=self.s.wait * (self.s.retries + 2 - task.try_number))
        proc = task.proc = Proc(task, machine, self.rng.uniform(-0.05, 0.05))
        self._arm(task, proc)
        task.beat = (task.try_number, self.now, NEVER)
        self.moved = self.now
        self.note("start", task.shard, task.slot, f"try {task.try_number}")
        self.at(self.now + self.latency(), self._first_poll, proc)

    def _first_poll(self, proc: Proc) -> None:
        if self._live(proc):
            self._poll(proc)
            self._step(proc)

    def _fault(self, task: Task, kind: str) -> None:
        proc = task.proc
        if proc is None or not self._live(proc):
            return
        self.note(kind, task.shard, task.slot, f"try {task.try_number}")
        if kind in self.MANY_MACHINES:
            getattr(self, self.MANY_MACHINES[kind])(proc)
        elif kind == "kill":
            self._die(proc)
        else:  # SIGSTOP: nothing of it runs; its watchdog kills it after the stall bound
            proc.frozen = self.now
            task.beat = (task.beat[0], task.beat[1], self.now)
            self.at(self.now + self.s.stall, self._die, proc)

    def _die(self, proc: Proc) -> None:
        if not proc.alive:
            return
        proc.alive = False
        self.moved = self.now
        task = proc.task
        task.beat = (task.beat[0], task.beat[1], min(task.beat[2], self.now))
        self.note("died", task.shard, task.slot, f"try {task.try_number}")
        self._retry_or_fail(task, self.now + self.rng.uniform(0, self.s.detect), died=True)

    def _retry_or_fail(self, task: Task, when: float, died: bool = False) -> None:
        if task.try_number > self.s.retries:
            task.state = "failed"  # a try that died says nothing more: its "running" stays, its heartbeat stopped
            status = task.status(self.now)
            if died and status is not None and status.state == "running":
                # what ASHA's decisions see changes once its silence passes the wait bound (a slot checks
                # the slots of its legs at most once a heartbeat)
                self.at(status.heartbeat + self.s.wait + sp.HEARTBEAT, self._asha_changed)
            self.note("failed for good", task.shard, task.slot)
            if died and self.rules.lost_ends_block:  # Airflow runs its failure callback once it fails it
                self.at(max(when, self.now) + FAILURE_CALLBACK_S, self._failure_callback, task)
            self._block_over()
            return
        task.try_number += 1
        task.state = "queued"
        self.at(when + self.rng.uniform(*self.s.retry_delay) + self.rng.uniform(0, self.s.scheduler_late),
                self._start, task)

    def _failure_callback(self, task: Task) -> None:
        """The train task's failure callback (operators/train.end_block_after_final_failure), for a try lost
        on its last try: when no other task of the block has started and lives on (running, yielded, a
        retry to come), the block's tasks that never started are failed, as production does through the
        REST API. A lost try says no last word, so nothing else would end them."""
        left = [t for t in self.tasks if t is not task and t.state not in ("success", "failed", "skipped")]
        if not left or any(t.proc is not None for t in left):
            return
        self.note("failure callback", task.shard, task.slot)
        self._end_absent()
        self._block_over()

    def _end(self, proc: Proc, act: Any) -> None:
        task = proc.task
        if type(act) is sp.Stopped and not proc.__dict__.get("taken_for_dead"):
            self._stopped(proc, act)  # SIGTERM: failed, for good only on its last try
            return
        if type(act) is sp.Superseded or proc.__dict__.get("taken_for_dead"):
            self._copy_ends(proc, act)  # a try taken for dead: Airflow heeds none of its ends
            return
        if isinstance(act, sp.Yield):
            word = sp.PeerStatus(task.try_number, "yielded", self.now)
        else:
            # production's rule (endings.says_final, errors.fails_for_good) on the error the shard loop raises
            last_try = task.try_number > self.s.retries
            final = not act.done and says_final(
                BlockIncompleteError(task.shard, task.slot, act.untrained, for_good=act.for_good), last_try=last_try,
                final=lambda exc: fails_for_good(exc, last_try=last_try))
            word = sp.PeerStatus(task.try_number, "done" if act.done else "failed", self.now, final=final)
        task.beat = (task.beat[0], task.beat[1], self.now)
        self.at(self.now + self.latency(), self._ended, proc, act, word)

    def _ended(self, proc: Proc, act: Any, word: sp.PeerStatus) -> None:
        if not self._live(proc):
            return
        task = proc.task
        proc.alive = False
        self.moved = self.now
        task.word = (self.now, word)
        self.note("ended", task.shard, task.slot, word.state, f"final={word.final}")
        if word.final:
            self._end_absent(act)
        elif word.state == "done" and (not proc.machine.asha or proc.machine.ended):
            # the driver (endings.ended): the block is over without them, once no other slot runs
            m = proc.machine
            unneeded, others = m.unneeded_slots(), m.block_slots() - {m.slot_of}
            if unneeded and ended_or_never_started((t.status(self.now) for t in self.tasks if t.shard_slot in others),
                                                 self.now, m.wait):
                self._end_absent(act, only=unneeded)
        if isinstance(act, sp.Yield):
            task.state = "queued"
            task.yields += 1
            if task.yielding_since is None:
                task.yielding_since = self.now
            self.at(self.now + self.rng.uniform(10.0, 20.0) + self.rng.uniform(0, self.s.scheduler_late),
                    self._start, task)
        elif act.done:
            task.state = "success"
            self._block_over()
        elif word.final:
            task.state = "failed"
            self._asha_changed()
            self._block_over()
        else:
            self._retry_or_fail(task, self.now)

    def _block_over(self) -> None:
        self.task_ended = True  # (called whenever a task ends: done, failed for good)
        if any(t.state not in ("success", "failed", "skipped") for t in self.tasks):
            return
        if any(t.state == "failed" for t in self.tasks):
            self.outcome = "failed"
            return
        if self.s.method == "asha":
            self.outcome = "succeeded"
            return
        block = self.block
        results = {}
        for cid, _ in block.members:
            result = self._result(cid, block)
            if result is None:
                self.violate(f"block {block.index} ended without a result for {cid}")
                self.outcome = "failed"
                return
            results[cid] = result
        following = self.search.next(block, results)
        if following is None:
            self.outcome = "succeeded"
            return
        for cid, state in following.copies.items():  # PBT: the decision copies the donor's checkpoint
            self.checkpoints[cid, state.t] = state.checkpoint_sha256
        self._start_block(following, self.now + self.rng.uniform(1.0, 5.0))

    def _result(self, cid: str, block: Block) -> tuple | None:
        for t in range(block.start, block.end):
            record = self.records.get((cid, t))
            if record is not None and record.status != "ok":
                first = self.records.get((cid, record.dropped_after)) if record.dropped_after is not None else record
                return "failed", first.t, first.shard, first.status
        record = self.records.get((cid, block.end - 1))
        return None if record is None else ("ok", sp.state_after(record))

    # ------------------------------------------------------------------ a slot's process
    def _live(self, proc: Proc) -> bool:
        return proc.alive and self.now < proc.frozen

    def _wake(self, proc: Proc) -> None:
        if proc.waiting and self._live(proc):
            proc.waiting = False
            proc.token += 1
            self.at(self.now, self._step, proc)

    def _timer(self, proc: Proc, token: int) -> None:
        if proc.waiting and proc.token == token:
            proc.waiting = False
            self._step(proc)

    def _driver_wake(self, proc: Proc, token: int) -> None:
        """SlotDriver's wait for other slots, woken by nothing: ``store_changed`` and decide again."""
        if proc.waiting and proc.token == token and self._live(proc):
            proc.machine.store_changed()
            self._timer(proc, token)

    def _step(self, proc: Proc) -> None:
        if not self._live(proc):
            return
        m = proc.machine
        if self.s.method == "asha":
            self._asha_read(proc)
        act = m.decide(self.now)
        if self.keep_trace:
            self.note(type(act).__name__, proc.task.shard, proc.task.slot, act)
        while type(act) is sp.ReadPeers or type(act) is sp.Read:
            self.events += 1
            if self.events > EVENT_CAP:
                raise Runaway
            # a status file, and a record a marker listed names, is read at once (its latency changes
            # nothing: a record lands before its marker, and is never written again)
            if type(act) is sp.Read:
                if not self._read_records(proc, act.keys):
                    return
            else:
                for owner in act.owners:
                    m.peer_status(owner, self._status_seen(proc, owner), self.now)
            act = m.decide(self.now)
            if self.keep_trace:
                self.note(type(act).__name__, proc.task.shard, proc.task.slot, act)
        if m.wants_poll and not proc.wanted:  # the poller wakes: what landed meanwhile is listed
            self._schedule_poll(proc, self.now + self.rng.uniform(0, self.s.poll_most))
        proc.wanted = m.wants_poll
        kind = type(act)
        if kind is sp.Wait:
            proc.waiting = True
            proc.token += 1
            if not act.commit and self.task_ended and self.s.method == "asha" and not m.ended:
                # the driver's wait for other slots wakes at least every DRIVER_WAKE and says the store may
                # have changed: an idle ASHA slot decides again, the legs in flight checked first (seeds
                # 424455, 460769 hung where only a landing woke it, a peer's end read late). Modelled once a
                # task has ended: before, a decision at a wake reads nothing that the landings that wake the
                # slots (a completion, a failure, a decision) did not, and no slot is judged ended for good
                wake = self.now + DRIVER_WAKE
                if act.until <= wake:
                    self.at(max(act.until, self.now), self._timer, proc, proc.token)
                else:
                    self.at(wake, self._driver_wake, proc, proc.token)
            elif act.until < NEVER:
                self.at(max(act.until, self.now), self._timer, proc, proc.token)
        elif kind is sp.Train:
            self._train(proc, act)
        elif kind is sp.Write:
            self._write(proc, list(act.records), lambda: self._step(proc))
        elif kind is sp.Look:
            self.at(self.now + self.latency(), self._looked, proc, act)
        elif kind is sp.Check:
            self.at(self.now + 2 * self.latency(), self._checked, proc, act)
        elif kind is sp.Decide:
            self._decide(proc)
        else:  # Yield, End
            self._end(proc, act)

    def _looked(self, proc: Proc, act: sp.Look) -> None:
        if self._live(proc):
            found = {(h.config_id, h.hop - 1): self.records.get((h.config_id, h.hop - 1)) for h, _, _ in act.hops}
            proc.machine.looked(act.hops, found)
            self._step(proc)

    def _checked(self, proc: Proc, act: sp.Check) -> None:
        if self._live(proc):
            facts, m = {}, proc.machine
            for hop, state in act.members:
                key = (hop.config_id, hop.hop)
                record = self.records.get(key)
                folder = (proc.task.block.index, hop.shard, hop.slot)
                if record is not None and not any(k == key for _, _, k in self.folders.get(folder, ())):
                    self.unmarked.add(key)
                # production's questions (ask_facts), answered by this world's store
                facts[key] = ask_facts(
                    state, first_try=not m.rerun, next_known=(hop.config_id, hop.hop + 1) in m.known,
                    record=lambda: record,  # noqa: B023 - each asked before the loop goes on
                    checkpoint_there=lambda r: (r.checkpoint_sha256 is not None  # noqa: B023
                                                and self.checkpoints.get(key) == r.checkpoint_sha256),
                    next_there=lambda: (hop.config_id, hop.hop + 1) in self.records)  # noqa: B023
            m.checked(facts)
            self._step(proc)

    def _train(self, proc: Proc, act: sp.Train) -> None:
        if proc.__dict__.get("taken_for_dead") and self._copy_finds_gone(proc, act):
            return
        for hop, state in act.members:  # the input checkpoint is read first
            if state.t >= 0 and self.checkpoints.get((hop.config_id, state.t)) != state.checkpoint_sha256:
                self.violate(f"{hop.config_id} t={hop.hop} on shard {hop.shard} slot {hop.slot} read the checkpoint of "
                             f"hop {state.t}, gone or not the one its record names")
        seconds = max(self.s.durations[h.config_id] for h, _ in act.members) * self.rng.uniform(0.8, 1.25)
        self.at(self.now + self.latency() + seconds, self._trained, proc, act)

    def _trained(self, proc: Proc, act: sp.Train) -> None:
        if not self._live(proc):
            return
        m, task = proc.machine, proc.task
        for hop, state in act.members:
            fail = self.s.fail.get(hop.config_id)
            if fail is not None and fail[0] == hop.hop:
                cause = "builder raised" if fail[1] == "failed" else "diverged: loss=nan"
                m.trained_failed(hop, state, fail[1], f"{cause} at hop {hop.hop} on shard {hop.shard}")
                self.note("hop failed", hop.config_id, hop.hop, hop.shard)
                continue
            out = after(state, self.index[hop.config_id], hop.hop, hop.shard)
            record = sp.Record(hop.config_id, hop.hop, hop.shard, "ok", state.checkpoint_sha256, out.checkpoint_sha256,
                               try_number=m.try_number)  # the process's own try (a copy taken for dead keeps its)
            m.trained_ok(hop)
            proc.writer.append(record)
        self._commit_next(proc)
        self._step(proc)

    def _commit_next(self, proc: Proc) -> None:
        """The writer thread: checkpoint, record, stale checkpoint deleted (keep 2), marker; one at a time."""
        if proc.writing or not proc.writer or not self._live(proc):
            return
        if proc.__dict__.get("commit_fails"):
            self._commit_fails(proc)
            return
        proc.writing = True
        record = proc.writer[0]
        key = (record.config_id, record.t)

        def saved() -> None:  # the checkpoint, its record, the stale checkpoint deleted: each a request, as one
            # event (a checkpoint without its record is never read; the stale one is not read once it is)
            if self.rules.fence and key in self.records:
                self._commit_lost(proc, key)  # created only where none is: the first record stands
                return
            self.checkpoints[key] = record.checkpoint_sha256
            self._drop_stale(record)
            self._put(record, lambda: self._mark(proc, record, done))

        def done() -> None:
            proc.writer.popleft()
            proc.writing = False
            proc.machine.committed(record)
            self._wake(proc)
            self._commit_next(proc)

        self._op(proc, saved, latency=self.latency() + self.latency() + self.latency())

    def _drop_stale(self, record: sp.Record) -> None:
        """The checkpoints the commit of ``record`` makes stale (records.retention, the hop's commit's rule),
        kept at the spec's default (the simulated records name no best hop)."""
        for old in stale_checkpoints(record.t, KEEP_CHECKPOINTS, None, None):
            self.checkpoints.pop((record.config_id, old), None)

    def _op(self, proc: Proc, fn: Callable, *args: Any, latency: float | None = None) -> None:
        """A store request of ``proc``: it takes effect when it completes, if the process still runs."""
        self.at(self.now + (self.latency() if latency is None else latency), self._land, proc, fn, args)

    def _land(self, proc: Proc, fn: Callable, args: tuple) -> None:
        if self._live(proc):
            fn(*args)

    def _put(self, record: sp.Record, then: Callable) -> None:
        key = (record.config_id, record.t)
        writes = self.writes[key]
        if writes:
            same = writes[0][1:] == (record.status, record.input_sha256, record.checkpoint_sha256, record.dropped_after)
            self.violate(f"the record of {key[0]} t={key[1]} was written again ({'the same' if same else 'another'} "
                         f"{record.status} record, try {record.try_number}; first {writes[0]})")
        writes.append((record.try_number, record.status, record.input_sha256, record.checkpoint_sha256,
                       record.dropped_after))
        self.records[key] = record
        self.recorded[key[0]].add(key[1])
        self.landed[key] = self.now
        self.moved = self.now
        self.note("record", key[0], key[1], record.status, f"try {record.try_number}")
        self._asha_landed(record)
        then()

    def _write(self, proc: Proc, todo: list, then: Callable) -> None:
        """The training thread's writes, in order: a failure, a settled drop (unless a record is there)."""
        if not todo:
            then()
            return
        record, how = todo.pop(0)
        go_on = lambda: self._write(proc, todo, then)  # noqa: E731
        key = (record.config_id, record.t)
        step = sp.write_step(how, self.rules.fence)  # production's rule, as the shard loop asks it
        if step == "create":
            self._create(proc, record, how, go_on)
        elif step == "mark":
            self._mark(proc, record, go_on)
        elif step == "unless there":
            self._op(proc, lambda: go_on() if key in self.records else self._op(
                proc, self._put, record, lambda: self._mark(proc, record, go_on)))
        else:
            self._op(proc, self._put, record, lambda: self._mark(proc, record, go_on))

    def _mark(self, proc: Proc, record: sp.Record, then: Callable) -> None:
        """CommitLog.mark: the name takes the process's clock (kept rising) now; the object lands later, and
        after the process's previous marker (its lock is held through the PUT: one at a time, in order)."""
        proc.last_name = max(proc.last_name + 1, int((self.now + proc.skew) * 1e9))
        name = (proc.machine.try_number, proc.last_name)
        folder = (proc.task.block.index, proc.task.shard, proc.task.slot)

        def land() -> None:
            lag = self.rng.uniform(0, self.s.lag_most) if self.rng.random() < self.s.lag else 0.0
            lag = self._listing_loses(lag)
            self.folders[folder].append((name, self.now + lag, (record.config_id, record.t)))
            self._landed_mark[folder, name] = self.now
            for task in self.tasks:
                other = task.proc
                if other is not None and other.wanted and self._live(other) and folder[1:] in other.machine.polled:
                    self._schedule_poll(other, self.now + lag + self.rng.uniform(0, self.s.poll_most))
            then()
        if not self.rules.marks_in_order:  # (before: each PUT on its own, as the thread that named it left it)
            self._op(proc, land)
            return
        begins = max(self.now, proc.marking_until)  # the previous marker's PUT holds the lock till it lands
        proc.marking_until = begins + self.latency()
        self.at(proc.marking_until, self._land, proc, land, ())

    def _schedule_poll(self, proc: Proc, when: float) -> None:
        if when < proc.poll_at:
            proc.poll_at = when
            self.at(when, self._polled, proc, when)

    def _polled(self, proc: Proc, when: float) -> None:
        if proc.poll_at != when or not self._live(proc):
            return
        proc.poll_at = NEVER
        if proc.machine.wants_poll and self._poll(proc):
            self._wake(proc)

    def _poll(self, proc: Proc) -> bool:
        """One listing of each folder from the last name seen (store.names_after): a name that shows up
        after a later one was listed is never listed."""
        found, later = [], NEVER
        block = proc.task.block.index
        for shard, slot in proc.machine.polled:
            folder = (block, shard, slot)
            entries, last = self.folders.get(folder, ()), proc.after[folder]
            start = proc.scanned[folder]
            names = []
            for i in range(start, len(entries)):
                name, visible, key = entries[i]
                if visible > self.now:
                    later = min(later, visible)
                    continue
                if name > last:
                    names.append((name, key))
                else:  # listed after a later name: this poller never sees it
                    self.missed[(block, *proc.task.shard_slot, *key)] = "late listing" if visible > self._landed_mark.get(
                        (folder, name), visible) else "landed after a later name"
                if i == start:
                    start += 1
            proc.scanned[folder] = start
            if names:
                self._own_folder(proc, folder, names)
                names.sort()
                proc.after[folder] = names[-1][0]
                found += [key for _, key in names]
        if later < NEVER:
            self._schedule_poll(proc, later + self.rng.uniform(0, self.s.poll_most))
        if found:
            proc.machine.markers(found)
            self.note("listed", proc.task.shard, proc.task.slot, [f"{cid}/{t}" for cid, t in found])
        return bool(found)

    # ------------------------------------------------------------------ bound and report
    def _bound(self) -> float:
        """The virtual time by which the search must have ended: every hop one after another, each with
        the slowest training, commit and listing a schedule draws, plus for every fault and every try of
        every slot the longest the protocol may wait it out, and each block's late starts."""
        s = self.s
        hops = (len(s.configs) * s.rungs[-1] * s.shards if s.method == "asha"
                else sum(len(s.configs) * (e - b) for b, e in zip(Search(s).bounds, Search(s).bounds[1:])))
        op = s.latency[1] + (4.0 if s.transient else 0.0)
        per_hop = 1.25 * max(s.durations.values()) + 12 * op + 2 * s.lag_most + 2 * s.poll_most + 1.0
        tries = s.shards * s.slots * (s.retries + 1) * len(Search(s).bounds if s.method != "asha" else (0, 1))
        per_try = s.wait + 3 * sp.HEARTBEAT + s.stall + s.detect + s.retry_delay[1] + s.scheduler_late + s.give_back + 20
        return hops * per_hop + tries * per_try + sum(s.late.values()) + 60.0

    def _stuck(self) -> str:
        out = []
        for task in self.tasks:
            if task.state in ("success", "failed", "skipped"):
                continue
            m = task.proc.machine if task.proc is not None else None
            waits = "" if m is None else (f"; pending {[f'{h.config_id}/{h.hop}' for h in m.pending][:6]}, "
                                          f"given up {list(m.untrained)[:4]}")
            out.append(f"shard {task.shard} slot {task.slot} {task.state} try {task.try_number}{waits}")
        return "; ".join(out)



def _brief(act: Any) -> str:
    kind = type(act)
    if kind is str:
        return act
    if kind is sp.Train or kind is sp.Check:
        return " ".join(f"{h.config_id}/{h.hop}" for h, _ in act.members)
    if kind is sp.Write:
        return " ".join(f"{r.config_id}/{r.t}:{r.status}:{how}" for r, how in act.records)
    if kind is sp.Look:
        return " ".join(f"{h.config_id}/{h.hop}" for h, _, _ in act.hops)
    if kind is sp.ReadPeers:
        return str(list(act.owners))
    if kind is sp.Read:
        return " ".join(f"{cid}/{t}" for cid, t in act.keys)
    if kind is sp.Wait:
        return f"until {act.until:.3f}" + (" (commit)" if act.commit else "")
    if kind is sp.End:
        return "done" if act.done else f"incomplete {sorted(act.untrained)} for good {sorted(act.for_good)}"
    if kind is sp.Yield:
        return act.why
    return "" if kind is sp.Decide else str(act)
