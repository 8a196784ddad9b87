"""A shard slot's watchdog: a small process of its own that SIGKILLs the slot's task process when its
progress count (:mod:`~mop_airflow.training.progress`) has not moved for longer than its stall bound.

Why a process: a hung slot cannot be trusted to notice itself. A step that deadlocks, or a read from
a stalled mount, stops only the training thread, but a step stuck in native code may hold the GIL,
and a process stopped by SIGSTOP runs none of its threads. Airflow does not notice either: its task
supervisor heartbeats for the task whatever the task does, and ``execution_timeout`` is an alarm
inside the task process (airflow/sdk/execution_time/task_runner.py), which a stopped process never
handles. The watchdog is fed the count and the bound by a thread of the task process once a second;
when the count stays the same, or nothing arrives, for the bound, it kills the task process, whose
supervisor then fails the try and Airflow retries it (the retry skips the hops already committed).
When the task process ends the pipe closes and the watchdog ends with it.

The bound follows the steps seen (:class:`StallBound`): ``MOP_SHARD_STALL_SECONDS`` (300 s) before the
slot's first step, which waits out reading its shard and building and compiling its first model; then
10 times the slowest time between two moves of the count so far, at least
``MOP_SHARD_STALL_FLOOR_SECONDS`` (60 s) and at most ``MOP_SHARD_STALL_SECONDS``. A step announced by
:func:`~mop_airflow.training.progress.long_step` (a model built mid-block, a large file fetched) has a
bound of its own, learned the same way from the long steps seen: ``MOP_SHARD_STALL_SECONDS`` until the
first one ended (the slot's first model build, in its start), then 5 times the slowest long step so far,
at least twice the floor (120 s) and at most ``MOP_SHARD_STALL_SECONDS``. A slot hung in a model build
then costs that bound (2 minutes for builds of seconds) and Airflow's retry, not the 300 s ceiling.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from typing import Callable

from mop_airflow.errors import SpecError
from mop_airflow.training import progress

log = logging.getLogger(__name__)

STALL_ENV = "MOP_SHARD_STALL_SECONDS"
FLOOR_ENV = "MOP_SHARD_STALL_FLOOR_SECONDS"
# The bound before the first step, and the ceiling: longer than anything a healthy slot does before
# its first batch (copying its shard to local disk, building and compiling the largest model) or in a
# long step it announced (progress.long_step).
STALL_SECONDS = 300.0
# Once steps are seen the bound is STALL_MULTIPLE x the slowest time between two moves of the count
# so far, at least STALL_FLOOR_SECONDS:
# - the slowest time seen includes the first step's trace and compile (a tick comes before each batch),
#   and every pause between hops; 10 x that leaves room for the same work on a machine other slots load
#   (4 slots on 2 cores make a batch 2-4 x slower), evaluation's first step, a checkpoint read;
# - 60 s is as long as the store waits for an endpoint that does not answer (Store.retry_seconds) before
#   it fails the task by itself: a warm slot whose commit waits out a store outage has no batch to tick
#   meanwhile, and is not killed for it. It also outlasts a garbage collection or a slow listing. A hung
#   slot then costs about a minute and Airflow's retry (10-20 s and the task's start): within 3 minutes;
# - anything longer still (a much larger model built mid-block) says so first: progress.long_step().
# A long step that was waited out counts as a step: the bound grows with it for the rest of the task.
STALL_FLOOR_SECONDS = 60.0
STALL_MULTIPLE = 10.0
# A long step's bound once one was seen: LONG_MULTIPLE x the slowest long step so far (from its
# announcement to the end of the first step after it: a build, its restore, its first trace and compile),
# at least LONG_FLOOR_TIMES x the floor:
# - the first build is seen in the slot's start (every slot builds its first model there), so the 300 s
#   ceiling holds only before it;
# - a later build may be of a larger architecture than any before, and another slot may load the
#   machine: 5 x the slowest leaves room for a model several times slower to build, and 120 s for any
#   build of up to two minutes whatever came before; a build longer still says so in the log when it
#   is killed, and MOP_SHARD_STALL_FLOOR_SECONDS raises the floor;
# - a hung build then costs 120 s (builds of seconds) and Airflow's retry: within the 3 minutes a hung
#   step costs.
LONG_MULTIPLE = 5.0
LONG_FLOOR_TIMES = 2.0
FEED_SECONDS = 1.0

# Run with ``python -S -c``: only the standard library, so it starts in tens of milliseconds. Each line
# the task process sends is "<count> <bound in seconds> <how the bound was set>".
_WATCH = r"""
import os, select, signal, sys, time
target, stall, fd = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
why = "the bound before a first step, MOP_SHARD_STALL_SECONDS"
last, since, buffer = None, time.monotonic(), b""
while True:
    readable, _, _ = select.select([fd], [], [], 0.25)
    if readable:
        chunk = os.read(fd, 4096)
        if not chunk:
            sys.exit(0)  # the task process ended: nothing to watch
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
            value, bound, why = line.decode().split(" ", 2)
            stall = float(bound)
            if value != last:
                last, since = value, time.monotonic()
    if time.monotonic() - since > stall:
        sys.stderr.write(f"mop_airflow watchdog: no progress in process {target} for {round(stall, 1):g} s ({why}): "
                         "killing it\n")
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sys.exit(0)
"""


def _seconds(environ, name: str, default: float, rule: str) -> float:
    value = (environ.get(name) or "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise SpecError(name, value, rule, f"set {name}={default:.0f} or unset it")
    return seconds


def stall_seconds(environ=os.environ) -> float:
    """The bound before the slot's first step, and the ceiling of the one learned after it:
    ``MOP_SHARD_STALL_SECONDS``, or :data:`STALL_SECONDS`; 0 turns the watchdog off. Checks
    ``MOP_SHARD_STALL_FLOOR_SECONDS`` too, so a bad value fails the task before it trains."""
    seconds = _seconds(environ, STALL_ENV, STALL_SECONDS,
                       "must be a number of seconds >= 0 (0 turns the watchdog off)")
    if seconds:
        stall_floor_seconds(environ)
    return seconds


def stall_floor_seconds(environ=os.environ) -> float:
    """The least bound once steps are seen: ``MOP_SHARD_STALL_FLOOR_SECONDS``, or :data:`STALL_FLOOR_SECONDS`.
    Set to ``MOP_SHARD_STALL_SECONDS`` or more, the bound is that one, fixed."""
    return _seconds(environ, FLOOR_ENV, STALL_FLOOR_SECONDS,
                    f"must be a number of seconds >= 0 (the least stall bound once steps are seen; set it to "
                    f"{STALL_ENV} for a fixed bound)")


class StallBound:
    """How long the progress count may stand still, from what it did so far (read once a second).

    Before the count has moved twice (a tick comes before each batch, so the second follows a whole
    first step, its trace and compile) and during a step announced by
    :func:`~mop_airflow.training.progress.long_step`: ``ceiling``. Otherwise ``multiple`` x the longest
    time seen between two moves of the count (the first move, at the end of the slot's start, excepted;
    ``read_every`` at least, as the count is read no more often), at least ``floor``, at most ``ceiling``."""

    def __init__(self, ceiling: float, floor: float = STALL_FLOOR_SECONDS, multiple: float = STALL_MULTIPLE,
                 read_every: float = FEED_SECONDS, long_multiple: float = LONG_MULTIPLE) -> None:
        self.ceiling, self.floor, self.multiple = ceiling, floor, multiple
        self.long_multiple, self.long_floor = long_multiple, LONG_FLOOR_TIMES * floor
        self.read_at: float | None = None  # when the count was last read
        self.long_mark = 0  # the end of the latest long step announced, as last read
        self.long_began: float | None = None  # the long step in progress: began at most at the read before it was seen
        self.slowest_long: float | None = None  # the longest long step seen to its end (None: none yet)
        self.first: int | None = None  # the count when the watchdog began
        self.last: int | None = None
        self.moved_at: float | None = None  # when the count last moved (None: not since it began)
        # the longest time between two moves of the count seen; the count is read every ``read_every``
        # seconds, and quicker steps look that long to the watchdog
        self.slowest = read_every

    def see(self, count: int, now: float, long_until: int = 0) -> tuple[float, str]:
        """The bound after reading ``count`` at ``now`` (monotonic seconds), and how it was set.
        ``long_until``: the count a long step announced ends at."""
        if self.first is None:
            self.first = self.last = count
        elif count != self.last:
            if self.moved_at is not None:
                self.slowest = max(self.slowest, now - self.moved_at)
            self.moved_at, self.last = now, count
        self._see_long(count, now, long_until)
        if count < self.first + 2:
            return self.ceiling, f"the bound before a first step, {STALL_ENV}"
        if count < long_until:
            return self._long_bound()
        learned = max(self.floor, self.multiple * self.slowest)
        if learned >= self.ceiling:
            return self.ceiling, (f"{self.multiple:g} x its slowest step so far ({self.slowest:.1f} s), "
                                  f"at most {STALL_ENV}")
        return learned, (f"{self.multiple:g} x its slowest step so far ({self.slowest:.1f} s), "
                         f"at least {FLOOR_ENV}={self.floor:g}")


    def _see_long(self, count: int, now: float, long_until: int) -> None:
        """Time the long steps announced: each from the read before the one that first saw it (it may have
        begun just after it) to the read that sees the count past its end."""
        if long_until != self.long_mark:
            self.long_mark = long_until
            self.long_began = now if self.read_at is None else self.read_at
        if self.long_began is not None and count >= long_until:
            self.slowest_long = max(self.slowest_long or 0.0, now - self.long_began)
            self.long_began = None
        self.read_at = now

    def _long_bound(self) -> tuple[float, str]:
        if self.slowest_long is None:
            return self.ceiling, f"the bound of a long step before one was seen to its end, {STALL_ENV}"
        learned = max(self.long_floor, self.long_multiple * self.slowest_long)
        seen = (f"{self.long_multiple:g} x its slowest long step so far (a model built, a file fetched: "
                f"{self.slowest_long:.1f} s)")
        if learned >= self.ceiling:
            return self.ceiling, f"{seen}, at most {STALL_ENV}"
        return learned, f"{seen}, at least {LONG_FLOOR_TIMES:g} x {FLOOR_ENV}={self.long_floor:g}"


class Watchdog:
    """Started by a slot that runs as its own task; :meth:`stop` when the slot ends. ``stall``: the bound
    before the first step and the ceiling (:class:`StallBound`); ``floor``: by default
    ``MOP_SHARD_STALL_FLOOR_SECONDS``. ``count`` and ``long_until`` read the progress count and the end
    of a long step announced (:mod:`~mop_airflow.training.progress`)."""

    def __init__(self, stall: float, count: Callable[[], int] = progress.count, target: int | None = None, *,
                 floor: float | None = None, multiple: float = STALL_MULTIPLE,
                 long_until: Callable[[], int] = progress.long_until) -> None:
        self.stall, self.count, self.long_until = stall, count, long_until
        self.bound = StallBound(stall, stall_floor_seconds() if floor is None else floor, multiple)
        read, self._write = os.pipe()
        try:
            # a session of its own: a signal to the task's process group (SIGSTOP included) leaves it running
            self.process = subprocess.Popen([sys.executable, "-S", "-c", _WATCH, str(target or os.getpid()),
                                             repr(float(stall)), str(read)], pass_fds=(read,),
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(read)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._feed, name="mop-watchdog-feed", daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        while True:
            count = self.count()
            bound, why = self.bound.see(count, time.monotonic(), self.long_until())
            try:  # one line, far below PIPE_BUF: written whole
                os.write(self._write, f"{count} {bound!r} {why}\n".encode())
            except OSError:
                return  # the watchdog ended (or stop closed the pipe)
            if self._stopped.wait(FEED_SECONDS):
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=2 * FEED_SECONDS)
        try:
            os.close(self._write)  # the watchdog reads the end of the pipe and exits
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
