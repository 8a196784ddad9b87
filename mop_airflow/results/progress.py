"""How far a run is: model hops done of the plan's total, best metric so far, time left (or which task
waits for a worker, and since when).

Read from the run's own records in the store (the plan, one record per finished hop), so the demo,
``mop-airflow status`` and anything else show the same numbers. Which shards are busy right now
is Airflow's knowledge (running task instances); callers pass it in, naming each running train task
by the hop it trains now (:func:`training_now`, from the shard slots' status files).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from mop_airflow.records.layout import RunLayout
from mop_airflow.records import HopRecord, Plan, SlotStatus
from mop_airflow.results.runs import load_all_hops


@dataclass(frozen=True)
class Waiting:
    """A task Airflow queued that no worker has started since ``since`` (epoch seconds)."""

    task_id: str
    queue: str
    since: float

    def line(self, now: float | None = None, *, waited: bool = True) -> str:
        """``train_shard_1 waiting for a worker on queue mop_shard_1 since 14:40:53 UTC (32 s)``."""
        clock = time.strftime("%H:%M:%S UTC", time.gmtime(self.since))
        text = f"{self.task_id} waiting for a worker on queue {self.queue} since {clock}"
        return f"{text} ({format_seconds((time.time() if now is None else now) - self.since)})" if waited else text


@dataclass(frozen=True)
class Progress:
    hops_done: int              # hops finished, plus the hops a failed configuration will never run
    hops_total: int
    iteration: int              # the latest iteration any hop reached (1-based)
    iterations: int
    shards: int
    metric: str
    direction: str
    best: float | None = None
    best_config: str | None = None
    failed: tuple[str, ...] = ()
    elapsed: float = 0.0        # seconds since the first hop started
    eta: float | None = None    # seconds left at the rate hops finished so far
    busy: Mapping[int, Sequence[str]] = field(default_factory=dict)  # shard -> configurations training now
    # tasks no worker has started: while there are any, the time left means nothing and is not shown
    waiting: tuple[Waiting, ...] = ()

    @property
    def fraction(self) -> float:
        return min(1.0, self.hops_done / self.hops_total) if self.hops_total else 0.0

    def shard_line(self) -> str:
        return "  ".join(f"shard {s}: {', '.join(self.busy[s]) if self.busy.get(s) else 'idle'}"
                         for s in range(self.shards))

    def summary_line(self, eta: bool = True) -> str:
        best = (f"best {self.metric} {self.best:.4f} ({self.best_config})"
                if self.best is not None else "no validation yet")
        if self.waiting:  # how long it waited changes every second: only with eta, so a printed line is new once
            eta = "; " + "; ".join(w.line(waited=eta) for w in self.waiting)
        else:
            eta = f", about {format_seconds(self.eta)} left" if eta and self.eta else ""
        failed = f", {len(self.failed)} configuration(s) failed" if self.failed else ""
        return (f"model hops {self.hops_done}/{self.hops_total}, iteration {self.iteration}/{self.iterations}, "
                f"{best}{failed}{eta}")


def format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def training_now(layout: RunLayout, run_id: str, now: float | None = None, *, fresh: float = 30.0) -> dict[str, str]:
    """Train task id -> the hop its slot trains now (``c003-e000a6 t=5``) or ``waiting for hops``, for
    DAG run ``run_id``'s slots whose process said so within ``fresh`` seconds (the search's earlier
    runs' blocks are not read)."""
    now = time.time() if now is None else now
    out: dict[str, str] = {}
    for uri in layout.store.glob(layout.slots_glob(run_id)):
        status = SlotStatus.read(layout.store, uri)
        if status.state == "running" and status.task_id and now - status.heartbeat <= fresh:
            out[status.task_id] = status.training or "waiting for hops"
    return out


def run_progress(layout: RunLayout, metric: str, direction: str, *,
                 busy: Mapping[int, Sequence[str]] | None = None, now: float | None = None) -> Progress | None:
    """The run's progress, or None while its plan does not exist yet (validating and sharding)."""
    store = layout.store
    if not store.exists(layout.plan_uri):
        return None
    plan = Plan.read(store, layout.plan_uri)
    records, failures = load_all_hops(layout)
    return progress_of(plan, records, failures, metric, direction, busy=busy, now=now)


def progress_of(plan: Plan, records: Sequence[HopRecord], failures: Mapping[str, HopRecord], metric: str,
                direction: str, *, busy: Mapping[int, Sequence[str]] | None = None,
                now: float | None = None) -> Progress:
    now = time.time() if now is None else now
    done = len(records)
    if plan.adaptive is None:
        # a failed configuration's later hops are skipped, never run: count them as settled
        per_config = plan.iterations * plan.shards
        done += sum(per_config - f.t for f in failures.values())
    # as the leaderboard ranks: each configuration by its latest evaluation, not its best one ever
    latest: dict[str, float] = {}
    for r in sorted(records, key=lambda r: r.t):
        value = (r.val_metrics or {}).get(metric)
        if value is not None and r.config_id not in failures:
            latest[r.config_id] = value
    best, best_config = None, None
    for config_id, value in sorted(latest.items()):
        if not math.isfinite(value):
            continue
        if best is None or (value < best if direction == "min" else value > best):
            best, best_config = value, config_id
    started = [r.started_at for r in (*records, *failures.values()) if r.started_at]
    elapsed = now - min(started) if started else 0.0
    finished = len(records) + len(failures)
    remaining = max(0, plan.model_hops_total - done)
    eta = remaining * elapsed / finished if finished and elapsed > 0 else None
    return Progress(
        hops_done=min(done, plan.model_hops_total), hops_total=plan.model_hops_total,
        iteration=min(plan.iterations, max((r.iteration for r in records), default=0) + 1),
        iterations=plan.iterations, shards=plan.shards, metric=metric, direction=direction,
        best=best, best_config=best_config, failed=tuple(sorted(failures)), elapsed=elapsed,
        eta=eta if remaining else 0.0, busy=dict(busy or {}))
