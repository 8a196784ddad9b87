"""The results page's FastAPI app, mounted by the API server under ``/mop``.

Airflow does not authenticate plugin apps, so every route here does, with Airflow's own
dependencies: the user comes from the JWT in the ``Authorization: Bearer`` header or the
``_token`` cookie (what the UI's iframe sends), resolved by the configured auth manager; a run's
routes also need read access to that DAG's runs (``requires_access_dag``). No token: 401; a token
without the right: 403.

Where a run's files are is what its ``preflight`` task resolved (the run record, XCom
``return_value``): the API server reads that from the metadata database and never parses DAG
files. A DAG run holds one model selection per preflight task (:mod:`mop_airflow.records.selection`): the
whole DAG's (``preflight``), or each MopTaskGroup's (``<group>.preflight``); ``?group=ID`` picks
one, and without it a run of groups shows its first. Reading and shaping the data is
:mod:`mop_airflow.results.page`; this module only finds the run.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, status
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from sqlalchemy import and_, exists, or_, select

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel

from mop_airflow.errors import MopError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import RunRecord
from mop_airflow.planning.run_chain import continuation_of
from mop_airflow.results.page import (
    DOWNLOADS,
    NotARunFolder,
    check_folder,
    check_ids,
    download_uri,
    read_chunks,
    run_results,
)
from mop_airflow.records.selection import SEPARATOR, group_of, selection_id, selections_of, task_id_in, whole_first
from mop_airflow.hooks.connections import open_spec_store

PREFLIGHT, PREFLIGHT_OPERATOR = "preflight", "MopPreflightOperator"
STATIC = {"results.js": "text/javascript", "results.css": "text/css"}
PAGE_SECONDS = 5.0  # the page waits at most this long for a store that does not answer

can_read_runs = Depends(requires_access_dag("GET", DagAccessEntity.RUN))


def create_app() -> FastAPI:
    app = FastAPI(title="mop_airflow results", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse, dependencies=[can_read_runs])
    def runs_page() -> HTMLResponse:
        return HTMLResponse(_page("runs.html", {}))

    @app.get("/api/runs", dependencies=[can_read_runs])
    def list_runs(user: GetUserDep, session: SessionDep, limit: int = 200) -> dict[str, Any]:
        """Runs of mop_airflow DAGs (their first task is a preflight) whose DAG the user may read."""
        from airflow.api_fastapi.app import get_auth_manager  # noqa: PLC0415

        readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
        mop_run = exists().where(TaskInstance.dag_id == DagRun.dag_id, TaskInstance.run_id == DagRun.run_id,
                                 _is_preflight())
        query = (select(DagRun).where(mop_run, DagRun.dag_id.in_(readable))
                 .order_by(DagRun.run_after.desc()).limit(max(1, min(limit, 1000))))
        runs = session.scalars(query).all()
        return {"runs": [{**_run_state(run), "groups": groups} for run, groups in zip(runs, _groups(session, runs))]}

    @app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[can_read_runs])
    def run_page(dag_id: str, run_id: str, group: str | None = None) -> HTMLResponse:
        _checked(dag_id, run_id)
        return HTMLResponse(_page("run.html", {"dag_id": dag_id, "run_id": run_id, "group": group}))

    @app.get("/api/runs/{dag_id}/{run_id}", dependencies=[can_read_runs])
    def run_data(dag_id: str, run_id: str, session: SessionDep, group: str | None = None) -> dict[str, Any]:
        dag_run, preflights = _find_run(session, dag_id, run_id)
        group, preflight = _selection(preflights, dag_id, run_id, group)
        head = {**_run_state(dag_run), "preflight_state": _state(preflight.state), "group": group,
                "groups": [g for g in preflights if g is not None], "selection_id": selection_id(dag_id, group)}
        record = _run_record(session, dag_run, group)
        if record is None:
            waiting = "failed" if head["preflight_state"] in ("failed", "upstream_failed") else "waiting"
            return {**head, "stage": waiting, "message": (
                "preflight failed, so the run was never resolved: see the preflight task's log" if waiting == "failed"
                else f"preflight has not finished yet (its state: {head['preflight_state'] or 'none'}); "
                     "the plan shows once it has resolved the run")}
        head["waiting"] = (queued_without_worker(session, dag_id, run_id, group) if head["run_state"] == "running"
                           else [])
        try:
            return {**run_results(_layout(record), record), **head}
        except NotARunFolder as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
        except (MopError, OSError) as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"the run's store is not readable: {exc}") from exc

    @app.get("/api/runs/{dag_id}/{run_id}/files/{name}", dependencies=[can_read_runs])
    def download(dag_id: str, run_id: str, name: str, session: SessionDep,
                 group: str | None = None) -> StreamingResponse:
        if name not in DOWNLOADS:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"{name!r} is not a report file that can be downloaded")
        dag_run, preflights = _find_run(session, dag_id, run_id)
        group, _ = _selection(preflights, dag_id, run_id, group)
        record = _run_record(session, dag_run, group)
        if record is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "the run has not been resolved")
        layout = _layout(record)
        try:
            check_folder(layout, record)
        except NotARunFolder as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
        if not layout.store.exists(download_uri(layout, name)):
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"{name} has not been written yet")
        return StreamingResponse(read_chunks(layout, name), media_type=DOWNLOADS[name],
                                 headers={"Content-Disposition": f'attachment; filename="{name}"'})

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:
            raise HTTPException(status.HTTP_404_NOT_FOUND)
        return Response(_asset(name), media_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    return app


def queued_without_worker(session: Any, dag_id: str, run_id: str, group: str | None,
                          now: float | None = None) -> list[dict[str, Any]]:
    """The selection's tasks queued longer than a hand-off takes, with no worker starting them (a lost
    worker, none serving the queue): each with its queue, since when, and the line ``mop-airflow status``
    prints (:func:`mop_airflow.monitor.run_status.waiting_of`)."""
    import time  # noqa: PLC0415

    from mop_airflow.monitor.run_status import RunRef, waiting_of  # noqa: PLC0415

    rows = session.execute(select(TaskInstance.task_id, TaskInstance.queue, TaskInstance.queued_dttm).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.state == "queued")).all()
    listed = [{"task_id": task_id, "state": "queued", "queue": queue, "queued_when": when.isoformat()}
              for task_id, queue, when in rows if when is not None]
    now = time.time() if now is None else now
    return [{"task_id": w.task_id, "queue": w.queue, "since": w.since, "line": w.line(now)}
            for w in waiting_of(listed, RunRef(dag_id, run_id, "running", None, group), now)]


def _checked(dag_id: str, run_id: str) -> None:
    try:
        check_ids(dag_id, run_id)
    except NotARunFolder as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc


def _is_preflight() -> Any:
    """A selection's preflight task instance: ``preflight`` or ``<group>.preflight``, of our operator."""
    return and_(or_(TaskInstance.task_id == PREFLIGHT, TaskInstance.task_id.like(f"%{SEPARATOR}{PREFLIGHT}")),
                TaskInstance.operator == PREFLIGHT_OPERATOR, TaskInstance.map_index == -1)


def _groups(session: Any, runs: list[DagRun]) -> list[list[str]]:
    """Per DAG run, the MopTaskGroups it holds (empty for a whole MOP DAG's run), in one query."""
    found: dict[tuple[str, str], list[str]] = {}
    if runs:
        rows = session.execute(select(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id).where(
            _is_preflight(), TaskInstance.dag_id.in_({r.dag_id for r in runs}),
            TaskInstance.run_id.in_({r.run_id for r in runs})))
        for dag_id, run_id, task_id in rows:
            found.setdefault((dag_id, run_id), []).append(task_id)
    return [[g for g in selections_of(found.get((r.dag_id, r.run_id), [])) if g is not None] for r in runs]


def _find_run(session: Any, dag_id: str, run_id: str) -> tuple[DagRun, dict[str | None, TaskInstance]]:
    """The DAG run and its selections' preflight task instances (None: the whole DAG's, else by group id);
    404 unless the run exists and it is a mop_airflow run."""
    _checked(dag_id, run_id)
    dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if dag_run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run_id!r} of DAG {dag_id!r}")
    preflights = session.scalars(select(TaskInstance).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, _is_preflight())).all()
    by_group = {group_of(ti.task_id, PREFLIGHT): ti for ti in preflights}
    if not by_group:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{dag_id} is not a mop_airflow DAG: its runs have no results")
    return dag_run, {group: by_group[group] for group in whole_first(by_group)}


def _selection(preflights: dict[str | None, TaskInstance], dag_id: str, run_id: str,
               group: str | None) -> tuple[str | None, TaskInstance]:
    """The selection ``?group=`` names; without it the whole DAG's, or in a run of groups the first."""
    if not group:
        group = next(iter(preflights))
    if group not in preflights:
        groups = [g for g in preflights if g is not None]
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"run {run_id!r} of DAG {dag_id!r} has no MopTaskGroup "
                            f"{group!r}: " + (f"its groups are {', '.join(groups)}" if groups else
                                              "it is a whole MOP DAG's run (leave group out)"))
    return group, preflights[group]


def _run_record(session: Any, dag_run: DagRun, group: str | None) -> RunRecord | None:
    """The selection's run as its preflight resolved it (XCom ``return_value``), or None before that.
    A run continuing a search split over DAG runs returns the search's record: its first run's."""
    dag_id, run_id = dag_run.dag_id, dag_run.run_id
    row = session.scalars(XComModel.get_many(run_id=run_id, key="return_value", task_ids=task_id_in(group, PREFLIGHT),
                                             dag_ids=dag_id, map_indexes=-1, limit=1)).first()
    value = None if row is None else XComModel.deserialize_value(row)
    try:
        continuing = continuation_of(dag_run.conf) if group is None else None
    except MopError:  # a conf written by hand that its preflight refused: the run was never resolved
        return None
    if (not isinstance(value, dict) or value.get("dag_id") != selection_id(dag_id, group)
            or value.get("run_id") != (continuing.first_run if continuing else run_id)):
        return None
    return RunRecord.from_dict(value)


def _layout(record: RunRecord) -> RunLayout:
    """The search's folder, named by its selection id and run (the record's: checked by :func:`_run_record`)."""
    spec = record.store
    store = open_spec_store(spec, retry_seconds=min(spec.retry_seconds, PAGE_SECONDS))
    return RunLayout(store, record.dag_id, record.run_id)


def _run_state(run: DagRun) -> dict[str, Any]:
    def iso(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {"dag_id": run.dag_id, "run_id": run.run_id, "run_state": _state(run.state),
            "start_date": iso(run.start_date), "end_date": iso(run.end_date), "run_after": iso(run.run_after)}


def _state(value: Any) -> str | None:
    return None if value is None else str(getattr(value, "value", value))


def _asset(name: str) -> str:
    return resources.files("mop_airflow.plugins").joinpath("static", name).read_text(encoding="utf-8")


def _page(name: str, context: dict[str, Any]) -> str:
    """An HTML page with ``context`` as JSON for its script (``<`` escaped, so no id can close the tag)."""
    data = json.dumps(context).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return _asset(name).replace("{{CONTEXT}}", data)
