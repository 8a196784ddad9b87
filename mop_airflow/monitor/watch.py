"""Follow a run in the terminal: a progress bar of model hops, each shard busy or idle, the best so
far and the time left. Used by ``mop-airflow status`` and the demo.

On a terminal it redraws in place (rich); into a pipe or a log it prints a line whenever something
changed, so scripts and CI logs stay readable.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable, TextIO

from mop_airflow.errors import AirflowApiError
from mop_airflow.hooks.rest import AirflowAPI
from mop_airflow.monitor.run_status import FINISHED, RunRef, busy_shards, find_run, waiting_for_worker
from mop_airflow.results.progress import Progress, format_seconds, run_progress, training_now


def snapshot(api: AirflowAPI, ref: RunRef, store_root: str | None = None) -> Progress | None:
    layout = ref.layout(store_root)
    if layout is None:
        return None
    busy = {} if ref.state in FINISHED else busy_shards(api, ref, ref.record.schedule.shards,
                                                        training_now(layout, ref.run_id))
    progress = run_progress(layout, ref.record.metric, ref.record.direction, busy=busy)
    if progress is None or ref.state in FINISHED:
        return progress
    return dataclasses.replace(progress, waiting=waiting_for_worker(api, ref))


def plain_line(ref: RunRef, progress: Progress | None, eta: bool = True) -> str:
    if ref.record is None:
        return f"{ref.state}: resolving the run (preflight)"
    if progress is None:
        return f"{ref.state}: validating and sharding the data"
    return f"{ref.state}: {progress.summary_line(eta)}"


def _renderable(ref: RunRef, progress: Progress | None) -> Any:
    from rich.console import Group  # noqa: PLC0415
    from rich.progress_bar import ProgressBar  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    head = Text(f"{ref.selection_id} / {ref.run_id}: {ref.state}", style="bold")
    if progress is None:
        return Group(head, Text(plain_line(ref, progress).split(": ", 1)[1]))
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=progress.hops_total, completed=progress.hops_done, width=40),
                Text(f"{progress.hops_done}/{progress.hops_total} model hops ({progress.fraction:.0%})"),
                Text("; ".join(w.line() for w in progress.waiting), style="yellow") if progress.waiting
                else Text(f"about {format_seconds(progress.eta)} left" if progress.eta else ""))
    shards = Table.grid(padding=(0, 2))
    for s in range(progress.shards):
        configs = progress.busy.get(s)
        shards.add_row(f"shard {s}", Text("busy: " + ", ".join(configs), style="green") if configs
                       else Text("idle", style="dim"))
    best = (f"best {progress.metric}: {progress.best:.4f} ({progress.best_config})" if progress.best is not None
            else "no validation metric yet")
    lines = [head, bar, Text(f"iteration {progress.iteration}/{progress.iterations}; {best}"), shards]
    if progress.failed:
        lines.append(Text(f"failed configurations: {', '.join(progress.failed)}", style="red"))
    return Group(*lines)


# How long a followed run's polls may keep failing on the server's side before the watch gives up. A busy
# Airflow on SQLite answers 500 ("Database error") now and then: at 32 slots its API server waited 30 s for
# a pooled database connection while the train tasks heartbeat. The run goes on, so the watch that follows
# it (the demo, the benchmarks, `mop-airflow status`) must too.
API_PATIENCE_S = 120.0


def _passing(error: AirflowApiError) -> bool:
    """A failure that the next poll may not meet: the server's own (5xx) or no answer at all. A refusal
    (401/403) or a run that is not there (404) is the same on every poll."""
    return error.status is None or error.status >= 500


def watch(api: AirflowAPI, dag_id: str, run_id: str | None, *, group: str | None = None, follow: bool = True,
          interval: float = 3.0, store_root: str | None = None, out: TextIO | None = None, live: bool | None = None,
          timeout: float | None = None, on_line: Callable[[str], None] | None = None,
          patience: float = API_PATIENCE_S) -> RunRef:
    """Show the run's progress until it ends (or once, ``follow=False``); returns its last state.
    ``group``: the MopTaskGroup whose selection to show (its hops only); None for a whole MOP DAG.
    Once the run was seen, a poll that fails on the server's side (5xx) or gets no answer is tried again
    every ``interval`` seconds, for up to ``patience`` seconds in a row; then its error is raised."""
    out = out or sys.stdout
    live = out.isatty() if live is None else live
    deadline = None if timeout is None else time.time() + timeout
    last = ""
    display = None
    record = None
    if live:
        from rich.console import Console  # noqa: PLC0415
        from rich.live import Live  # noqa: PLC0415

        display = Live(console=Console(file=out), refresh_per_second=4, transient=False)
        display.start()
    say = on_line or (lambda text: print(text, file=out, flush=True))
    seen = False  # a first poll that fails (a wrong address, no such run) is the caller's error at once
    failing_since: float | None = None
    try:
        while True:
            try:
                ref = find_run(api, dag_id, run_id, group=group, record=record)
                run_id, record = ref.run_id, ref.record
                progress = snapshot(api, ref, store_root)
            except AirflowApiError as error:
                now = time.time()
                failing_since = failing_since or now
                if not (seen and follow and _passing(error)) or now - failing_since > patience \
                        or (deadline is not None and now > deadline):
                    raise
                message = (f"polling again in {interval:.0f} s (the run goes on; giving up after {patience:.0f} s "
                           f"of failures): {error}")
                if display is not None:
                    display.console.print(message)
                else:
                    say(message)
                time.sleep(interval)
                continue
            seen, failing_since = True, None
            if display is not None:
                display.update(_renderable(ref, progress))
            else:
                # a new line when something but the time left changed
                key = plain_line(ref, progress, eta=False)
                if key != last:
                    say(plain_line(ref, progress))
                    last = key
            if not follow or ref.state in FINISHED:
                return ref
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"run {run_id} of {ref.selection_id} did not finish within {timeout:.0f} s")
            time.sleep(interval)
    finally:
        if display is not None:
            display.stop()
