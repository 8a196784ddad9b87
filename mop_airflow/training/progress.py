"""A count of what this process's training has done: every training or evaluation batch, every hop
committed, every look for another slot's hop. A shard slot's status carries it, and its watchdog
(:mod:`~mop_airflow.slots.watchdog`) reads it: a slot is judged by this count moving, not by being
alive, since a hung step or a stalled mount keeps every heartbeat going.

The watchdog's bound follows the steps it has seen (the time between two moves of the count), so a
step much longer than those before it must say so first: :func:`long_step` (a model to build, whose
first step then traces and compiles; a large file to fetch).

A plain integer bumped without a lock: two threads may lose a bump, never the fact that it moved.
"""

from __future__ import annotations

_done = 0
_long_until = 0  # the count the steps announced by long_step() end at


def tick() -> None:
    global _done
    _done += 1


def count() -> int:
    return _done


def long_step() -> None:
    """Say that what this process does next may take as long as a slot's start: building a model
    (whose first step then traces and compiles), fetching a large file. Until the count has moved
    twice more (a tick comes before each batch, so the second one follows a whole first step), a
    watchdog waits with its long bound, ``MOP_SHARD_STALL_SECONDS``, not the one learned from the
    steps so far."""
    global _long_until
    _long_until = _done + 2


def long_until() -> int:
    """The count before which a step announced by :func:`long_step` may still be in progress."""
    return _long_until
