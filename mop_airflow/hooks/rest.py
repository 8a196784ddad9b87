"""Airflow's REST API (``/api/v2``) as mop_airflow uses it: one token, then JSON calls.

Used by the first task of a run (pools), by ``mop-airflow status`` / ``report`` and by the local
embedded Airflow. With a login, the token comes from ``POST /auth/token``; without one, from
``GET /auth/token``, which the simple auth manager answers when every user is an admin (the
local embedded default).
"""

from __future__ import annotations

from typing import Any, Iterator

from mop_airflow.errors import AirflowApiError


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

    def _fail(self, what: str, exc: Exception | None = None, status: int | None = None, text: str = "") -> AirflowApiError:
        detail = f"{status}: {text[:500]}" if status is not None else str(exc)
        return AirflowApiError(f"Airflow REST API at {self.base_url}: {what} -> {detail}", status=status)

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
                hint = "" if self.username else " (this Airflow needs a username and password)"
                raise self._fail("sign in" + hint, status=response.status_code, text=response.text)
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
