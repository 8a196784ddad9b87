"""The faults of many machines around a slot's peers, in the slot simulation (issue 70).

Drawn from a stream of their own (``random.Random("peers-<seed>")``), so a schedule without them draws
exactly what it drew before; each is carried out by :class:`PeerWorld`, a mixin of
:class:`~slot_sim.world.World`:

- **a slot task that never starts** (no worker serves its queue, a Pod stays Pending, a crash before its
  first status), or one **late past the wait bound** (its pool held elsewhere). The slots waiting for it
  stop waiting within the bound (``Rules.yield_bound``, ``Rules.absent_peers``), naming it; a try that
  fails for good fails the block's tasks not started, with a final word, as the driver and the train
  operator (through the REST API) do;
- **a fatal failure** (a store outage past its retries, 409s past the limit) at a drawn moment of every
  try from a drawn one on: the try ends failed, for good on its last try (then ``PeerView`` must take
  the end as final even for a reader that began after it, ``Rules.stale_ends``);
- **clock skew** between hosts: a slot's statuses are stamped with its own clock, within the allowance
  the protocol claims (:data:`~mop_airflow.slots.messages.CLOCK_SKEW`) or past it (then the search may
  fail, but must end and stay correct);
- **reads that differ by reader**: a status seen late (as it was a few seconds before), and a record
  whose marker is listed but which still answers 404 to one reader for a while (``Rules.read_again``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from mop_airflow.errors import StoreError
from mop_airflow.slots import machine as sp
from mop_airflow.slots.status import never_started


@dataclass
class PeerFaults:
    """One schedule's peer faults (none: the schedule as drawn before them)."""

    never: set = field(default_factory=set)  # (block, shard, slot): its task never starts
    fatal: dict = field(default_factory=dict)  # (block, shard, slot) -> (first try, seconds into each try)
    skew: dict = field(default_factory=dict)  # (shard, slot) -> seconds its host's clock is ahead
    status_late: float = 0.0  # at most, how old a status a reader may see
    unread_share: float = 0.0  # share of record reads that answer 404 for a while though listed
    unread_most: float = 0.0  # for at most this long after the record landed
    rng: random.Random = field(default_factory=random.Random)  # what they draw as the schedule runs


def draw_peer_faults(seed: int, s: Any) -> PeerFaults:
    """The peer faults of schedule ``seed`` of shape ``s`` (which it marks beyond the envelope where they
    are: a late or absent slot past the wait bound, a fatal failure, skew past the allowance)."""
    rng = random.Random(f"peers-{seed}")
    f = PeerFaults(rng=random.Random(f"peers-run-{seed}"))
    blocks = max(1, s.runs, len(s.rungs) if s.method == "sha" else 1, s.pbt_blocks,
                 len({e for _, ends in s.brackets for e in ends}))
    places = [(b, shard, slot) for b in range(blocks) for shard in range(s.shards) for slot in range(s.slots)]
    if s.shards > 1 and rng.random() < 0.04:
        f.never.add(rng.choice(places))
        s.benign = False
    if rng.random() < 0.03:  # late past the wait bound
        s.late[rng.choice(places)] = s.wait + rng.uniform(5.0, 2 * s.wait)
        s.benign = False
    if rng.random() < 0.05:
        f.fatal[rng.choice(places)] = (rng.randint(1, s.retries + 1), rng.uniform(1.0, 30.0))
        s.benign = False
    if rng.random() < 0.1:
        past = rng.random() < 0.3
        for shard in range(s.shards):
            for slot in range(s.slots):
                most = 10.0 if past else sp.CLOCK_SKEW / 2  # two hosts within the allowance: each within half
                f.skew[shard, slot] = rng.uniform(-most, most)
        s.benign = s.benign and not past
    if rng.random() < 0.1:
        f.status_late = rng.uniform(0.5, 3.0)
    if rng.random() < 0.1:
        f.unread_share, f.unread_most = rng.choice((0.05, 0.3)), rng.uniform(0.5, 5.0)
    return f


class PeerWorld:
    """The World's part that carries the peer faults out (a mixin: the world's clock, tasks and store)."""

    pf: PeerFaults

    def _never_starts(self, task: Any) -> bool:
        """Its task waits in Airflow for ever: no worker serves its queue, or its pool never opens. Only
        where a peer waits for one of its hops (else nothing in the protocol can see it: the check before
        training, on queues and pools, is what sees it there)."""
        if (task.block.index, task.shard, task.slot) not in self.pf.never:
            return False
        if self.s.method == "asha":
            return True
        owner = {(h.config_id, h.hop): (h.shard, h.slot) for h in self.hops}
        return any(owner.get((cid, t + 1), task.shard_slot) != task.shard_slot
                   for (cid, t), place in owner.items() if place == task.shard_slot)

    def _absent_quiet(self) -> float:
        """What a slot that never starts adds to the longest a search may go without anything moving: an
        ASHA slot, or a slot whose hops are done while the absent one holds a hop that may still be needed
        (a configuration's last; seed 484752, a grid, waited 480 s), waits the wait bound of every try it
        has left at once before it fails naming it."""
        return self.s.wait * self.s.retries if self.pf.never else 0.0

    def _arm(self, task: Any, proc: Any) -> None:
        """A started try: its host's clock, and a fatal failure due on it."""
        proc.skew += self.pf.skew.get(task.shard_slot, 0.0)
        fatal = self.pf.fatal.get((task.block.index, task.shard, task.slot))
        if fatal is not None and task.try_number >= fatal[0]:
            self.at(self.now + fatal[1], self._store_gone, proc)

    def _store_gone(self, proc: Any) -> None:
        """A fatal error ends the try (after its status write): failed, for good on its last try
        (ManyMachines._fatal, the driver's one rule for a fatal error)."""
        if self._live(proc):
            self._fatal(proc, StoreError(f"the store went away (try {proc.task.try_number})", transient=True))

    def _status_seen(self, proc: Any, owner: tuple) -> Any:
        """Slot ``owner``'s status as ``proc`` reads it: perhaps as it was a moment ago, stamped with its
        writer's clock."""
        task = self.tasks[owner[0] * self.s.slots + owner[1]]
        late = self.pf.rng.uniform(0.0, self.pf.status_late) if self.pf.status_late else 0.0
        status = task.status(self.now - late)
        skew = self.pf.skew.get(owner, 0.0)
        return status if status is None or not skew else replace(status, heartbeat=status.heartbeat + skew)

    def _read_records(self, proc: Any, keys: tuple) -> bool:
        """The records listed markers name, as this reader reads them: one may answer 404 for a while.
        False: the read failed the try."""
        found, missing = {}, []
        for key in keys:
            if (self.pf.unread_share and self.pf.rng.random() < self.pf.unread_share
                    and self.now < self.landed.get(key, 0.0) + self.pf.unread_most):
                missing.append(key)
            else:
                found[key] = self.records[key]
        proc.machine.read(found)
        if missing:
            self.note("unreadable", proc.task.shard, proc.task.slot, [f"{cid}/{t}" for cid, t in missing])
            try:
                proc.machine.unreadable(missing)
            except LookupError:  # Rules.read_again off: a StoreError, fatal to the try (as before issue 70)
                self._store_gone(proc)
                return False
        return True

    def _end_absent(self, act: Any = None, only: set | None = None) -> None:
        """A try failed for good, so its block has: the block's tasks that have not started (never, a
        yield, or a retry not begun) are failed with a final word, as the driver (``status.end_never_started``)
        and the train operator (through the REST API) do; else a task that never starts kept the run going."""
        done = only is not None  # the block is over without them (Outcomes' unneeded_slots): they end done
        for task in self.tasks:
            if task.state != "queued" or (task.proc is not None and task.proc.alive):
                continue
            if not never_started(task.status(self.now)):  # production reads its status (end_never_started): a
                continue  # try that died says "running" still, and its retry is left to come
            if done and (task.shard, task.slot) not in only:
                continue
            task.state = "success" if done else "failed"
            number = task.word[1].try_number if task.word is not None else task.try_number
            task.word = (self.now, sp.PeerStatus(number, "done" if done else "failed", self.now, final=not done,
                                                 error="never started: " + ("the block finished without it" if done
                                                                            else "a slot of its block failed for good")))
            self.note("not started, failed", task.shard, task.slot)
            self._asha_changed()
