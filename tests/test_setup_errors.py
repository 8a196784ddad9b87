"""Two first steps a new deployment gets wrong say how to fix them: `mop-airflow pools sync` on a
metadata database that was never migrated names `airflow db migrate`, and a refusal (401/403) from
Airflow's REST API names the login each caller uses and where the generated passwords are.
Against real ones: an empty SQLite file, a new PostgreSQL database, an HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mop_airflow.cli.main import main
from mop_airflow.cli.runs import UNAVAILABLE
from mop_airflow.errors import AirflowApiError, MopError
from mop_airflow.hooks.rest import AirflowAPI, passwords_file

PG = ("127.0.0.1", 5432)
ALL_ADMINS_ONLY = {"detail": "This method is only allowed if [core] simple_auth_manager_all_admins is True"}


def _pools_sync(tmp_path: Path, database_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
           "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"}
    return subprocess.run([sys.executable, "-m", "mop_airflow.cli.main", "pools", "sync", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def _says_migrate(result: subprocess.CompletedProcess, database: str, command: str) -> None:
    assert result.returncode == UNAVAILABLE, result.stdout + result.stderr
    error = result.stderr
    assert "Traceback" not in error and "sqlalchemy.exc" not in error, error
    assert error.startswith("mop-airflow: Airflow pools missing: mop_shard_0, mop_shard_1"), error
    assert f"[database] sql_alchemy_conn = {database}) has no table slot_pool: it was never migrated" in error
    assert f"Create them with: airflow db migrate, then {command}" in error


def test_pools_sync_on_an_empty_sqlite_file_names_airflow_db_migrate(tmp_path):
    database = tmp_path / "airflow.db"
    database.touch()
    url = f"sqlite:///{database}"
    _says_migrate(_pools_sync(tmp_path, url, "--shards", "2", "--slots", "1"), url,
                  "mop-airflow pools sync --shards 2 --slots 1")
    with sqlite3.connect(database) as db:  # nothing was made in the user's database
        assert db.execute("SELECT name FROM sqlite_master").fetchall() == []


def test_pools_sync_of_a_dags_folder_on_an_empty_sqlite_file_names_the_same_command_again(tmp_path):
    from tests.conftest import dag_file
    from tests.test_spec import spec_dict

    folder = tmp_path / "dags"
    folder.mkdir()
    dag_file(folder, "mop_unmigrated", spec_dict())
    database = tmp_path / "airflow.db"
    database.touch()
    url = f"sqlite:///{database}"
    _says_migrate(_pools_sync(tmp_path, url, "--dags-folder", str(folder)), url,
                  f"mop-airflow pools sync --dags-folder {folder}")


def test_pools_sync_on_a_new_postgresql_database_names_airflow_db_migrate(tmp_path):
    try:
        socket.create_connection(PG, timeout=2).close()
    except OSError:
        pytest.skip(f"PostgreSQL is not reachable on {PG[0]}:{PG[1]}")
    from mop_airflow.deployment.local import throwaway_postgres

    with throwaway_postgres(*PG, prefix="mop_airflow_unmigrated") as url:
        _says_migrate(_pools_sync(tmp_path, url, "--shards", "2", "--slots", "1"), url,
                      "mop-airflow pools sync --shards 2 --slots 1")


# --------------------------------------------------------------------------- the REST API refuses
class _Refusing(BaseHTTPRequestHandler):
    """Airflow 3's answers with the simple auth manager and passwords: no token without a login (403),
    a wrong login refused (401); the user ``viewer`` signs in and may list pools but not create one (403)."""

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _viewer(self) -> bool:
        return self.headers.get("Authorization") == "Bearer viewer-token"

    def do_GET(self):  # noqa: N802 - http.server's name
        if self._viewer() and self.path.startswith("/api/v2/pools"):
            self._answer(200, {"pools": [], "total_entries": 0})
        else:
            self._answer(403, ALL_ADMINS_ONLY if self.path == "/auth/token" else {"detail": "Forbidden"})

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/auth/token" and json.loads(body) == {"username": "viewer", "password": "pw"}:
            self._answer(201, {"access_token": "viewer-token"})
        elif self.path == "/auth/token":
            self._answer(401, {"detail": "Invalid credentials"})
        else:
            self._answer(403, {"detail": "Forbidden"})

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def refusing_airflow():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _names_every_way_to_sign_in(message: str) -> None:
    assert "HTTP connection 'mop_airflow_api'" in message
    assert "MOP_API_USER" in message and "MOP_API_PASSWORD" in message
    assert "[core] simple_auth_manager_passwords_file" in message
    assert "default $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" in message
    assert f"with this machine's settings {passwords_file()}" in message


def test_a_403_without_a_login_names_the_connection_the_variables_and_the_password_file(refusing_airflow):
    with AirflowAPI(refusing_airflow) as api, pytest.raises(AirflowApiError) as info:
        api.get("/dags")
    message = str(info.value)
    assert info.value.status == 403
    assert message.startswith(f"Airflow REST API at {refusing_airflow}: sign in without a login -> 403: "
                              f"{json.dumps(ALL_ADMINS_ONLY)}")
    assert "a token without a login only when [core] simple_auth_manager_all_admins is True" in message
    _names_every_way_to_sign_in(message)


def test_a_401_names_the_refused_login(refusing_airflow):
    with AirflowAPI(refusing_airflow, "bob", "wrong") as api, pytest.raises(AirflowApiError) as info:
        api.get("/dags")
    assert info.value.status == 401
    assert "sign in as 'bob' -> 401" in str(info.value)
    assert "Airflow refused the login 'bob' with the password given" in str(info.value)
    _names_every_way_to_sign_in(str(info.value))


def test_the_password_file_follows_airflows_option_and_home(monkeypatch, tmp_path):
    monkeypatch.delenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", raising=False)
    assert passwords_file() == os.path.join(os.environ["AIRFLOW_HOME"], "simple_auth_manager_passwords.json.generated")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(tmp_path / "passwords.json"))
    assert passwords_file() == str(tmp_path / "passwords.json")
    # where Airflow is not loaded (the command line): from the environment, never importing Airflow
    monkeypatch.delitem(sys.modules, "airflow.configuration", raising=False)
    name = "simple_auth_manager_passwords.json.generated"
    assert passwords_file({"AIRFLOW_HOME": "/srv/airflow"}) == f"/srv/airflow/{name}"
    assert passwords_file({"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": "/etc/p.json"}) == "/etc/p.json"
    assert passwords_file({}) == os.path.expanduser(f"~/airflow/{name}")
    assert "airflow.configuration" not in sys.modules


def test_preflights_pool_check_on_a_403_says_how_to_sign_in(refusing_airflow, monkeypatch):
    from mop_airflow.hooks.pools import ensure_pools

    monkeypatch.setenv("AIRFLOW_CONN_MOP_AIRFLOW_API", refusing_airflow)
    with pytest.raises(MopError) as info:
        ensure_pools(["mop_shard_0"], shards=1, slots=1, mode="create")
    message = str(info.value)
    assert "sign in without a login -> 403" in message and message.endswith(
        "; or build the DAG with pools='off' if you manage the pools yourself")
    _names_every_way_to_sign_in(message)


def test_a_user_who_may_not_create_pools_gets_the_same_advice_and_the_sync_command(refusing_airflow, monkeypatch):
    from mop_airflow.errors import PoolsMissingError
    from mop_airflow.hooks.pools import ensure_pools

    monkeypatch.setenv("AIRFLOW_CONN_MOP_AIRFLOW_API", refusing_airflow.replace("http://", "http://viewer:pw@"))
    with pytest.raises(PoolsMissingError) as info:
        ensure_pools(["mop_shard_0"], shards=1, slots=1, mode="create")
    message = str(info.value)
    assert message.startswith("Airflow pools missing: mop_shard_0 and not created: the REST API user may not create "
                              f"pools (Airflow REST API at {refusing_airflow}: POST /pools -> 403")
    assert "the user 'viewer' may not make this call" in message and "role op or admin" in message
    assert message.endswith("Create them with: mop-airflow pools sync --shards 1 --slots 1")
    _names_every_way_to_sign_in(message)


@pytest.mark.parametrize("command", ["status", "report"])
def test_status_and_report_on_a_403_say_how_to_sign_in(refusing_airflow, capsys, command):
    extra = ["--once"] if command == "status" else []
    assert main([command, "mop_demo", *extra, "--api-url", refusing_airflow]) == UNAVAILABLE
    error = capsys.readouterr().err
    assert error.startswith(f"mop-airflow: Airflow REST API at {refusing_airflow}: sign in without a login -> 403")
    _names_every_way_to_sign_in(error)
