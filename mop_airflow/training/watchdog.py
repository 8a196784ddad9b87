"""A shard slot's watchdog: a small process of its own that SIGKILLs the slot's task process when
its progress count (:mod:`~mop_airflow.training.progress`) has not moved for ``MOP_SHARD_STALL_SECONDS``.

Why a process: a hung slot cannot be trusted to notice itself. A step that deadlocks, or a read from
a stalled mount, stops only the training thread, but a step stuck in native code may hold the GIL,
and a process stopped by SIGSTOP runs none of its threads. Airflow does not notice either: its task
supervisor heartbeats for the task whatever the task does, and ``execution_timeout`` is an alarm
inside the task process (airflow/sdk/execution_time/task_runner.py), which a stopped process never
handles. The watchdog is fed the count by a thread of the task process once a second; when the count
stays the same, or nothing arrives, for the bound, it kills the task process, whose supervisor then
fails the try and Airflow retries it (the retry skips the hops already committed). When the task
process ends the pipe closes and the watchdog ends with it.
"""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import threading
from typing import Callable

from mop_airflow.errors import SpecError
from mop_airflow.training import progress

log = logging.getLogger(__name__)

STALL_ENV = "MOP_SHARD_STALL_SECONDS"
# Longer than anything a healthy slot does without a batch, a commit or a look for another slot's hop:
# building and compiling a large model, reading a large checkpoint, copying its shard to local disk.
STALL_SECONDS = 300.0
FEED_SECONDS = 1.0

# Run with ``python -S -c``: only the standard library, so it starts in tens of milliseconds.
_WATCH = r"""
import os, select, signal, struct, sys, time
target, stall, fd = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
last, since, buffer = None, time.monotonic(), b""
while True:
    readable, _, _ = select.select([fd], [], [], 1.0)
    if readable:
        chunk = os.read(fd, 4096)
        if not chunk:
            sys.exit(0)  # the task process ended: nothing to watch
        buffer += chunk
        while len(buffer) >= 8:
            value, buffer = struct.unpack("<q", buffer[:8])[0], buffer[8:]
            if value != last:
                last, since = value, time.monotonic()
    if time.monotonic() - since > stall:
        sys.stderr.write(f"mop_airflow watchdog: no progress in process {target} for {stall:.0f} s: killing it\n")
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sys.exit(0)
"""


def stall_seconds(environ=os.environ) -> float:
    """The bound: ``MOP_SHARD_STALL_SECONDS``, or :data:`STALL_SECONDS`; 0 turns the watchdog off."""
    value = (environ.get(STALL_ENV) or "").strip()
    try:
        seconds = float(value) if value else STALL_SECONDS
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise SpecError(STALL_ENV, value, "must be a number of seconds >= 0 (0 turns the watchdog off)",
                        f"set {STALL_ENV}={STALL_SECONDS:.0f} or unset it")
    return seconds


class Watchdog:
    """Started by a slot that runs as its own task; :meth:`stop` when the slot ends."""

    def __init__(self, stall: float, count: Callable[[], int] = progress.count, target: int | None = None) -> None:
        self.stall, self.count = stall, count
        read, self._write = os.pipe()
        try:
            # a session of its own: a signal to the task's process group (SIGSTOP included) leaves it running
            self.process = subprocess.Popen([sys.executable, "-S", "-c", _WATCH, str(target or os.getpid()),
                                             str(stall), str(read)], pass_fds=(read,), stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        finally:
            os.close(read)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._feed, name="mop-watchdog-feed", daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        while True:
            try:
                os.write(self._write, struct.pack("<q", self.count()))
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
