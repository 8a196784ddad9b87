"""A count of what this process's training has done: every training or evaluation batch, every hop
committed, every look for another slot's hop. A shard slot's status carries it, and its watchdog
(:mod:`~mop_airflow.training.watchdog`) reads it: a slot is judged by this count moving, not by being
alive, since a hung step or a stalled mount keeps every heartbeat going.

A plain integer bumped without a lock: two threads may lose a bump, never the fact that it moved.
"""

from __future__ import annotations

_done = 0


def tick() -> None:
    global _done
    _done += 1


def count() -> int:
    return _done
