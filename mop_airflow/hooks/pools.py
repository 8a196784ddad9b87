"""Airflow pools for shards: names, the CLI's sync, and the pre-run check or creation (task side).

A task whose pool does not exist is never scheduled: Airflow leaves it in "scheduled" for ever.
So the first task of every run makes sure the pools exist through Airflow's REST API (task code may
not touch the metadata database in Airflow 3): by default it creates the missing ones; in "check"
mode it fails at once naming them and the command that creates them. ``mop-airflow pools sync``
creates or resizes them from the metadata database directly.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from mop_airflow.hooks.rest import API_CONN_ID, AirflowAPI
from mop_airflow.errors import AirflowApiError, MopError, PoolsMissingError, SpecError
from mop_airflow.planning.task_plan import shard_pool
POOL_MODES = ("create", "check", "off")
log = logging.getLogger(__name__)


def required_pools(shards: int) -> list[str]:
    return [shard_pool(s) for s in range(shards)]


def sync_command(shards: int, slots: int) -> str:
    return f"mop-airflow pools sync --shards {shards} --slots {slots}"


def pool_description(shard: int) -> str:
    return f"mop_airflow shard {shard}: models training on this shard at once (one per GPU)"


def sync_pools(shards: int, slots: int) -> list[str]:
    """Create or resize the shard pools in the metadata database (run where `airflow` CLI runs)."""
    names = required_pools(shards)
    sync_pool_slots({name: slots for name in names}, command=sync_command(shards, slots))
    return names


def dag_folder_pools(dags_folder: str) -> tuple[dict[str, int], dict[str, str]]:
    """The shard pools the mop_airflow DAGs of a folder need: ({pool: most slots asked}, {file: import error}).

    Parses the folder as Airflow's DAG processor would (cheap: DAG files import no TensorFlow) and
    reads each DAG's first task, which carries its spec.
    """
    from airflow.dag_processing.dagbag import DagBag  # noqa: PLC0415 - needs a configured Airflow

    bag = DagBag(dags_folder)
    pools: dict[str, int] = {}
    for dag in bag.dags.values():
        for task in dag.tasks:
            # by name: the operators sit above this module (they import it)
            if task.task_type == "MopPreflightOperator" and task.pools != "off":
                schedule = task.spec["schedule"]
                for name in required_pools(schedule["shards"]):
                    pools[name] = max(pools.get(name, 0), schedule.get("slots_per_shard", 1))
    return pools, dict(bag.import_errors)


def sync_pool_slots(pools: dict[str, int], *, command: str = "mop-airflow pools sync") -> None:
    """Create or resize named shard pools to the given slots (metadata database).

    A metadata database that was never migrated (no table ``slot_pool``) is a :class:`PoolsMissingError`
    naming the database and ``airflow db migrate``, then ``command`` (the sync to run again)."""
    from airflow.models.pool import Pool  # noqa: PLC0415
    from sqlalchemy.exc import DBAPIError  # noqa: PLC0415

    try:
        for name, slots in sorted(pools.items()):
            Pool.create_or_update_pool(name=name, slots=slots, include_deferred=False,
                                       description=pool_description(int(name.rsplit("_", 1)[1])))
    except DBAPIError as exc:
        database = _unmigrated_database(Pool.__tablename__)
        if database is None:  # the table is there (or the database cannot tell): Airflow's own error says more
            raise
        raise PoolsMissingError(
            pools, f"airflow db migrate, then {command}",
            reason=f"the metadata database ([database] sql_alchemy_conn = {database}) has no table "
                   f"{Pool.__tablename__}: it was never migrated, and Airflow makes its tables with "
                   "`airflow db migrate` (run it once per database, with the same configuration, before "
                   "any other Airflow command)") from exc


def _unmigrated_database(table: str) -> str | None:
    """The metadata database's URL (password hidden) when it lacks Airflow's ``table``, else None."""
    import sqlalchemy  # noqa: PLC0415
    from airflow import settings  # noqa: PLC0415

    try:
        engine = settings.get_engine()
        if sqlalchemy.inspect(engine).has_table(table):
            return None
        return engine.url.render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - unreachable or unconfigured: not a question of migration
        return None


def _api_target() -> tuple[str, str | None, str | None]:
    """Base URL and optional credentials of the Airflow REST API.

    The connection ``mop_airflow_api`` (host, login, password) wins; otherwise the API server that
    runs the execution API this task talks to, which is the same server in every standard deployment.
    """
    try:
        from airflow.sdk import BaseHook  # noqa: PLC0415

        conn = BaseHook.get_connection(API_CONN_ID)
        host = conn.host or ""
        if conn.port and "://" in host and host.count(":") < 2:
            host = f"{host}:{conn.port}"
        if host and "://" not in host:
            host = f"http://{host}" + (f":{conn.port}" if conn.port else "")
        return host.rstrip("/"), conn.login, conn.password
    except Exception:  # noqa: BLE001 - no such connection: fall back to the execution API's server
        pass
    from airflow.configuration import conf  # noqa: PLC0415

    url = conf.get("core", "execution_api_server_url", fallback=None) or ""
    if url:
        base = url.rstrip("/").removesuffix("/execution")
    else:
        base = conf.get("api", "base_url", fallback=None) or "http://localhost:8080"
    return base.rstrip("/"), None, None


def _api() -> AirflowAPI:
    base, login, password = _api_target()
    return AirflowAPI(base, login, password, timeout=15.0)


def _unreachable(exc: AirflowApiError) -> MopError:
    if exc.status in (401, 403):  # the error already names the connection, the variables and the password file
        return MopError(f"{exc}; or build the DAG with pools='off' if you manage the pools yourself")
    return MopError(
        f"{exc}. Create an HTTP connection '{API_CONN_ID}' with the API server's URL as host and the login "
        "and password of a user who may read and edit pools, or build the DAG with pools='off' if you "
        "manage the pools yourself")


def _pool_slots(api: AirflowAPI) -> dict[str, int]:
    return {p["name"]: int(p.get("slots", 0)) for p in api.paged("/pools", "pools")}


def too_small(pools: dict[str, int], names: Sequence[str], slots: int, command: str) -> None:
    """Refuse pools with fewer slots than a block runs train tasks on their shard: a block's train
    tasks wait for each other's hops, so one held back by its pool would keep the others waiting."""
    small = {name: pools[name] for name in names if name in pools and 0 <= pools[name] < slots}
    if small:
        listed = ", ".join(f"{name} has {n}" for name, n in sorted(small.items()))
        raise SpecError("schedule.slots_per_shard", slots,
                        f"a block runs {slots} train task(s) on each shard at once, which wait for each other's "
                        f"hops, but the pool {listed} slot(s); the block would wait for ever",
                        f"give the pools {slots} slot(s) ({command}), or lower schedule.slots_per_shard")


def least_parallelism(shards: int, slots: int) -> int:
    """The fewest tasks a LocalExecutor must run at once for a block: its ``shards x slots`` train tasks,
    which wait for each other's hops, and one control task beside them."""
    return shards * slots + 1


def check_parallelism(shards: int, slots: int, config: Any = None) -> None:
    """Refuse, before anything trains, a LocalExecutor that cannot run a block's train tasks at once
    (``shards x slots`` of them, waiting for each other's hops) beside one control task."""
    if config is None:
        from airflow.configuration import conf as config  # noqa: PLC0415
    executor = config.get("core", "executor", fallback="") or ""
    if "LocalExecutor" not in executor:
        return  # Celery workers' concurrency is theirs: the how-to sizes each shard's worker to its slots
    parallelism = config.getint("core", "parallelism", fallback=32)
    needed = least_parallelism(shards, slots)
    if 0 < parallelism < needed:
        raise SpecError("[core] parallelism", parallelism,
                        f"the LocalExecutor runs at most {parallelism} task(s) at once, but a block of this search "
                        f"runs {shards * slots} train tasks at once ({shards} shards x {slots} slot(s)), which wait "
                        "for each other's hops, and a control task beside them",
                        f"set AIRFLOW__CORE__PARALLELISM={needed} or more, or use fewer shards or slots")


def ensure_pools(names: Sequence[str], *, shards: int, slots: int, mode: str = "create") -> list[str]:
    """Make sure a run's shard pools exist before any hop waits on them; returns the pools created.

    ``mode`` is one of :data:`POOL_MODES`: ``create`` adds missing pools (with ``slots`` slots) through
    the REST API, ``check`` only fails naming the missing ones and the command that creates them,
    ``off`` does nothing. Existing pools are never resized here: an operator may have sized them on
    purpose (``mop-airflow pools sync`` does that); one with fewer slots than ``slots`` is refused
    (:func:`too_small`).
    """
    if mode not in POOL_MODES:
        raise SpecError("pools", mode, f"must be one of {list(POOL_MODES)}",
                        "use 'create' (default), 'check' or 'off'")
    if mode == "off":
        return []
    with _api() as api:
        try:
            existing = _pool_slots(api)
        except AirflowApiError as exc:
            raise _unreachable(exc) from exc
        too_small(existing, names, slots, sync_command(shards, slots))
        missing = [n for n in names if n not in existing]
        if missing and mode == "check":
            raise PoolsMissingError(missing, sync_command(shards, slots))
        for name in missing:
            try:
                api.call("POST", "/pools", json={"name": name, "slots": slots, "include_deferred": False,
                                                 "description": pool_description(names.index(name))})
            except AirflowApiError as exc:
                if exc.status == 409:  # another run created it a moment ago
                    continue
                if exc.status in (401, 403):
                    raise PoolsMissingError(missing, sync_command(shards, slots),
                                            reason=f"the REST API user may not create pools ({exc})") from exc
                raise _unreachable(exc) from exc
        return missing


WAITING_STATES = (None, "none", "scheduled", "queued", "up_for_reschedule", "up_for_retry", "deferred")


def fail_tasks_never_started(dag_id: str, run_id: str, task_ids: Sequence[str], note: str,
                             state: str = "failed") -> list[str]:
    """Fail the train tasks of a block's slots that never started (their task still waits in Airflow for a
    worker or a pool slot) once a slot waiting for them has failed for good: nothing else would ever end
    them, and the DAG run would stay running for ever (``state`` "success": an ASHA search finished without
    them). Returns the tasks ended; a task that has started
    meanwhile is left alone. Through the REST API, as the pools are (task code may not touch the database)."""
    failed = []
    with _api() as api:
        for task_id in task_ids:
            path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
            try:
                if api.get(path).get("state") not in WAITING_STATES:
                    continue
                api.call("PATCH", path, json={"new_state": state, "note": note[:1000]})
            except AirflowApiError as exc:
                raise _unreachable(exc) from exc
            failed.append(task_id)
    return failed


# A train task in one of these has started and may still end the tasks of its block that never started
# (it waits for them within the wait bound); "scheduled" and "queued" may be a retry's too.
LIVE_STATES = ("running", "up_for_retry", "up_for_reschedule", "restarting", "deferred")
NEVER_STARTED_STATES = (None, "none", "scheduled", "queued")


def fail_waiting_unless_one_lives(dag_id: str, run_id: str, task_ids: Sequence[str], note: str) -> list[str]:
    """Fail the tasks of ``task_ids`` still waiting to start, unless one of them has started and lives on
    (that one ends them itself, within its wait bound). For a train task that failed for good where no
    slot of its block is left to do so: the run would wait for ever for a task no worker or pool slot will
    ever start. Returns the tasks failed."""
    with _api() as api:
        try:
            states = {t: api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{t}").get("state") for t in task_ids}
        except AirflowApiError as exc:
            raise _unreachable(exc) from exc
    if any(state in LIVE_STATES for state in states.values()):
        return []
    waiting = [t for t, state in states.items() if state in NEVER_STARTED_STATES]
    return fail_tasks_never_started(dag_id, run_id, waiting, note) if waiting else []


def celery_active_queues(timeout: float = 5.0) -> dict[str, list[dict[str, Any]]] | None:
    """What each Celery worker listens on (``inspect().active_queues()``), through the Celery app Airflow's
    CeleryExecutor configures (its broker); None when no worker answered within ``timeout``."""
    from airflow.providers.celery.executors.celery_executor_utils import app  # noqa: PLC0415

    return app.control.inspect(timeout=timeout).active_queues()


def check_queues_served(queues: Sequence[str], *, slots: int, config: Any = None,
                        active: Callable[[], dict[str, list[dict[str, Any]]] | None] = celery_active_queues) -> None:
    """Refuse, before anything trains, shard queues no Celery worker listens on: a train task sent there
    waits in "queued" for ever, and the slots of its block wait for it (then fail, after the wait bound).
    Only under a CeleryExecutor (the others run every queue's tasks). No answer from any worker within
    the timeout says nothing: it is logged by the caller, not refused."""
    if config is None:
        from airflow.configuration import conf as config  # noqa: PLC0415
    if "CeleryExecutor" not in (config.get("core", "executor", fallback="") or ""):
        return
    answer = active()
    if not answer:
        log.warning("no Celery worker answered within the timeout: the queues %s were not checked", ", ".join(queues))
        return
    served = {q.get("name") for listened in answer.values() for q in (listened or ())}
    missing = [q for q in queues if q not in served]
    if missing:
        workers = "; ".join(f"{w} listens on {', '.join(sorted(q.get('name', '?') for q in listened or ())) or 'nothing'}"
                            for w, listened in sorted(answer.items()))
        raise SpecError("schedule.shards", len(queues),
                        f"no Celery worker listens on queue(s) {', '.join(missing)}, where this search's train tasks "
                        f"of those shards go ({workers}); they would wait in 'queued' for ever and the other shards "
                        "for them", f"start a worker on each shard's machine with `airflow celery worker --queues "
                        f"{missing[0]} --concurrency {slots}` (one per queue), or use fewer shards")
