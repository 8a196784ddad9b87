"""Which model selection a task, a record or a command is about: a whole MOP DAG, or one
:class:`~mop_airflow.airflow.group.MopTaskGroup` inside any DAG.

A selection's id names everything a run of it keeps apart from other selections: its run folders
(``<store>/<selection id>/<run_id>/``), its shards, its champion registry and its champion Asset.
A DAG built by ``build_mop_dag`` is the selection of the DAG's own id (exactly as before groups
existed); a group is ``<dag_id>.<group_id>``, so two groups of one DAG, or a group and a DAG, never
share a folder. Inside a group, every task id is prefixed by the group id, as Airflow does.
Imports no Airflow.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

SEPARATOR = "."


def selection_id(dag_id: str, group_id: str | None = None) -> str:
    """``dag_id`` for a whole MOP DAG, ``<dag_id>.<group_id>`` for a group in it."""
    return f"{dag_id}{SEPARATOR}{group_id}" if group_id else dag_id


def task_id_in(group_id: str | None, task_id: str) -> str:
    """The Airflow task id of a selection's task (``preflight`` -> ``model_selection.preflight``)."""
    return f"{group_id}{SEPARATOR}{task_id}" if group_id else task_id


def group_of(task_id: str, name: str) -> str | None | bool:
    """The group whose task ``name`` (e.g. ``preflight``) ``task_id`` is: None for a whole MOP DAG's own
    task, the group id for a group's, False for any other task."""
    if task_id == name:
        return None
    group, _, last = task_id.rpartition(SEPARATOR)
    return group if last == name and group else False


def conf_of(conf: Any, group_id: str | None) -> Any:
    """The part of a trigger conf (or a run's params) that is a group's: ``<group>.<key>`` entries
    with the prefix taken off, and the entries of a ``<group>: {...}`` object (which win). A whole
    MOP DAG's conf is all of it. Keys of other tasks and groups are not the group's to judge."""
    if not group_id or not isinstance(conf, Mapping):
        return conf
    prefix = group_id + SEPARATOR
    mine = {key[len(prefix):]: value for key, value in conf.items() if isinstance(key, str) and key.startswith(prefix)}
    nested = conf.get(group_id)
    if isinstance(nested, Mapping):
        mine.update(nested)
    return mine


def selections_of(task_ids: Iterable[str]) -> list[str | None]:
    """The selections a DAG (or a DAG run) holds, from its task ids: None for a whole MOP DAG's own
    ``preflight``, each group id for a ``<group>.preflight``; the whole DAG first, then groups by id."""
    return whole_first(g for g in (group_of(task_id, "preflight") for task_id in task_ids) if g is not False)


def whole_first(groups: Iterable[str | None]) -> list[str | None]:
    """Selections once each, in the order they are listed: the whole DAG (None) first, then groups by id."""
    return sorted(set(groups), key=lambda group: (group is not None, group or ""))
