"""Credentials for the store and the data from Airflow connections, never from the spec."""

from __future__ import annotations

from typing import Any


def s3_options_from_connection(conn_id: str) -> dict[str, Any]:
    """s3fs options from an Airflow AWS connection (login/password, extra endpoint_url/region_name).

    Imported lazily by the store: the core library works without Airflow; only S3 with a
    connection needs it.
    """
    from airflow.sdk import BaseHook  # noqa: PLC0415

    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson or {}
    options: dict[str, Any] = {}
    if conn.login:
        options["key"] = conn.login
    if conn.password:
        options["secret"] = conn.password
    client_kwargs = {}
    endpoint = extra.get("endpoint_url") or (extra.get("service_config", {}).get("s3", {}) or {}).get("endpoint_url")
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    if extra.get("region_name"):
        client_kwargs["region_name"] = extra["region_name"]
    if client_kwargs:
        options["client_kwargs"] = client_kwargs
    return options
