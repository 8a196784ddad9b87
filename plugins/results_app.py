"""The results page's FastAPI app, mounted by the API server under ``/mop``.

Airflow does not authenticate plugin apps, so every route here does, with Airflow's own
dependencies: the user comes from the JWT in the ``Authorization: Bearer`` header or the
``_token`` cookie (what the UI's iframe sends), resolved by the configured auth manager; a run's
routes also need read access to that DAG's runs (``requires_access_dag``). No token: 401; a token
without the right: 403.

Where a run's files are is what its ``preflight`` task resolved (the run record, XCom
``return_value``): the API server reads that from the metadata database and never parses DAG
files. Reading and shaping the data is :mod:`mop_airflow.results`; this module only finds the run.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, status
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from sqlalchemy import and_, select

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel

from mop_airflow.errors import MopError
from mop_airflow.layout import RunLayout
from mop_airflow.records import RunRecord
from mop_airflow.results import (
    DOWNLOADS,
    NotARunFolder,
    check_folder,
    check_ids,
    download_uri,
    read_chunks,
    run_results,
)
from mop_airflow.store import Store

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
        query = (select(DagRun).join(TaskInstance, and_(TaskInstance.dag_id == DagRun.dag_id,
                                                        TaskInstance.run_id == DagRun.run_id))
                 .where(TaskInstance.task_id == PREFLIGHT, TaskInstance.operator == PREFLIGHT_OPERATOR,
                        DagRun.dag_id.in_(readable))
                 .order_by(DagRun.run_after.desc()).limit(max(1, min(limit, 1000))))
        return {"runs": [_run_state(run) for run in session.scalars(query)]}

    @app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[can_read_runs])
    def run_page(dag_id: str, run_id: str) -> HTMLResponse:
        _checked(dag_id, run_id)
        return HTMLResponse(_page("run.html", {"dag_id": dag_id, "run_id": run_id}))

    @app.get("/api/runs/{dag_id}/{run_id}", dependencies=[can_read_runs])
    def run_data(dag_id: str, run_id: str, session: SessionDep) -> dict[str, Any]:
        dag_run, preflight = _find_run(session, dag_id, run_id)
        head = {**_run_state(dag_run), "preflight_state": _state(preflight.state)}
        record = _run_record(session, dag_id, run_id)
        if record is None:
            waiting = "failed" if head["preflight_state"] in ("failed", "upstream_failed") else "waiting"
            return {**head, "stage": waiting, "message": (
                "preflight failed, so the run was never resolved: see the preflight task's log" if waiting == "failed"
                else f"preflight has not finished yet (its state: {head['preflight_state'] or 'none'}); "
                     "the plan shows once it has resolved the run")}
        try:
            return {**run_results(_layout(record, dag_id, run_id), record), **head}
        except NotARunFolder as exc:
            raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
        except (MopError, OSError) as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"the run's store is not readable: {exc}") from exc

    @app.get("/api/runs/{dag_id}/{run_id}/files/{name}", dependencies=[can_read_runs])
    def download(dag_id: str, run_id: str, name: str, session: SessionDep) -> StreamingResponse:
        if name not in DOWNLOADS:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"{name!r} is not a report file that can be downloaded")
        _find_run(session, dag_id, run_id)
        record = _run_record(session, dag_id, run_id)
        if record is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "the run has not been resolved")
        layout = _layout(record, dag_id, run_id)
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


def _checked(dag_id: str, run_id: str) -> None:
    try:
        check_ids(dag_id, run_id)
    except NotARunFolder as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc


def _find_run(session: Any, dag_id: str, run_id: str) -> tuple[DagRun, TaskInstance]:
    """The DAG run and its preflight task instance; 404 unless both exist and it is a mop_airflow run."""
    _checked(dag_id, run_id)
    dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if dag_run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run_id!r} of DAG {dag_id!r}")
    preflight = session.scalar(select(TaskInstance).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == PREFLIGHT,
        TaskInstance.map_index == -1))
    if preflight is None or preflight.operator != PREFLIGHT_OPERATOR:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{dag_id} is not a mop_airflow DAG: its runs have no results")
    return dag_run, preflight


def _run_record(session: Any, dag_id: str, run_id: str) -> RunRecord | None:
    """The run as its preflight resolved it (XCom ``return_value``), or None before that."""
    row = session.scalars(XComModel.get_many(run_id=run_id, key="return_value", task_ids=PREFLIGHT, dag_ids=dag_id,
                                             map_indexes=-1, limit=1)).first()
    value = None if row is None else XComModel.deserialize_value(row)
    if not isinstance(value, dict) or value.get("dag_id") != dag_id or value.get("run_id") != run_id:
        return None
    return RunRecord.from_dict(value)


def _layout(record: RunRecord, dag_id: str, run_id: str) -> RunLayout:
    spec = record.store
    store = Store(spec.root, spec.storage_options, spec.conn_id, retry_seconds=min(spec.retry_seconds, PAGE_SECONDS))
    return RunLayout(store, dag_id, run_id)


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
