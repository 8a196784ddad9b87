"""`mop-airflow up` without starting Airflow (tests/test_command_line.py starts one): who may reach it
(``--host``: the login on off the loopback address, a generated password shown once) and the example
DAGs' data (``--home``: made where it is missing, or a line that says how). LocalAirflow is replaced by
a stand-in that records its settings and stops at once, as Ctrl-C would."""

from __future__ import annotations

import contextlib
import json
import stat
import subprocess
from pathlib import Path

import pytest

from mop_airflow.deployment import local
from mop_airflow.cli import up
from mop_airflow.cli.main import main
from mop_airflow.hooks.rest import PASSWORD_ENV, USER_ENV
from tests.conftest import REPO


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("192.168.0.5", False), ("2001:db8::1", False),
])
def test_only_a_loopback_address_goes_without_a_login(host, loopback):
    assert up.is_loopback(host) is loopback


def test_a_name_that_does_not_resolve_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"--host no-such-host\.invalid: no address of that name.*Fix: "):
        up.is_loopback("no-such-host.invalid")


def test_on_the_loopback_address_nothing_changes(tmp_path):
    served = up.access("127.0.0.1", 8080, tmp_path)
    assert served.env == {} and not served.login and served.internal_url == "http://127.0.0.1:8080"
    assert not (tmp_path / up.PASSWORDS_FILE_NAME).exists()
    other = up.access("127.0.0.2", 8080, tmp_path)  # loopback too: no login, but the server listens there
    assert not other.login and other.env["AIRFLOW__API__HOST"] == "127.0.0.2"
    assert other.env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.2:8080/execution/"


def test_every_interface_turns_the_login_on_with_a_password_made_once(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")  # the caller's own: not for a network
    served = up.access("0.0.0.0", 8080, tmp_path / "airflow")
    assert served.login and served.new_password and len(served.password) >= 20
    env = served.env
    assert env["AIRFLOW__API__HOST"] == "0.0.0.0" and env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert env[USER_ENV] == "admin" and env[PASSWORD_ENV] == served.password
    # this machine's processes still reach it on the loopback address, which every interface holds
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8080/execution/"
    assert env["AIRFLOW_CONN_MOP_AIRFLOW_API"].startswith("http://admin:") and "@127.0.0.1:8080" in env[
        "AIRFLOW_CONN_MOP_AIRFLOW_API"]
    passwords = served.passwords_file
    assert passwords == tmp_path / "airflow" / "simple_auth_manager_passwords.json.generated"
    assert json.loads(passwords.read_text()) == {"admin": served.password}
    assert stat.S_IMODE(passwords.stat().st_mode) == 0o600
    again = up.access("0.0.0.0", 8080, tmp_path / "airflow")  # the next start keeps it and does not show it
    assert again.password == served.password and not again.new_password
    # what the embedded Airflow's processes get: the login wins over the caller's every-visitor-an-admin
    af = local.LocalAirflow(tmp_path / "airflow", tmp_path, port=8080, extra_env=env)
    assert af.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    assert af.env["AIRFLOW__API__HOST"] == "0.0.0.0" and af.base_url == "http://127.0.0.1:8080"
    assert af.rest.username == "admin" and af.rest.password == served.password


def test_one_address_of_the_network_is_where_this_machine_reaches_it_too(tmp_path):
    served = up.access("10.1.2.3", 8793, tmp_path)
    assert served.login and served.url == served.internal_url == "http://10.1.2.3:8793"
    assert served.env["AIRFLOW__API__BASE_URL"] == "http://10.1.2.3:8793"
    af = local.LocalAirflow(tmp_path / "airflow", tmp_path, port=8793, extra_env=served.env)
    assert af.base_url == "http://10.1.2.3:8793"
    assert up.access("2001:db8::1", 8080, tmp_path).internal_url == "http://[2001:db8::1]:8080"


class StandIn:
    """LocalAirflow as `up` uses it: records its settings, and stops at once as Ctrl-C would."""

    started: list[dict] = []

    def __init__(self, home, dags_folder, *, port, extra_env):
        self.extra_env, self.home = extra_env, Path(home)
        self.base_url = f"http://127.0.0.1:{port}"
        StandIn.started.append(extra_env)

    def __enter__(self):
        self.home.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc):
        return False

    def run_cli(self, *args, check=True):
        return subprocess.CompletedProcess(args, 0, "pools ready: none needed", "")

    def alive(self):
        raise KeyboardInterrupt


@pytest.fixture
def stand_in(monkeypatch):
    StandIn.started = []
    monkeypatch.setattr(local, "LocalAirflow", StandIn)
    return StandIn


def test_up_on_every_interface_prints_the_password_once_and_keeps_it(stand_in, tmp_path, capsys):
    dags = tmp_path / "dags"
    dags.mkdir()
    args = ["up", "--dags-folder", str(dags), "--home", str(tmp_path / "home"), "--host", "0.0.0.0",
            "--port", str(local.free_port())]
    assert main(args) == 0
    first = capsys.readouterr().out
    password = stand_in.started[0][PASSWORD_ENV]
    assert first.count(password) == 1 and "sign in as admin" in first and "made now and shown this once" in first
    assert stand_in.started[0]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    assert main(args) == 0
    second = capsys.readouterr().out
    assert password not in second and "the one shown when it was made, kept in" in second
    assert stand_in.started[1][PASSWORD_ENV] == password
    assert main(args[:-4] + ["--port", args[-1]]) == 0  # the default host: this machine only, no login
    assert "no login: only this machine reaches 127.0.0.1" in capsys.readouterr().out
    assert PASSWORD_ENV not in stand_in.started[2] and "AIRFLOW__API__HOST" not in stand_in.started[2]


def _example_dags(tmp_path: Path) -> Path:
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "mine.py").write_text("from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec\n")
    return dags


def test_up_says_how_to_make_the_missing_example_data(stand_in, tmp_path, capsys):
    dags, home = _example_dags(tmp_path), tmp_path / "home"
    assert main(["up", "--dags-folder", str(dags), "--home", str(home), "--no-example-data",
                 "--port", str(local.free_port())]) == 0
    out = capsys.readouterr().out
    assert f"read their data from {home / 'data'}, which lacks mnist1d_train.parquet" in out
    assert f"`mop-airflow example-data --dir {home / 'data'}`" in out
    assert out.index("example-data") < out.index("Airflow UI")  # said at start


def test_up_makes_the_missing_example_data_once(stand_in, tmp_path, capsys, monkeypatch):
    made = []

    def make(directory, num_samples=20000):
        made.append(Path(directory))
        for name in up.EXAMPLE_DATA:
            (Path(directory) / name).mkdir(parents=True, exist_ok=True)
        return [f"made in {directory}"]

    monkeypatch.setattr(up, "make_example_data", make)
    dags, home = _example_dags(tmp_path), tmp_path / "home"
    args = ["up", "--dags-folder", str(dags), "--home", str(home), "--port", str(local.free_port())]
    assert main(args) == 0
    assert made == [home / "data"] and "making it now" in capsys.readouterr().out
    assert main(args) == 0
    assert made == [home / "data"] and f"example data: {home / 'data'}" in capsys.readouterr().out
    assert stand_in.started[0]["MOP_HOME"] == str(home)  # where the example DAGs read it


def test_a_folder_without_example_dags_hears_nothing_of_them(tmp_path):
    (tmp_path / "own.py").write_text("from mop_airflow import build_mop_dag\n")
    assert up.example_data_lines(tmp_path, tmp_path / "home", make=True) == []
    assert up.uses_example_data(REPO / "dags")  # the repository's example DAGs do read it


def test_an_address_of_another_machine_is_refused_before_anything_starts(stand_in, tmp_path, capsys):
    dags = tmp_path / "dags"
    dags.mkdir()
    assert main(["up", "--dags-folder", str(dags), "--home", str(tmp_path / "home"), "--host", "192.0.2.7"]) == 2
    assert "--host 192.0.2.7: not an address of this machine" in capsys.readouterr().err
    assert stand_in.started == [] and not (tmp_path / "home").exists()  # no password made either


def test_a_dag_naming_an_example_model_reads_its_own_data_and_gets_no_example_data(tmp_path):
    # a builder's import path is a string: the DAG reads its own data, and `up` makes nothing for it
    (tmp_path / "mine.py").write_text('MLP = "mop_airflow.examples.mnist1d_models:mlp"\n')
    assert not up.uses_example_data(tmp_path)
    assert up.example_data_lines(tmp_path, tmp_path / "home", make=True) == []
    (tmp_path / "example.py").write_text("from mop_airflow.examples.mnist1d_spec import mnist1d_data_spec\n")
    assert up.uses_example_data(tmp_path)
    assert up.uses_example_data(Path(__file__).resolve().parents[1] / "dags")


@contextlib.contextmanager
def _fake_airflow(tmp_path, answers: dict, seen: list):
    """A LocalAirflow whose api-server is a real HTTP server answering from ``answers`` (path: the answers
    to its next requests, in turn; a callable: the answer to every request), ``seen`` the requests."""
    import http.server
    import threading

    from tests.test_setup_errors import _Refusing

    class Airflow(_Refusing):  # its JSON answers; the routes are this test's
        def _route(self):
            seen.append(f"{self.command} {self.path}")
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answer = (lambda: (200, {"access_token": "t"})) if self.path == "/auth/token" else answers[self.path.split("?")[0]]
            self._answer(*(answer() if callable(answer) else answer.pop(0)))

        do_GET = do_POST = do_PATCH = _route

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Airflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    af = local.LocalAirflow(tmp_path / "airflow", tmp_path, port=server.server_address[1], log=lambda *_: None)
    try:
        yield af
    finally:
        af.rest.close()
        server.shutdown()


def test_an_idempotent_request_the_sqlite_database_failed_is_sent_once_more_and_no_other(tmp_path):
    """A request caught in a cycle of SQLite locks fails with 500 "Database error" after the lock wait, its
    transaction rolled back: the embedded Airflow's client sends a GET, PUT, PATCH or DELETE once more, never
    a POST (a DAG run triggered twice), nor another error."""
    seen: list[str] = []
    answers: dict = {}
    database_error = (500, {"detail": {"reason": "Database error", "statement": "hidden"}})
    with _fake_airflow(tmp_path, answers, seen) as af:
        answers["/api/v2/dags/d"] = [database_error, (200, {"is_paused": False})]
        assert af.api("PATCH", "/dags/d", json={"is_paused": False}) == {"is_paused": False}
        answers["/api/v2/dags/d/dagRuns"] = [database_error]
        with pytest.raises(local.AirflowApiError) as refused:
            af.api("POST", "/dags/d/dagRuns", json={"logical_date": None})
        assert refused.value.status == 500
        answers["/api/v2/dags/e"] = [(500, {"detail": "something else"})]
        with pytest.raises(local.AirflowApiError):
            af.api("GET", "/dags/e")
    assert [s for s in seen if s != "GET /auth/token"] == [
        "PATCH /api/v2/dags/d", "PATCH /api/v2/dags/d", "POST /api/v2/dags/d/dagRuns", "GET /api/v2/dags/e"]


def test_a_dag_never_parsed_says_what_the_api_answered_and_how_the_dag_processors_log_ends(tmp_path):
    """Waiting for a DAG the dag-processor never writes ends at the bound with the api-server's last answer
    and the end of the dag-processor's log (but its bundle refreshes, one every few seconds); it ends at once
    when the dag-processor has exited, with its exit code and its log's end."""
    seen: list[str] = []
    answers = {"/api/v2/importErrors": lambda: (200, {"import_errors": [], "total_entries": 0}),
               "/api/v2/dags/mop_late": lambda: (404, {"detail": "The Dag with ID: `mop_late` was not found"})}
    with _fake_airflow(tmp_path, answers, seen) as af:
        (af.home / "logs").mkdir(parents=True)
        (af.home / "logs" / "dag-processor.log").write_text(
            "[info] Bulk-writing dags to db count=1\n[error] (sqlite3.OperationalError) database is locked\n"
            + "[info] Refreshing bundle dags-folder\n[info] Searching for files in dags-folder\n" * 50)
        af.processes["dag-processor"] = subprocess.Popen(["sleep", "60"])
        try:
            with pytest.raises(TimeoutError) as late:
                af.wait_for_dag("mop_late", timeout=2)
        finally:
            af.processes["dag-processor"].kill()
            af.processes["dag-processor"].wait()
        message = str(late.value)
        assert "DAG mop_late was not parsed within 2s" in message and "404" in message
        assert "database is locked" in message and "Bulk-writing" in message and "Refreshing bundle" not in message
        with pytest.raises(RuntimeError) as exited:
            af.wait_for_dag("mop_late", timeout=60)
        # its exit code and its log's end: a CI log says why it died, not only a path on that machine's disk
        message = str(exited.value)
        assert "the dag-processor exited (exit code -9) while mop_late waited to be parsed" in message
        assert "database is locked" in message and "Refreshing bundle" not in message
    assert seen.count("GET /api/v2/dags/mop_late") >= 2


def test_waiting_for_a_dag_fails_on_import_errors_of_files_that_exist_in_the_folder_asked_about(tmp_path):
    """An import error of a file deleted while it was parsed (the dag-processor's "Failed to write serialized
    DAG": FileNotFoundError) stays until its next listing and says nothing about the DAG waited for; nor does
    one of another folder's file, where a folder is given. One of an existing file of that folder fails the
    wait at once, with its stack trace."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for folder in (mine, theirs):
        folder.mkdir()
        (folder / "broken.py").write_text("raise ValueError('broken')\n")
    errors = [{"filename": "gone/deleted.py", "stack_trace": "FileNotFoundError: gone/deleted.py"},
              {"filename": "theirs/broken.py", "stack_trace": "ValueError: theirs"}]
    answers = {"/api/v2/importErrors": lambda: (200, {"import_errors": errors, "total_entries": len(errors)}),
               "/api/v2/dags/mop_mine": lambda: (200, {"dag_id": "mop_mine"})}
    with _fake_airflow(tmp_path, answers, []) as af:
        af.wait_for_dag("mop_mine", timeout=5, folder=mine)  # neither error is of an existing file of mine/
        with pytest.raises(RuntimeError, match="ValueError: theirs"):
            af.wait_for_dag("mop_mine", timeout=5)  # any folder: theirs/broken.py exists
        errors.append({"filename": str(mine / "broken.py"), "stack_trace": "ValueError: mine"})
        with pytest.raises(RuntimeError, match="ValueError: mine") as failed:
            af.wait_for_dag("mop_mine", timeout=5, folder=mine)
        assert "theirs" not in str(failed.value)
