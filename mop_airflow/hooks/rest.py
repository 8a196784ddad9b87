"""Airflow's REST API (``/api/v2``) as mop_airflow uses it: one token, then JSON calls.

Used by the first task of a run (pools), by ``mop-airflow status`` / ``report`` and by the local
embedded Airflow. With a login, the token comes from ``POST /auth/token``; without one, from
``GET /auth/token``, which the simple auth manager answers when every user is an admin (the
local embedded default). A refusal (401, 403) says where each caller takes its login from and
where Airflow's simple auth manager keeps the passwords it generated.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterator, Mapping

from mop_airflow.errors import AirflowApiError

API_CONN_ID = "mop_airflow_api"  # the HTTP connection the tasks sign in with (preflight's pool check)
USER_ENV, PASSWORD_ENV = "MOP_API_USER", "MOP_API_PASSWORD"  # the command line's login
# Airflow 3's simple auth manager (its default): where it writes the passwords it generates for
# [core] simple_auth_manager_users, read from the option or else Airflow's default
PASSWORDS_OPTION = ("core", "simple_auth_manager_passwords_file")
PASSWORDS_FILE_NAME = "simple_auth_manager_passwords.json.generated"


def passwords_file(environ: Mapping[str, str] = os.environ) -> str:
    """Where this machine's Airflow settings put the simple auth manager's generated passwords:
    ``[core] simple_auth_manager_passwords_file``, else ``$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated``.
    Reads Airflow's configuration only where it is already loaded (a task), so an error never imports
    Airflow (which writes a default ``airflow.cfg`` where none is)."""
    if "airflow.configuration" in sys.modules:
        try:
            from airflow.configuration import AIRFLOW_HOME, conf  # noqa: PLC0415

            return conf.get(*PASSWORDS_OPTION, fallback=None) or os.path.join(AIRFLOW_HOME, PASSWORDS_FILE_NAME)
        except Exception:  # noqa: BLE001 - a half-configured Airflow: the environment says as much
            pass
    option = environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
    home = os.path.expanduser(environ.get("AIRFLOW_HOME") or "~/airflow")
    return option or os.path.join(home, PASSWORDS_FILE_NAME)


def refused_hint(status: int, username: str | None, *, signing_in: bool) -> str:
    """What a 401 or 403 means here and how to fix it: the login each caller uses, and where the
    simple auth manager's generated passwords are."""
    if signing_in and not username:
        what = ("Airflow gives a token without a login only when [core] simple_auth_manager_all_admins is True "
                "(its default is False), so mop_airflow must sign in as one of its users")
    elif signing_in:
        what = f"Airflow refused the login {username!r} with the password given"
    else:
        what = f"the user {username or '(no login)'!r} may not make this call"
    return (f". {what}. Fix: sign in as an Airflow user who may: for the tasks (preflight's pool check, which "
            f"creates missing pools: role op or admin), an HTTP connection {API_CONN_ID!r} with the API server's URL "
            f"as host and the user's login and password; for `mop-airflow status`, `report` and the other commands "
            f"(role viewer is enough to read runs), the variables {USER_ENV} and {PASSWORD_ENV} (or --username). "
            f"Airflow's simple auth manager names its users and roles in [core] simple_auth_manager_users (default "
            f"admin:admin) and writes the passwords it generates as JSON to [core] {PASSWORDS_OPTION[1]} (default "
            f"$AIRFLOW_HOME/{PASSWORDS_FILE_NAME}; with this machine's settings {passwords_file()}) on the API "
            "server's machine")


class AirflowAPI:
    def __init__(self, base_url: str, username: str | None = None, password: str | None = None, *,
                 timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.username = username
        self.password = password
        self.timeout = timeout
        self._client: Any = None
        self._token: str | None = None

    def __enter__(self) -> "AirflowAPI":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def client(self) -> Any:
        import httpx  # noqa: PLC0415

        if self._client is None:
            self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout)
        return self._client

    def _fail(self, what: str, exc: Exception | None = None, status: int | None = None, text: str = "",
              *, signing_in: bool = False) -> AirflowApiError:
        detail = f"{status}: {text[:500]}" if status is not None else str(exc)
        hint = refused_hint(status, self.username, signing_in=signing_in) if status in (401, 403) else ""
        return AirflowApiError(f"Airflow REST API at {self.base_url}: {what} -> {detail}{hint}", status=status)

    @property
    def token(self) -> str:
        import httpx  # noqa: PLC0415

        if self._token is None:
            try:
                if self.username:
                    response = self.client.post("/auth/token", json={"username": self.username,
                                                                     "password": self.password or ""})
                else:
                    response = self.client.get("/auth/token")
            except httpx.HTTPError as exc:
                raise self._fail("sign in", exc) from exc
            if response.status_code >= 400:
                who = f"as {self.username!r}" if self.username else "without a login"
                raise self._fail(f"sign in {who}", status=response.status_code, text=response.text, signing_in=True)
            self._token = response.json()["access_token"]
        return self._token

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """``method`` on ``/api/v2{path}``; the JSON answer, or :class:`AirflowApiError` with the status."""
        import httpx  # noqa: PLC0415

        headers = {"Authorization": f"Bearer {self.token}", **kwargs.pop("headers", {})}
        try:
            response = self.client.request(method, f"/api/v2{path}", headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise self._fail(f"{method} {path}", exc) from exc
        if response.status_code >= 400:
            raise self._fail(f"{method} {path}", status=response.status_code, text=response.text)
        return response.json() if response.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params or None)

    def paged(self, path: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Every item of a list endpoint, 100 at a time."""
        offset = 0
        while True:
            page = self.get(path, limit=100, offset=offset, **params)
            yield from page[key]
            offset += len(page[key])
            if not page[key] or offset >= page.get("total_entries", 0):
                return
