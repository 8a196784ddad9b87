"""The `mop-airflow` commands that read runs: `status`, `report`, `runs`, `predict`, `export-best` and
`champion list / publish` (those in :mod:`mop_airflow.cli.models` and :mod:`mop_airflow.cli.champion`,
on the helpers here), and the exit codes every command shares.

A command reads one **model selection** (:mod:`mop_airflow.records.selection`): a DAG built by
``build_mop_dag``, or with ``--group ID`` one MopTaskGroup of a DAG. Its runs' files, registry and
Asset are named by the selection id (``<dag_id>`` or ``<dag_id>.<group_id>``); Airflow is asked by
the real DAG id and the selection's own task ids. A DAG whose selections are groups has no
selection of its own, so without ``--group`` the command stops naming the groups it found.

Reading a run needs no Airflow: with ``--store`` (or when Airflow cannot be reached and the run is
in the default store) `report`, `status --once` and `runs` read the store alone and say so.
Everything heavy (Airflow, TensorFlow) is imported inside the command that needs it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mop_airflow.config.environment import env

OK, FAILED, USAGE, UNAVAILABLE, INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_PORT = 8080


def fail(message: str, code: int) -> int:
    print(f"mop-airflow: {message}", file=sys.stderr)
    return code


def api(args: argparse.Namespace):
    from mop_airflow.hooks.rest import AirflowAPI  # noqa: PLC0415

    url = args.api_url or env("MOP_API_URL")
    if not url:  # the Airflow `mop-airflow up` started from this folder, else Airflow's default port
        marker = Path(args.home) / "airflow" / "api_url"
        url = marker.read_text().strip() if marker.exists() else f"http://localhost:{DEFAULT_PORT}"
    return AirflowAPI(url, args.username, env("MOP_API_PASSWORD"))


# ---------------------------------------------------------------- which selection
def selection_of(args: argparse.Namespace) -> str:
    """What names the runs' folders, registry and Asset: the DAG id, or ``<dag_id>.<group>``."""
    from mop_airflow.records.selection import selection_id  # noqa: PLC0415

    return selection_id(args.dag_id, args.group)


def named(args: argparse.Namespace) -> str:
    """The selection for a person: ``DAG 'etl'``, or ``DAG 'etl' (group 'model_selection')``."""
    return f"DAG {args.dag_id!r}" + (f" (group {args.group!r})" if args.group else "")


def group_flag(args: argparse.Namespace) -> str:
    return f" --group {args.group}" if args.group else ""


def check_group(args: argparse.Namespace, found: list[str | None], where: str) -> None:
    """:class:`SpecError` (exit 2) unless ``--group`` names one of the DAG's selections ``found`` (None
    for the whole DAG, else group ids). Nothing found: the caller says there is no such DAG or run."""
    from mop_airflow.errors import SpecError  # noqa: PLC0415

    groups = sorted(g for g in found if g is not None)
    if not found or args.group in found:
        return
    if args.group is None:
        plural = "s" if len(groups) > 1 else ""
        raise SpecError("--group", None, f"DAG {args.dag_id!r} holds its model selection{plural} in the task "
                        f"group{plural} {', '.join(groups)} ({where}), not in the DAG as a whole",
                        f"name the group: --group {groups[0]}")
    if not groups:
        raise SpecError("--group", args.group, f"DAG {args.dag_id!r} is a whole MOP DAG (build_mop_dag; {where}): "
                        "it has no task groups", "leave --group out")
    raise SpecError("--group", args.group, f"is not a model selection group of DAG {args.dag_id!r} ({where}); "
                    f"its groups: {', '.join(groups)}", f"name one of them: --group {groups[0]}")


def _stored_check(args: argparse.Namespace, store) -> None:
    from mop_airflow.results.runs import stored_selections  # noqa: PLC0415

    check_group(args, stored_selections(store, args.dag_id), f"runs in the store {store.root}")


def _airflow_check(args: argparse.Namespace, client) -> None:
    from mop_airflow.monitor.run_status import dag_selections  # noqa: PLC0415
    from mop_airflow.errors import AirflowApiError  # noqa: PLC0415

    found = dag_selections(client, args.dag_id)
    if not found:
        raise AirflowApiError(f"DAG {args.dag_id} has no preflight task (nor a <group>.preflight one) in Airflow at "
                              f"{client.base_url}: it is not a mop_airflow DAG and has no model selection runs. "
                              "Fix: check the DAG id", status=404)
    check_group(args, found, f"its tasks in Airflow at {client.base_url}")


def _default_store_root(args: argparse.Namespace) -> str:
    """Where runs write when their spec names no store: ``<home>/store``, as `mop-airflow up` sets it up."""
    return str(Path(args.home).absolute() / "store")


def _airflow_orstore_of(args: argparse.Namespace, online, offline, *, what: str = "the run") -> int:
    """``online(api)`` with Airflow's answers, or ``offline(store)`` from the files alone: with ``--store``
    (Airflow not asked), or when Airflow cannot be reached and the default store has the run.
    ``offline=None``: Airflow is needed (following a run needs its state as it changes)."""
    from mop_airflow.errors import AirflowApiError, SpecError, StoreError  # noqa: PLC0415
    from mop_airflow.results.runs import find_stored_run, open_store  # noqa: PLC0415

    try:
        if args.store and offline is not None:
            store = open_store(args.store)
            _stored_check(args, store)
            return offline(store)
        with api(args) as client:
            try:
                _airflow_check(args, client)
                return online(client)
            except AirflowApiError as exc:
                if exc.status is not None or offline is None:  # Airflow answered (no such run, no access)
                    raise
                unreachable = exc
        store = open_store(_default_store_root(args))
        _stored_check(args, store)
        try:
            find_stored_run(store, selection_of(args), getattr(args, "run_id", None))
        except StoreError:
            run = f"run {args.run_id!r}" if getattr(args, "run_id", None) else "run"
            return fail(f"{unreachable}; and the default store {store.root} has no {run} of {named(args)} "
                        "to read instead. Fix: start Airflow (`mop-airflow up`), point --api-url at it, or pass "
                        "--store ROOT (the store the DAG's spec names)", UNAVAILABLE)
        print(f"mop-airflow: Airflow not reachable at {client.base_url}; read {what} from the store at {store.root}",
              file=sys.stderr)
        return offline(store)
    except SpecError as exc:
        return fail(str(exc), USAGE)
    except (AirflowApiError, StoreError) as exc:
        hint = ("; following a run needs Airflow. Fix: start it, or add --once to read the run from the store"
                if offline is None and getattr(exc, "status", 0) is None else "")
        return fail(f"{exc}{hint}", UNAVAILABLE)


# ---------------------------------------------------------------- status, report, runs
def cmd_status(args: argparse.Namespace) -> int:
    from mop_airflow.monitor.run_status import failed_tasks  # noqa: PLC0415
    from mop_airflow.monitor.watch import watch  # noqa: PLC0415

    def online(client) -> int:
        ref = watch(client, args.dag_id, args.run_id, group=args.group, follow=not args.once,
                    interval=args.interval, store_root=args.store)
        if ref.state == "failed":
            names = [f"{ti['task_id']}" + (f" [{ti['rendered_map_index']}]" if ti.get("rendered_map_index") else "")
                     for ti in failed_tasks(client, ref)]
            print(f"run {ref.run_id} failed; failed tasks: {', '.join(names) or 'none recorded'} "
                  "(their logs are in the Airflow UI)")
            return FAILED
        return OK

    def offline(store) -> int:
        from mop_airflow.results.progress import run_progress  # noqa: PLC0415
        from mop_airflow.results.runs import find_stored_run  # noqa: PLC0415

        run = find_stored_run(store, selection_of(args), args.run_id)
        progress = run_progress(run.layout, run.record.metric, run.record.direction)
        # no time left: the store cannot tell a run still training from a stopped one
        print(f"{run.state_line}: "
              + ("no hop plan yet (the data was being validated and sharded)" if progress is None
               else progress.summary_line(eta=False)))
        return OK

    return _airflow_orstore_of(args, online, offline if args.once else None)


def cmd_report(args: argparse.Namespace) -> int:
    from mop_airflow.monitor.run_status import find_run  # noqa: PLC0415
    from mop_airflow.results.runs import find_stored_run  # noqa: PLC0415

    def online(client) -> int:
        ref = find_run(client, args.dag_id, args.run_id, group=args.group)
        return _write_report(args, ref.layout(), ref.run_id, ref.state, failed=ref.state == "failed")

    def offline(store) -> int:
        run = find_stored_run(store, selection_of(args), args.run_id)
        return _write_report(args, run.layout, run.run_id, run.state_line, failed=False)

    return _airflow_orstore_of(args, online, offline)


def _write_report(args: argparse.Namespace, layout, run_id: str, state: str, *, failed: bool) -> int:
    from mop_airflow.errors import StoreError  # noqa: PLC0415
    from mop_airflow.results.console import challenge_decision, fetch_report, print_challenge, print_leaderboard  # noqa: PLC0415

    selection = selection_of(args)
    if layout is None or not layout.store.exists(layout.plan_uri):
        return fail(f"run {run_id} of {selection} ({state}) has not planned its hops yet: nothing "
                    "to report", FAILED if failed else UNAVAILABLE)
    out = Path(args.out or Path(args.home) / "reports" / selection / run_id.replace(":", "_"))
    board, files = fetch_report(layout, out)
    print(f"{selection} / {run_id}: {state}")
    print_leaderboard(board)
    try:
        print_challenge(challenge_decision(layout))
    except StoreError as exc:  # the leaderboard is what was asked for: a missing decision only warns
        print(f"(champion decision not read: {exc})", file=sys.stderr)
    print(f"\nwritten to {out}{os.sep}: " + ", ".join(f.name for f in files))
    return OK


def cmd_runs(args: argparse.Namespace) -> int:
    from mop_airflow.results.runs import stored_runs  # noqa: PLC0415

    selection = selection_of(args)

    def online(client) -> int:
        from mop_airflow.monitor.run_status import find_run  # noqa: PLC0415
        from mop_airflow.results.runs import read_stored_run  # noqa: PLC0415

        rows = []
        for run in client.get(f"/dags/{args.dag_id}/dagRuns", order_by="-run_after", limit=args.limit)["dag_runs"]:
            ref = find_run(client, args.dag_id, run["dag_run_id"], group=args.group)
            layout = ref.layout()
            stored = read_stored_run(layout) if layout and layout.store.exists(layout.run_record_uri) else None
            rows.append((ref.run_id, ref.state, stored.winner if stored else None))
        return _print_runs(f"Runs of {selection} (Airflow at {client.base_url})", rows)

    def offline(store) -> int:
        runs = stored_runs(store, selection)[:args.limit]
        if not runs:
            return fail(f"no run of {named(args)} in the store {store.root}. Fix: check the DAG id, --group and "
                        "--store (the store root the DAG's spec names)", UNAVAILABLE)
        from mop_airflow.results.runs import UNFINISHED, UNFINISHED_NOTE  # noqa: PLC0415

        footer = f"\n{UNFINISHED}: {UNFINISHED_NOTE}" if any(r.state == UNFINISHED for r in runs) else ""
        return _print_runs(f"Runs of {selection} (the store at {store.root}; Airflow not asked)",
                           [(r.run_id, r.state, r.winner) for r in runs], footer)

    return _airflow_orstore_of(args, online, offline, what="the runs")


def _print_runs(title: str, rows, footer: str = "") -> int:
    """One line per run, newest first: id, state, the report's winner and its metric."""
    if not rows:
        print(f"{title}: no runs yet")
        return OK
    table = [("run_id", "state", "winner", "metric")] + [
        (run_id, state, winner[0] if winner else "-",
         f"{winner[1]}={winner[2]:.4f}" if winner and isinstance(winner[2], (int, float)) else "-")
        for run_id, state, winner in rows]
    widths = [max(len(row[c]) for row in table) for c in range(3)]
    print(f"{title}, newest first")
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    if footer:
        print(footer)
    return OK


# ---------------------------------------------------------------- predict, export-best
def run_layout_of(args: argparse.Namespace):
    """The run's folder (without a RUN_ID argument, the selection's latest run): under ``--store``
    without asking Airflow, else where the run recorded it."""
    from mop_airflow.errors import StoreError  # noqa: PLC0415

    run_id = getattr(args, "run_id", None)
    if args.store:
        from mop_airflow.results.runs import open_store, run_layout  # noqa: PLC0415

        _stored_check(args, open_store(args.store))
        return run_layout(args.store, selection_of(args), run_id)
    from mop_airflow.monitor.run_status import find_run  # noqa: PLC0415

    with api(args) as client:
        _airflow_check(args, client)
        ref = find_run(client, args.dag_id, run_id, group=args.group)
    layout = ref.layout()
    if layout is None:
        raise StoreError(f"run {ref.run_id} of {ref.selection_id} ({ref.state}) has not recorded its store yet: "
                         "no model to use")
    return layout


def store_of(args: argparse.Namespace):
    """The store of the selection's runs: ``--store``, else the one its latest run recorded (asked of Airflow)."""
    if args.store:
        from mop_airflow.results.runs import open_store  # noqa: PLC0415

        store = open_store(args.store)
        _stored_check(args, store)
        return store
    return run_layout_of(args).store


# ---------------------------------------------------------------- the parser
def connection_options(cmd: argparse.ArgumentParser, home: str) -> None:
    """How a command finds a selection's runs: Airflow's address and login, or a store alone."""
    cmd.add_argument("--api-url", help="Airflow's address (default: $MOP_API_URL, else the one "
                                       f"`mop-airflow up` runs, else http://localhost:{DEFAULT_PORT})")
    cmd.add_argument("--username", default=env("MOP_API_USER"),
                     help="an Airflow user who may read the DAG (default $MOP_API_USER; the password "
                          "comes from $MOP_API_PASSWORD)")
    cmd.add_argument("--store", help="read the runs from this store root (a path or a URI) alone, without "
                                     "asking Airflow (the store the DAG's spec names, seen from this computer)")
    cmd.add_argument("--group", metavar="ID",
                     help="the model selection of the DAG's MopTaskGroup ID (its runs, registry and Asset are "
                          "<dag_id>.<ID>); needed when the DAG holds its selections in task groups")
    cmd.add_argument("--home", default=home, help=argparse.SUPPRESS)


def run_options(cmd: argparse.ArgumentParser, home: str) -> None:
    """DAG_ID [RUN_ID] and the connection options."""
    cmd.add_argument("dag_id", help="the DAG's id")
    cmd.add_argument("run_id", nargs="?", help="the run's id (default: the DAG's latest run)")
    connection_options(cmd, home)


def add_commands(sub: argparse._SubParsersAction, home: str) -> None:
    status = sub.add_parser("status", help="follow a run: hops done, shards busy or idle, best so far, time left "
                                           "(or the task waiting for a worker, and since when)",
                            description="Follow a run through Airflow. With --once it prints one line and exits; "
                                        "then --store (or Airflow unreachable and the run in the default store) "
                                        "reads it from the store alone, where a run is finished (report written) "
                                        "or unfinished.")
    run_options(status, home)
    status.add_argument("--once", action="store_true", help="print the progress once and exit")
    status.add_argument("--interval", type=float, default=3.0, help="seconds between updates (default 3)")
    status.set_defaults(func=cmd_status)

    report = sub.add_parser(
        "report", help="print a run's leaderboard and write its report and plots to a folder",
        description="Print the run's leaderboard (rank, configuration, metric, outcome, hyperparameters) and write "
                    "its report files and plots (learning curves, hop timeline, metrics, leaderboard) to a folder. "
                    "A run still going gets a provisional report of the hops so far. With --store (or Airflow "
                    "unreachable and the run in the default store) the store alone is read; without RUN_ID, the "
                    "DAG's newest run.")
    run_options(report, home)
    report.add_argument("--out", help="where to write (default <home>/reports/DAG_ID/RUN_ID, under "
                                      "$MOP_HOME or ~/mop_airflow)")
    report.set_defaults(func=cmd_report)

    runs = sub.add_parser("runs", help="a DAG's runs, newest first, with their state, winner and metric",
                          description="Asks Airflow for the runs and their state, and the store for each run's "
                                      "winner. With --store (or Airflow unreachable and runs in the default store) "
                                      "the store alone: a run is finished (report written) or unfinished.")
    runs.add_argument("dag_id", help="the DAG's id")
    connection_options(runs, home)
    runs.add_argument("--limit", type=int, default=20, help="at most this many runs (default 20)")
    runs.set_defaults(func=cmd_runs)
