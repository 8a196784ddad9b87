"""Credentials from Airflow connections, turned into the plain fsspec options the core takes.

The core opens every filesystem with :func:`mop_airflow.store.open_filesystem` and never sees a
``conn_id``; the operators, the results page and the command line call these to open the store
and the data of a spec whose ``conn_id`` names an Airflow AWS connection. The keys stay in memory:
they are never written into a record, an XCom or a log.
"""

from __future__ import annotations

from typing import Any, Mapping

from mop_airflow.config import DataSpec, StoreSpec
from mop_airflow.store import Store


def s3_options_from_connection(conn_id: str) -> dict[str, Any]:
    """s3fs options from an Airflow AWS connection (login/password, extra endpoint_url/region_name)."""
    from airflow.sdk import BaseHook  # noqa: PLC0415 - tasks, the API server and the CLI all have it

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


def filesystem_options(uris: str | tuple[str, ...], storage_options: Mapping[str, Any] | None = None,
                       conn_id: str | None = None) -> dict[str, Any]:
    """The options that open ``uris``: the connection's keys when one of them is on S3, then the
    spec's own ``storage_options`` over them (so a spec can still set, say, a retry policy)."""
    uris = (uris,) if isinstance(uris, str) else uris
    options = dict(storage_options or {})
    if conn_id and any(str(u).startswith("s3://") for u in uris):
        options = {**s3_options_from_connection(conn_id), **options}
    return options


def open_spec_store(spec: StoreSpec, *, retry_seconds: float | None = None) -> Store:
    """The store a spec names, opened with its connection's keys."""
    return Store(spec.root, filesystem_options(spec.root, spec.storage_options, spec.conn_id),
                 spec.retry_seconds if retry_seconds is None else retry_seconds)


def data_options(data: DataSpec) -> dict[str, Any]:
    """The options that open a spec's data source (and its separate validation source)."""
    uris = (data.source, data.validation) if isinstance(data.validation, str) else (data.source,)
    return filesystem_options(uris, data.storage_options, data.conn_id)
