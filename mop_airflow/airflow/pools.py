"""Airflow pools for shards: names, creation (CLI side) and the pre-run check (task side).

A task whose pool does not exist is never scheduled: Airflow leaves it in "scheduled" for ever.
So the first task of every run checks the pools through Airflow's REST API (task code may not touch
the metadata database in Airflow 3) and fails at once naming the missing pools and the command
that creates them. Creating pools needs the metadata database, so it lives in the CLI.
"""

from __future__ import annotations

from typing import Iterable

from mop_airflow.errors import MopError, PoolsMissingError
from mop_airflow.task_plan import shard_pool

API_CONN_ID = "mop_airflow_api"


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


def existing_pools() -> set[str]:
    """Names of the pools Airflow has, read through its REST API."""
    import httpx  # noqa: PLC0415

    base, login, password = _api_target()
    try:
        with httpx.Client(base_url=base, timeout=15.0) as client:
            if login:
                response = client.post("/auth/token", json={"username": login, "password": password})
            else:  # simple auth manager with all_admins (the embedded default) hands out tokens freely
                response = client.get("/auth/token")
            response.raise_for_status()
            token = response.json()["access_token"]
            names: set[str] = set()
            offset = 0
            while True:
                page = client.get("/api/v2/pools", params={"limit": 100, "offset": offset},
                                  headers={"Authorization": f"Bearer {token}"})
                page.raise_for_status()
                body = page.json()
                names.update(p["name"] for p in body["pools"])
                offset += len(body["pools"])
                if not body["pools"] or offset >= body.get("total_entries", 0):
                    return names
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise MopError(
            f"could not list Airflow pools through the REST API at {base} ({exc}). Create an HTTP "
            f"connection '{API_CONN_ID}' with the API server's URL as host and a user's login and "
            "password, or build the DAG with check_pools=False if you manage the pools yourself"
        ) from exc


def check_pools(names: Iterable[str], *, shards: int, slots: int, available: set[str] | None = None) -> None:
    """Raise :class:`PoolsMissingError` unless every pool in ``names`` exists."""
    have = existing_pools() if available is None else available
    missing = [n for n in names if n not in have]
    if missing:
        raise PoolsMissingError(missing, sync_command(shards, slots))

