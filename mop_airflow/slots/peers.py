"""How a slot judges another slot of its block: started, absent, gone, or dead on its last try.

A slot that waits for a peer's hops, or yields its pool slot to a peer ranked before it, decides from
the statuses it reads of that peer (:class:`PeerView`), never from the peer's heartbeat alone: a hung
process may heartbeat for ever. Kept apart from the machine (:mod:`~mop_airflow.slots.machine`) because
the judgement is one rule of its own, which the simulation's planted bugs break on their own
(``PeerView.gone``, ``PeerView.read``, :func:`died_on_last_try`, patched here where it is called).
"""

from __future__ import annotations

from typing import Any

from mop_airflow.planning.task_plan import shard_pool
from mop_airflow.slots.messages import CLOCK_SKEW, NEVER, died_on_last_try


class PeerView:
    """Another slot of the block, as the statuses read of it show it (a :class:`PeerStatus`, or a
    ``SlotStatus``: the same fields). It is judged by its progress count moving (batches trained, hops
    committed, looks for hops), not by its heartbeat: a process whose training hangs may heartbeat for
    ever. ``began``: when the waiting slot's task began; ``since``: when it began to wait for this one;
    ``dies``: Rules.last_try_dies; ``stale_ends``, ``absent``: Rules.stale_ends, Rules.absent_peers;
    ``shard``: the peer's shard (its pool and queue are named after it).

    Statuses are stamped with the writer's clock and read against the reader's: an end counts as said
    since the reader began when stamped at most :data:`CLOCK_SKEW` before it. Skew past that costs at
    most the wait bound (such an end counts once it has stood that long with no later try)."""

    def __init__(self, began: float, since: float, dies: bool = True, name: str = "", *, stale_ends: bool = True,
                 absent: bool = True, shard: int | None = None) -> None:
        self.began = began - CLOCK_SKEW  # clocks apart by up to CLOCK_SKEW
        self.alive_at, self.read_at = since, -NEVER  # when its progress last moved; when it was last read
        self.dies, self.name, self.stale_ends, self.absent_rule, self.shard = dies, name, stale_ends, absent, shard
        self.latest: Any = None  # the newest try's last word, whenever it was said
        self.status: Any = None  # the same, unless an end said before the waiting slot began
        self.seen = False

    def read(self, status: Any, at: float) -> None:
        """A read of its status at ``at`` (None: no status file)."""
        if status is None:
            return
        before = self.latest
        if before is not None and status.try_number < before.try_number:
            return  # a late word of a try older than one already read
        if before is None or (status.try_number, status.state, status.progress) != (
                before.try_number, before.state, before.progress):
            self.alive_at = max(self.alive_at, at)
        self.latest = status
        # an end said before the waiting slot's task began may be an earlier try's of a run cleared since:
        # only its progress counts then, and the peer's new try says more soon
        self.status = status if status.state == "running" or status.heartbeat >= self.began else None

    def started(self, now: float, wait: float) -> bool:
        """Whether the peer runs (it ran since the waiting slot's task began) or ended its block (done,
        failed for good, or died on its last try) whenever that was; once seen, it is not read again for
        this. A peer that gave its pool slot back, or fails and waits for its retry, has not: another
        block may hold its pool."""
        if not self.seen:
            s = self.latest
            # a "done" said before this slot began counts too: a retried slot whose peers ended must not
            # give its pool slot back for them (in a run cleared since, their hops are committed anyway)
            self.seen = s is not None and (s.state == "done" or (s.state == "failed" and s.final) or (
                s.state == "running" and s.heartbeat >= self.began) or (self.dies and died_on_last_try(s, now, wait)))
        return self.seen

    def absent(self, now: float, wait: float) -> bool:
        """Whether the peer has not started for the wait bound: no status at all, or it gave its pool slot
        back, or its try failed and no retry has begun. Its task waits in Airflow: for a worker that
        serves its queue, or a free slot of its pool."""
        s = self.latest
        return (self.absent_rule and now - self.alive_at > wait
                and (s is None or s.state == "yielded" or (s.state == "failed" and not s.final)))

    def may_have_ended(self, now: float, wait: float) -> bool:
        """Whether :meth:`gone` may say ended for good: never of a peer not heard, nor of one heard running
        unless dead on its last try (a cheap test first, as an ASHA slot judges every slot at each call)."""
        latest = self.latest
        return latest is not None and (latest.state != "running" or (self.dies and died_on_last_try(latest, now, wait)))

    def gone(self, now: float, wait: float) -> tuple[str, bool] | None:
        """Why the hops the waiting slot needs from the peer will not come, and whether never (the peer
        ended for good) or not within ``wait`` (it may still come: a retry of the waiting slot waits
        again); None while they may."""
        s, name, latest = self.status, self.name, self.latest
        if s is not None and s.state == "failed" and s.final:
            return (f"{name} failed for good on its try {s.try_number} "
                    f"({(getattr(s, 'error', None) or 'no error recorded').splitlines()[0]})", True)
        if s is not None and s.state == "done":
            return f"{name} finished its block without this hop's input (it lost it too)", True
        if self.dies and died_on_last_try(latest, now, wait):
            return (f"{name} died on its last try {latest.try_number}: its heartbeat stopped "
                    f"{now - latest.heartbeat:.0f} s ago and no retry follows", True)
        if (self.stale_ends and latest is not None and now - self.alive_at > wait
                and (latest.state == "done" or (latest.state == "failed" and latest.final))):
            # said before this slot began: a run cleared since would have started the peer's next try by
            # now, so the end is this run's (a final failure read late, a clock behind): it stands
            ended = "finished its block" if latest.state == "done" else "failed for good"
            return (f"{name} {ended} on its try {latest.try_number} before this slot's task began, and no later "
                    f"try of it has started in {wait:.0f} s ("
                    f"{(getattr(latest, 'error', None) or 'no error recorded').splitlines()[0]})", True)
        if self.absent(now, wait):
            return self._absent_why(now, wait), False
        if now - self.alive_at > wait:
            return (f"{name} made no progress for {now - self.alive_at:.0f} s (the bound is {wait:.0f} s, "
                    "MOP_SHARD_WAIT_SECONDS): it may be late (its pool slots held elsewhere) or hung", False)
        return None

    def _absent_why(self, now: float, wait: float) -> str:
        s = self.latest
        what = ("has not started: it wrote no status" if s is None else
                "gave its pool slot back and has not started again" if s.state == "yielded" else
                f"failed its try {s.try_number} and its retry has not started")
        where = "" if self.shard is None else (
            f"; its task waits in Airflow: no worker may serve its queue {shard_pool(self.shard)}, or its pool "
            f"{shard_pool(self.shard)} may have no free slot (another DAG holds them, or it has too few)")
        return (f"{self.name} {what} in {now - self.alive_at:.0f} s (the bound is {wait:.0f} s, "
                f"MOP_SHARD_WAIT_SECONDS){where}")
