"""The `mop-airflow` commands that read runs: `status`, `report`, `runs`, `predict`, `export-best` and
`champion list / publish`, and the exit codes every command shares.

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

OK, FAILED, USAGE, UNAVAILABLE, INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_PORT = 8080


def fail(message: str, code: int) -> int:
    print(f"mop-airflow: {message}", file=sys.stderr)
    return code


def api(args: argparse.Namespace):
    from mop_airflow.hooks.rest import AirflowAPI  # noqa: PLC0415

    url = args.api_url or os.environ.get("MOP_AIRFLOW_API_URL")
    if not url:  # the Airflow `mop-airflow up` started from this folder, else Airflow's default port
        marker = Path(args.home) / "airflow" / "api_url"
        url = marker.read_text().strip() if marker.exists() else f"http://localhost:{DEFAULT_PORT}"
    return AirflowAPI(url, args.username, os.environ.get("MOP_AIRFLOW_API_PASSWORD"))


# ---------------------------------------------------------------- which selection
def _selection(args: argparse.Namespace) -> str:
    """What names the runs' folders, registry and Asset: the DAG id, or ``<dag_id>.<group>``."""
    from mop_airflow.records.selection import selection_id  # noqa: PLC0415

    return selection_id(args.dag_id, args.group)


def _named(args: argparse.Namespace) -> str:
    """The selection for a person: ``DAG 'etl'``, or ``DAG 'etl' (group 'model_selection')``."""
    return f"DAG {args.dag_id!r}" + (f" (group {args.group!r})" if args.group else "")


def _group_flag(args: argparse.Namespace) -> str:
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
    from mop_airflow.airflow.run_status import dag_selections  # noqa: PLC0415
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


def _airflow_or_store(args: argparse.Namespace, online, offline, *, what: str = "the run") -> int:
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
            find_stored_run(store, _selection(args), getattr(args, "run_id", None))
        except StoreError:
            run = f"run {args.run_id!r}" if getattr(args, "run_id", None) else "run"
            return fail(f"{unreachable}; and the default store {store.root} has no {run} of {_named(args)} "
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
    from mop_airflow.airflow.run_status import failed_tasks  # noqa: PLC0415
    from mop_airflow.airflow.watch import watch  # noqa: PLC0415

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

        run = find_stored_run(store, _selection(args), args.run_id)
        progress = run_progress(run.layout, run.record.metric, run.record.direction)
        # no time left: the store cannot tell a run still training from a stopped one
        print(f"{run.state_line}: "
              + ("no hop plan yet (the data was being validated and sharded)" if progress is None
               else progress.summary_line(eta=False)))
        return OK

    return _airflow_or_store(args, online, offline if args.once else None)


def cmd_report(args: argparse.Namespace) -> int:
    from mop_airflow.airflow.run_status import find_run  # noqa: PLC0415
    from mop_airflow.results.runs import find_stored_run  # noqa: PLC0415

    def online(client) -> int:
        ref = find_run(client, args.dag_id, args.run_id, group=args.group)
        return _write_report(args, ref.layout(), ref.run_id, ref.state, failed=ref.state == "failed")

    def offline(store) -> int:
        run = find_stored_run(store, _selection(args), args.run_id)
        return _write_report(args, run.layout, run.run_id, run.state_line, failed=False)

    return _airflow_or_store(args, online, offline)


def _write_report(args: argparse.Namespace, layout, run_id: str, state: str, *, failed: bool) -> int:
    from mop_airflow.errors import StoreError  # noqa: PLC0415
    from mop_airflow.results.console import challenge_decision, fetch_report, print_challenge, print_leaderboard  # noqa: PLC0415

    selection = _selection(args)
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
    print("\nwritten: " + ", ".join(str(f) for f in files))
    return OK


def cmd_runs(args: argparse.Namespace) -> int:
    from mop_airflow.results.runs import stored_runs  # noqa: PLC0415

    selection = _selection(args)

    def online(client) -> int:
        from mop_airflow.airflow.run_status import find_run  # noqa: PLC0415
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
            return fail(f"no run of {_named(args)} in the store {store.root}. Fix: check the DAG id, --group and "
                        "--store (the store root the DAG's spec names)", UNAVAILABLE)
        from mop_airflow.results.runs import UNFINISHED, UNFINISHED_NOTE  # noqa: PLC0415

        footer = f"\n{UNFINISHED}: {UNFINISHED_NOTE}" if any(r.state == UNFINISHED for r in runs) else ""
        return _print_runs(f"Runs of {selection} (the store at {store.root}; Airflow not asked)",
                           [(r.run_id, r.state, r.winner) for r in runs], footer)

    return _airflow_or_store(args, online, offline, what="the runs")


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
def _run_layout(args: argparse.Namespace):
    """The run's folder (without a RUN_ID argument, the selection's latest run): under ``--store``
    without asking Airflow, else where the run recorded it."""
    from mop_airflow.errors import StoreError  # noqa: PLC0415

    run_id = getattr(args, "run_id", None)
    if args.store:
        from mop_airflow.results.runs import open_store, run_layout  # noqa: PLC0415

        _stored_check(args, open_store(args.store))
        return run_layout(args.store, _selection(args), run_id)
    from mop_airflow.airflow.run_status import find_run  # noqa: PLC0415

    with api(args) as client:
        _airflow_check(args, client)
        ref = find_run(client, args.dag_id, run_id, group=args.group)
    layout = ref.layout()
    if layout is None:
        raise StoreError(f"run {ref.run_id} of {ref.selection_id} ({ref.state}) has not recorded its store yet: "
                         "no model to use")
    return layout


def _store(args: argparse.Namespace):
    """The store of the selection's runs: ``--store``, else the one its latest run recorded (asked of Airflow)."""
    if args.store:
        from mop_airflow.results.runs import open_store  # noqa: PLC0415

        store = open_store(args.store)
        _stored_check(args, store)
        return store
    return _run_layout(args).store


def _champion_layout(args: argparse.Namespace):
    """The folder of the run the selection's registry names as its current champion."""
    from mop_airflow.serving.predict import champion_layout  # noqa: PLC0415

    layout, entry = champion_layout(_store(args), _selection(args))
    print(f"champion of {_selection(args)}: version {entry['version']}, {entry['config_id']} of run "
          f"{entry['run_id']} ({entry['metric']}={entry['value']:.6g})")
    return layout


def _model_command(args: argparse.Namespace, work) -> int:
    """Run ``work(layout)`` with the exit codes of the module docstring."""
    from mop_airflow.errors import (AirflowApiError, DataValidationError, SpecError,  # noqa: PLC0415
                                    StoreError, TrainingError)

    if args.champion:
        for name, value in (("RUN_ID", args.run_id), ("--config", getattr(args, "config", None))):
            if value is not None:
                return fail(f"{name}={value!r}: cannot be combined with --champion, which already names the model "
                            "(the run the DAG's registry names as champion, its best model). Fix: pass either "
                            f"--champion or {name}", USAGE)
    try:
        return work(_champion_layout(args) if args.champion else _run_layout(args))
    except (AirflowApiError, StoreError) as exc:
        return fail(str(exc), UNAVAILABLE)
    except (SpecError, DataValidationError) as exc:
        return fail(str(exc), USAGE)
    except TrainingError as exc:
        return fail(str(exc), FAILED)


def cmd_predict(args: argparse.Namespace) -> int:
    from mop_airflow.serving.predict import predict  # noqa: PLC0415

    def work(layout) -> int:
        done = predict(layout, args.source, args.out, mode=args.mode, k=args.k, config_id=args.config,
                       id_column=args.id, batch_rows=args.batch_rows)
        print(f"{done['rows']} row(s) scored ({done['mode']}: {', '.join(done['columns'])}) with configuration "
              f"{done['config_id']} of {layout.dag_id} / {layout.run_id}\nwritten: {done['uri']}")
        return OK

    return _model_command(args, work)


def cmd_export_best(args: argparse.Namespace) -> int:
    from mop_airflow.serving.export import export_for_serving  # noqa: PLC0415

    def work(layout) -> int:
        written = export_for_serving(layout, args.out, fmt=args.format)
        print(f"best model of {layout.dag_id} / {layout.run_id} exported\n"
              + "\n".join(f"written: {uri}" for uri in written.values()))
        return OK

    return _model_command(args, work)


def cmd_export_study(args: argparse.Namespace) -> int:
    from mop_airflow.results.study import export_study  # noqa: PLC0415

    def work(layout) -> int:
        study = export_study(layout, args.out)
        print(f"{len(study.trials)} trial(s) of {layout.dag_id} / {layout.run_id} written to {args.out} as the "
              f"Optuna study {study.study_name!r}\nopen it with: optuna-dashboard sqlite:///{args.out}")
        return OK

    args.champion = False
    return _model_command(args, work)


# ---------------------------------------------------------------- champion list, publish
def _champion_command(args: argparse.Namespace, work) -> int:
    """Run ``work(store)`` on the selection's store with the exit codes of the module docstring."""
    from mop_airflow.errors import AirflowApiError, SpecError, StoreError  # noqa: PLC0415

    try:
        return work(_store(args))
    except (AirflowApiError, StoreError) as exc:
        return fail(str(exc), UNAVAILABLE)
    except SpecError as exc:
        return fail(str(exc), USAGE)


def _entry_line(entry) -> str:
    return (f"version {entry['version']}: {entry['config_id']} of run {entry['run_id']} "
            f"({entry['metric']}={entry['value']:.6g}), published {entry['published_at'][:19].replace('T', ' ')} "
            f"by {entry.get('published_by', 'run')}: {entry.get('reason', '')}")


def cmd_champion_list(args: argparse.Namespace) -> int:
    from mop_airflow.serving.champion import read_registry, registry_uri  # noqa: PLC0415

    selection = _selection(args)

    def work(store) -> int:
        history = read_registry(store, selection)
        if not history:
            print(f"{selection}: no champion published yet ({registry_uri(store, selection)} has no entry)")
            return OK
        rows = [(("*" if i == len(history) - 1 else " "), str(e["version"]),
                 e["published_at"][:19].replace("T", " "), e["run_id"], e["config_id"],
                 f"{e['metric']}={e['value']:.6g}", e.get("published_by", "run"), e.get("reason", ""))
                for i, e in enumerate(history)]
        header = (" ", "version", "published_at (UTC)", "run_id", "config", "metric", "by", "reason")
        widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header) - 1)]
        print(f"Champion registry of {selection} ({registry_uri(store, selection)}), oldest first")
        for row in [header, *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
        champion = history[-1]
        print(f"\n* current champion: {_entry_line(champion)}\n  model: {champion['model_uri']}")
        return OK

    return _champion_command(args, work)


def _emit_champion_event(args: argparse.Namespace, entry) -> int:
    """The champion Asset event through Airflow's REST API, as the selection's publish task emits it."""
    from mop_airflow.serving.champion import asset_extra, champion_asset_uri  # noqa: PLC0415
    from mop_airflow.errors import AirflowApiError  # noqa: PLC0415
    from mop_airflow.records.selection import task_id_in  # noqa: PLC0415

    uri = champion_asset_uri(_selection(args))
    again = (f"`mop-airflow champion publish {args.dag_id} {entry['version']}{_group_flag(args)}` (safe: the "
             "champion is not appended again, only the event is emitted), or "
             f"create the event on the Asset {uri} in the Airflow UI")
    with api(args) as client:
        try:
            asset = next((a for a in client.paged("/assets", "assets", uri_pattern=uri) if a["uri"] == uri), None)
            if asset is None:
                return fail(f"the registry was updated (version {entry['version']} is the champion), but Airflow at "
                            f"{client.base_url} knows no Asset {uri}: no parsed DAG has the publish task "
                            f"{task_id_in(args.group, 'publish')} of DAG {args.dag_id}, so downstream DAGs were not "
                            f"told. Fix: deploy DAG {args.dag_id} with publish enabled (or check --api-url), then "
                            f"run {again}", UNAVAILABLE)
            event = client.call("POST", "/assets/events", json={"asset_id": asset["id"], "extra": asset_extra(entry)})
        except AirflowApiError as exc:
            return fail(f"the registry was updated (version {entry['version']} is the champion), but the Asset "
                        f"event on {uri} was not emitted, so downstream DAGs were not told: {exc}. Fix: start "
                        f"Airflow or pass --api-url (and --username), then run {again}; or pass --no-event to "
                        "update only the registry", UNAVAILABLE)
    print(f"Asset event {event.get('id')} emitted on {uri}: DAGs scheduled on it will run with the new champion")
    return OK


def cmd_champion_publish(args: argparse.Namespace) -> int:
    from mop_airflow.serving.champion import republish  # noqa: PLC0415

    selection = _selection(args)

    def work(store) -> int:
        entry = republish(store, selection, args.which)
        print(f"{selection}: champion is now {_entry_line(entry)}\nmodel: {entry['model_uri']}")
        if args.no_event:
            print("no Asset event emitted (--no-event): DAGs scheduled on the champion Asset were not told")
            return OK
        return _emit_champion_event(args, entry)

    return _champion_command(args, work)
