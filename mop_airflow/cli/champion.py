"""`mop-airflow champion list` and `champion publish`: a DAG's champion registry, and a rollback to an
earlier model with the champion Asset event through Airflow's REST API."""

from __future__ import annotations

import argparse

from mop_airflow.cli import runs
from mop_airflow.cli.runs import OK, UNAVAILABLE, USAGE, connection_options, fail


def add_commands(sub: argparse._SubParsersAction, home: str) -> None:
    champion = sub.add_parser(
        "champion", help="a DAG's champion registry: list it, or roll back to an earlier model",
        description="Every model a DAG published, newest last; the last is the champion that "
                    "`predict --champion` and the DAGs scheduled on its Asset use. The registry is found in "
                    "--store, else in the store the DAG's latest run recorded (asked of Airflow)."
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = champion.add_parser("list", help="print the registry's history, marking the current champion")
    listing.add_argument("dag_id", help="the DAG's id")
    connection_options(listing, home)
    listing.set_defaults(func=cmd_champion_list)
    again = champion.add_parser(
        "publish", help="make an earlier entry (or a reported run's winner) the champion again",
        description="Append a registry entry naming the chosen model (a rollback keeps the history), then emit "
                    "the champion Asset event through Airflow's REST API so DAGs scheduled on it run.")
    again.add_argument("dag_id", help="the DAG's id")
    again.add_argument("which", metavar="VERSION_OR_RUN_ID",
                       help="a version number from `champion list`, or the id of a run whose report finished")
    again.add_argument("--no-event", action="store_true", help="only update the registry; tell no DAG")
    connection_options(again, home)
    again.set_defaults(func=cmd_champion_publish)


def _champion_command(args: argparse.Namespace, work) -> int:
    """Run ``work(store)`` on the selection's store with the exit codes of the module docstring."""
    from mop_airflow.errors import AirflowApiError, SpecError, StoreError  # noqa: PLC0415

    try:
        return work(runs.store_of(args))
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

    selection = runs.selection_of(args)

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

    uri = champion_asset_uri(runs.selection_of(args))
    again = (f"`mop-airflow champion publish {args.dag_id} {entry['version']}{runs.group_flag(args)}` (safe: the "
             "champion is not appended again, only the event is emitted), or "
             f"create the event on the Asset {uri} in the Airflow UI")
    with runs.api(args) as client:
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

    selection = runs.selection_of(args)

    def work(store) -> int:
        entry = republish(store, selection, args.which)
        print(f"{selection}: champion is now {_entry_line(entry)}\nmodel: {entry['model_uri']}")
        if args.no_event:
            print("no Asset event emitted (--no-event): DAGs scheduled on the champion Asset were not told")
            return OK
        return _emit_champion_event(args, entry)

    return _champion_command(args, work)
