"""How long a search may take: the fault-free run's time plus the stated cost of each fault injected.

A search with faults within the envelope (those the protocol must absorb) must end by the time the
same search takes without them, plus what each fault it injected may cost, from :data:`COSTS`, the
table ``docs/concepts/shard-slots.md`` shows users. Not a loose multiple of a worst case: a planted
bug that makes hops wait longer than a fault explains (a peer's progress ignored, a look-up that
comes late) shows as a schedule past its time.

The fault-free time comes from the same search run without its faults, every hop as slow as its
drawn duration may make it (the simulation draws each hop's seconds between 0.8 and 1.25 of its
configuration's: the reference takes 1.25 / 0.8 of them, so its hops are never quicker than the
faulted run's), against the same store.

Each cost is the longest the protocol, as documented, may spend on the fault: for a slot killed,
Airflow's detection, its retry delay, the scheduler's lateness, the retry's start, and the hops the
slot trains again (the one in progress and those trained but not committed, at most ``STATES_HELD``).
A fault kind added to the world adds its row here, with its cost in the same words.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable

from slot_sim.oracle import reference
from slot_sim.shapes import hops_each
from mop_airflow.slots.messages import HEARTBEAT, READ_AGAIN, STATES_HELD

RESCHEDULE = 20.0  # the most a yielded slot waits to be started again (the world: 10 to 20 s)
JITTER = 1.25 / 0.8  # the reference's hops against the quickest a faulted run's may be


def _hops_again(s) -> float:
    """A try lost mid-hop: the hop in progress and those not committed, trained again, and the retry's
    first reads (its status, the markers, its earlier try's commits)."""
    return (1 + STATES_HELD) * 1.25 * max(s.durations.values()) + 4 * _op(s)


def _op(s) -> float:
    """One store request, its retries included."""
    return s.latency[1] + (4.0 if s.transient else 0.0)


def _restart(s) -> float:
    return s.detect + s.retry_delay[1] + s.scheduler_late + _hops_again(s) + HEARTBEAT


# fault kind -> (what it costs, in words; seconds, from the shape and the fault's own seconds)
COSTS: dict[str, tuple[str, Callable]] = {
    "kill": ("a slot's try killed (SIGKILL, a lost worker): Airflow sees it gone (its detection), retries it "
             "after the retry delay and the scheduler's lateness, and the retry trains again the hop in progress "
             "and those trained but not committed (at most 2)",
             lambda s, seconds: _restart(s)),
    "stop": ("a slot hung (SIGSTOP): its watchdog kills it after the stall bound, then as a kill",
             lambda s, seconds: s.stall + _restart(s)),
    "late": ("a slot's pool held elsewhere for a while: those seconds, then the slots that gave their pool slot "
             "back meanwhile come again (a reschedule, the scheduler's lateness)",
             lambda s, seconds: seconds + s.give_back + RESCHEDULE + s.scheduler_late + HEARTBEAT),
    # the faults of many machines (issue 70; slot_sim.machines): each ends a try as a kill does
    "zombie": ("a slot's try taken for dead (its host paused, or cut off) while Airflow retries it, then back for up "
               "to 40 s beside its retry: as a kill, and the old copy's writes, fenced, cost the retry nothing more "
               "than the 40 s it may hold its hops",
               lambda s, seconds: _restart(s) + 40.0),
    "commit_fails": ("a commit that fails past its retries: the try ends, then as a kill",
                     lambda s, seconds: _restart(s)),
    "sigterm": ("a graceful stop mid-block: the try ends after its commits, then as a kill",
                lambda s, seconds: _restart(s)),
}


def world_costs(s, w) -> list[tuple[str, float]]:
    """The costs of the faults a world draws as it runs (not in the shape): markers no listing shows, or
    shows only after a later name was listed (each waited for until it is looked up), statuses read late, records listed but not readable yet
    (each read again until it is: along a configuration's chain, every hop at most once)."""
    out = []
    if getattr(w, "fault_allowance", 0.0):
        out.append(("lost listing entries", w.fault_allowance))
    # a marker a lagging listing showed only after a later name it had listed: no poll lists it again, and the
    # slot waiting for it looks its record up after look_after (slot_sim seed 105649: a minute, past the
    # slack the listings' lag had)
    past = {key[-2:] for key in getattr(w, "missed", {})}
    if past:
        look = w.rules.look_after if w.rules.look_after is not None else s.wait
        out.append(("markers listed past", len(past) * (look + 2 * s.poll_most + 4 * s.latency[1] + 1.0)))
    pf = getattr(w, "pf", None)
    if pf is not None and pf.status_late:
        out.append(("statuses read late", 2 * pf.status_late + HEARTBEAT))
    if pf is not None and pf.unread_share:
        out.append(("records not readable yet", hops_each(s) * (pf.unread_most + READ_AGAIN + _op(s))))
    return out


def faults_of(s) -> list[tuple[str, float]]:
    """Every fault a shape injects, as ``(kind, its own seconds)``."""
    return ([(kind, 0.0) for *_, kind in s.faults] + [("late", seconds) for seconds in s.late.values()])


def allowance(s, w=None) -> tuple[float, list[str]]:
    """The seconds the faults of shape ``s`` (and those world ``w`` drew as it ran) may add, and each one's
    share in words."""
    total, parts = 0.0, []
    for kind, seconds in faults_of(s):
        cost = COSTS[kind][1](s, seconds)
        total += cost
        parts.append(f"{kind} {cost:.0f} s")
    for kind, cost in world_costs(s, w) if w is not None else ():
        total += cost
        parts.append(f"{kind} {cost:.0f} s")
    # the weather, not a fault: store requests retried, listings late; the reference draws its own
    slack = 10.0 + 8 * _op(s) + 2 * s.lag_most + 2 * s.poll_most
    return total + slack, parts + [f"store and listings {slack:.0f} s"]


def fault_free_floor(s) -> float:
    """The least virtual time the search of shape ``s`` takes without its faults (:func:`reference_shape`:
    each hop at least 1.25 of its configuration's seconds): the longest a configuration's hops take one
    after another, or all its hops over all its slots, whichever is more. A grid's hops are the reference's
    (:func:`~slot_sim.oracle.reference`); ASHA without a budget trains at least each configuration's first
    leg, up to the hop it fails at."""
    if s.method == "asha":
        if s.budget is not None:
            return 0.0
        first = s.rungs[0] * s.shards
        hops = {cid: min(first, s.fail[cid][0]) if cid in s.fail else first for cid in s.configs}
    else:
        hops = Counter(cid for cid, _ in reference(s).trained)
    least = {cid: 1.25 * s.durations[cid] * n for cid, n in hops.items()}
    return max(max(least.values(), default=0.0), sum(least.values()) / (s.shards * s.slots))


def reference_shape(s):
    """Shape ``s`` without its faults, each hop as slow as its draw may make it."""
    return dataclasses.replace(s, faults=[], late={}, durations={c: d * JITTER for c, d in s.durations.items()})
