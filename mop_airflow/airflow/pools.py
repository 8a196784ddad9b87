"""Airflow pools for shards: names, the CLI's sync, and the pre-run check or creation (task side).

A task whose pool does not exist is never scheduled: Airflow leaves it in "scheduled" for ever.
So the first task of every run makes sure the pools exist through Airflow's REST API (task code may
not touch the metadata database in Airflow 3): by default it creates the missing ones; in "check"
mode it fails at once naming them and the command that creates them. ``mop-airflow pools sync``
creates or resizes them from the metadata database directly.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from mop_airflow.errors import MopError, PoolsMissingError, SpecError
from mop_airflow.task_plan import shard_pool

API_CONN_ID = "mop_airflow_api"
POOL_MODES = ("create", "check", "off")


def required_pools(shards: int) -> list[str]:
    return [shard_pool(s) for s in range(shards)]


def sync_command(shards: int, slots: int) -> str:
    return f"mop-airflow pools sync --shards {shards} --slots {slots}"


def sync_pools(shards: int, slots: int) -> list[str]:
    """Create or resize the shard pools in the metadata database (run where `airflow` CLI runs)."""
    from airflow.models.pool import Pool  # noqa: PLC0415 - needs a configured Airflow

    names = required_pools(shards)
    for shard, name in enumerate(names):
        Pool.create_or_update_pool(
            name=name, slots=slots, include_deferred=False,
            description=f"mop_airflow shard {shard}: models training on this shard at once (one per GPU)",
        )
    return names


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


@contextlib.contextmanager
def _rest_client() -> Iterator[Any]:
    """An httpx client on Airflow's REST API with a bearer token; its errors become one clear MopError."""
    import httpx  # noqa: PLC0415

    base, login, password = _api_target()
    try:
        with httpx.Client(base_url=base, timeout=15.0) as client:
            if login:
                response = client.post("/auth/token", json={"username": login, "password": password})
            else:  # simple auth manager with all_admins (the embedded default) hands out tokens freely
                response = client.get("/auth/token")
            response.raise_for_status()
            client.headers["Authorization"] = f"Bearer {response.json()['access_token']}"
            yield client
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise MopError(
            f"could not reach Airflow's pools through the REST API at {base} ({exc}). Create an HTTP "
            f"connection '{API_CONN_ID}' with the API server's URL as host and the login and password of a "
            "user who may read and edit pools, or build the DAG with pools='off' if you manage the pools "
            "yourself"
        ) from exc


def _pool_names(client: Any) -> set[str]:
    names: set[str] = set()
    offset = 0
    while True:
        page = client.get("/api/v2/pools", params={"limit": 100, "offset": offset})
        page.raise_for_status()
        body = page.json()
        names.update(p["name"] for p in body["pools"])
        offset += len(body["pools"])
        if not body["pools"] or offset >= body.get("total_entries", 0):
            return names


def existing_pools() -> set[str]:
    """Names of the pools Airflow has, read through its REST API."""
    with _rest_client() as client:
        return _pool_names(client)


def ensure_pools(names: Sequence[str], *, shards: int, slots: int, mode: str = "create") -> list[str]:
    """Make sure a run's shard pools exist before any hop waits on them; returns the pools created.

    ``mode`` is one of :data:`POOL_MODES`: ``create`` adds missing pools (with ``slots`` slots) through
    the REST API, ``check`` only fails naming the missing ones and the command that creates them,
    ``off`` does nothing. Existing pools are never resized here: an operator may have sized them on
    purpose (``mop-airflow pools sync`` does that).
    """
    if mode not in POOL_MODES:
        raise SpecError("pools", mode, f"must be one of {list(POOL_MODES)}",
                        "use 'create' (default), 'check' or 'off'")
    if mode == "off":
        return []
    with _rest_client() as client:
        missing = [n for n in names if n not in _pool_names(client)]
        if missing and mode == "check":
            raise PoolsMissingError(missing, sync_command(shards, slots))
        for name in missing:
            shard = names.index(name)
            response = client.post("/api/v2/pools", json={
                "name": name, "slots": slots, "include_deferred": False,
                "description": f"mop_airflow shard {shard}: models training on this shard at once (one per GPU)"})
            if response.status_code == 409:  # another run created it a moment ago
                continue
            if response.status_code in (401, 403):
                raise PoolsMissingError(missing, sync_command(shards, slots),
                                        reason=f"the REST API user may not create pools ({response.status_code})")
            response.raise_for_status()
        return missing
