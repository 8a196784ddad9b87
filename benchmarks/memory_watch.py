"""Memory of a process tree and of the whole machine, sampled as it runs (for benchmarks).

How memory is counted:

- ``machine``: MemTotal - MemFree - Buffers - Cached - SReclaimable + Shmem from /proc/meminfo,
  i.e. what processes and shared memory (e.g. Ray's object store in /dev/shm) hold, the page
  cache excluded; reported above the value sampled just before the case started (idle).
- ``tree PSS``: (reported above its value when the watch started) the sum of Pss over every process under the watched roots (/proc/<pid>/smaps_rollup).
  PSS splits a page shared by n processes into n parts, so processes forked from one parent (every
  Airflow task forks from a scheduler that preloaded TensorFlow) are not counted n times, as a sum
  of VmRSS would count them. Shared memory mapped by the processes is included the same way.
- per process: the largest VmRSS any one process reached, and at the moment of the tree's peak,
  every process above 200 MB with its RSS, PSS and command line (what ran at once).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

PERIOD = 0.2
GUARD_PERIOD = 0.02
# At most this share of one core goes to reading the tree's PSS. Reading smaps_rollup walks every
# mapping of a process: measured 0.43 s for the 14 processes of an embedded Airflow with TensorFlow
# loaded, on a loaded 2-core machine. Sampled every 0.2 s regardless, the watch took about half a
# core, a quarter of that machine, from the runs it measured (much of it kernel time).
DUTY = 0.1


def machine_used_bytes() -> int:
    info = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            name, value = line.split(":", 1)
            info[name] = int(value.split()[0]) * 1024
    return (info["MemTotal"] - info["MemFree"] - info["Buffers"] - info["Cached"] - info["SReclaimable"]
            + info["Shmem"])


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out.setdefault(ppid, []).append(int(name))
    return out


def tree(roots: list[int]) -> list[int]:
    children = _children()
    seen, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.append(pid)
            todo.extend(children.get(pid, []))
    return seen


def _process(pid: int) -> tuple[int, int, str] | None:
    """(RSS, PSS, command line) of ``pid`` in bytes, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            fields = {parts[0][:-1]: parts[1] for parts in map(str.split, handle) if parts and parts[0].endswith(":")}
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmd = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        return int(fields.get("Rss", 0)) * 1024, int(fields.get("Pss", 0)) * 1024, cmd
    except (OSError, ValueError):
        return None


@dataclass
class MemoryWatch:
    """Samples in a thread while in a ``with`` block; ``roots`` may change (e.g. a child started later)."""

    roots: list[int]
    kill_above: float | None = None    # bytes above idle at which ``on_limit`` is called (once)
    on_limit: object = None
    idle: int = field(default_factory=machine_used_bytes)
    peak_machine: int = 0
    peak_tree_pss: int = 0
    peak_process_rss: int = 0
    peak_process: str = ""
    at_peak: list[tuple[int, int, str]] = field(default_factory=list)
    limited: bool = False
    seen: set = field(default_factory=set)  # every pid sampled under the roots

    idle_tree_pss: int = 0

    def __enter__(self) -> "MemoryWatch":
        self.idle_tree_pss = sum(p[1] for p in map(_process, tree(self.roots)) if p is not None)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True)]
        if self.kill_above is not None:
            self._threads.append(threading.Thread(target=self._guard, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _guard(self) -> None:
        # Reading the whole tree's PSS takes up to a few tenths of a second; a process reading files
        # into memory grows by GBs in that time (measured: a 4 GB read_table outran a 0.2 s sample and
        # the kernel's OOM killer fired). The limit is therefore checked on its own, every 20 ms.
        while not self._stop.is_set() and not self.limited:
            machine = machine_used_bytes() - self.idle
            self.peak_machine = max(self.peak_machine, machine)  # cheap: the machine's peak every 20 ms
            if machine > self.kill_above:
                self.limited = True
                if callable(self.on_limit):
                    self.on_limit()
            self._stop.wait(GUARD_PERIOD)

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            self.sample()
            took = time.perf_counter() - began
            self._stop.wait(max(PERIOD, took * (1 - DUTY) / DUTY))

    def sample(self) -> None:
        machine = machine_used_bytes() - self.idle
        self.peak_machine = max(self.peak_machine, machine)
        pids = tree(self.roots)
        self.seen.update(pids)
        processes = [p for p in map(_process, pids) if p is not None]
        pss = sum(p[1] for p in processes)
        if pss > self.peak_tree_pss:
            self.peak_tree_pss = pss
            self.at_peak = sorted((p for p in processes if p[0] > 200e6), reverse=True)
        for rss, _, cmd in processes:
            if rss > self.peak_process_rss:
                self.peak_process_rss, self.peak_process = rss, cmd
