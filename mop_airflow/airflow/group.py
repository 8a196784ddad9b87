"""A model selection placed inside any DAG: ``extract >> MopTaskGroup(spec) >> deploy``.

The group holds the very tasks a MOP DAG has (:mod:`mop_airflow.airflow.render`), their ids prefixed
by the group's, and a last ``result`` task whose return value, ``selection.output``, is the run's
summary (best configuration, metric and value, the best model's and leaderboard's URIs, the run
folder, the champion decision). Everything a run of the group keeps (run folders, shards,
champion registry, Asset) is named by its selection id ``<dag_id>.<group_id>``
(:mod:`mop_airflow.records.selection`), so several groups in one DAG never collide; they may share the
shard pools, which are the shards' GPUs.

``data.source`` and ``data.validation`` may come from upstream: a Jinja template rendered when
the run starts (``"{{ ti.xcom_pull(task_ids='extract') }}"``) or the XComArg of a task
(``extract()``, ``extract_task.output``). The group's shape never depends on them.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

from airflow.sdk import Param, TaskGroup
from airflow.sdk.exceptions import DuplicateTaskIdFound

from mop_airflow.airflow.render import RETRIES, champion_asset, render_selection
from mop_airflow.errors import SpecError
from mop_airflow.operators.preflight import TEMPLATED_DATA
from mop_airflow.planning.schedule import DEFAULT_PRIORITY
from mop_airflow.records.selection import selection_id, task_id_in
from mop_airflow.config import MopSpec
from mop_airflow.planning.shape import dag_shape
from mop_airflow.planning.task_plan import plan_tasks
from mop_airflow.config.form import form_fields


class MopTaskGroup(TaskGroup):
    """Model selection with model hopper parallelism as a task group of the current DAG.

    Takes what :func:`~mop_airflow.airflow.dag.build_mop_dag` takes where it makes sense for a group:
    ``pools``, ``builder_modules``, ``priority``, ``kubernetes`` and ``default_args`` (merged over the DAG's; tasks
    retry twice by default unless the DAG or ``default_args`` say otherwise); ``store`` replaces the
    spec's store section. Other keyword arguments go to Airflow's ``TaskGroup`` (``tooltip``,
    ``group_display_name``, ...). The trigger form gets the group's fields in sections named after
    it, their conf keys ``<group_id>.<field>`` (or a ``<group_id>: {...}`` object).
    """

    def __init__(self, spec: MopSpec | Mapping[str, Any], group_id: str = "model_selection", *,
                 pools: str = "create", builder_modules: Sequence[str] | None = None,
                 default_args: Mapping[str, Any] | None = None, priority: str = DEFAULT_PRIORITY,
                 store: Mapping[str, Any] | None = None, kubernetes: Any = None, dag: Any = None,
                 **group_kwargs: Any) -> None:
        dag = dag or _current_dag()
        if dag is None:
            raise SpecError("MopTaskGroup", group_id, "is created outside a DAG",
                            "create it inside `with DAG(...):` or a @dag-decorated function")
        if not isinstance(group_id, str) or not group_id.replace("_", "a").replace("-", "a").isalnum():
            raise SpecError("MopTaskGroup.group_id", group_id, "must be letters, digits, '_' or '-'",
                            "e.g. group_id='model_selection'")
        raw, upstream = _with_upstream_data(spec, store)
        parsed = MopSpec.from_dict(raw)
        # The DAG's own default_args win over the group's retry default; the group's argument over both.
        defaults = {**{k: v for k, v in RETRIES.items() if k not in (dag.default_args or {})}, **(default_args or {})}
        try:
            super().__init__(group_id=group_id, dag=dag, default_args=defaults,
                             tooltip=group_kwargs.pop("tooltip", f"Model selection ({parsed.search.space.method} "
                                                      f"search, {parsed.schedule.shards} shards) with model hopper "
                                                      "parallelism"), **group_kwargs)
        except DuplicateTaskIdFound as exc:  # Airflow's own check: another task or task group has the id
            raise SpecError("MopTaskGroup.group_id", group_id, f"is already used in DAG {dag.dag_id!r} ({exc})",
                            "give each MopTaskGroup its own group_id, e.g. 'selection_b'") from exc
        # inside another task group, Airflow prefixes the id with the parents': the selection is named by it all
        full = self.group_id
        self.selection_id = selection_id(dag.dag_id, full)
        self.spec = parsed
        for name, param in group_params(parsed, full).items():
            dag.params[name] = param
        with self:
            shape = dag_shape(parsed, priority, result=True)
            ops = render_selection(parsed, plan_tasks(shape), dag=dag, group=full, pools=pools, kubernetes=kubernetes,
                                   builder_modules=shape.builder_modules if builder_modules is None else builder_modules)
        for task in upstream:  # the tasks data.source / data.validation pull from run first
            task >> ops["preflight"]
        self.output = ops["result"].output
        self.champion_asset = champion_asset(self.selection_id) if parsed.publish.enabled else None


def group_params(spec: MopSpec, group_id: str) -> dict[str, Param]:
    """The trigger form's fields for a group: keys ``<group_id>.<field>``, in sections named after the group."""
    params = {}
    for field in form_fields(spec).values():
        schema = copy.deepcopy(dict(field.schema))
        schema["section"] = f"{group_id}: {schema.get('section') or 'Model selection'}"
        params[task_id_in(group_id, field.name)] = Param(copy.deepcopy(field.default), **schema)
    return params


def _current_dag() -> Any:
    from airflow.sdk.definitions._internal.contextmanager import DagContext  # noqa: PLC0415

    return DagContext.get_current()


def _with_upstream_data(spec: MopSpec | Mapping[str, Any], store: Mapping[str, Any] | None) -> tuple[dict, list]:
    """The spec as a dict whose XComArg data fields are templates pulling the same XCom, and the
    tasks they pull from (the preflight task runs after them)."""
    raw = spec.to_dict() if isinstance(spec, MopSpec) else _plain(spec)
    if store is not None:
        raw["store"] = dict(store)
    upstream = []
    for key in TEMPLATED_DATA:
        value = (raw.get("data") or {}).get(key)
        operator = getattr(value, "operator", None)
        if operator is None:
            continue
        upstream.append(operator)
        raw["data"][key] = ("{{ ti.xcom_pull(task_ids=%r, key=%r) }}"
                            % (operator.task_id, getattr(value, "key", "return_value")))
    return raw, upstream


def _plain(spec: Mapping[str, Any]) -> dict:
    """``spec`` with XComArgs kept as they are (deepcopy would copy the operators they point at)."""
    data = dict(spec.get("data") or {})
    kept = {key: data[key] for key in TEMPLATED_DATA if getattr(data.get(key), "operator", None) is not None}
    rest = copy.deepcopy({**spec, "data": {k: v for k, v in data.items() if k not in kept}})
    rest["data"].update(kept)
    return rest
