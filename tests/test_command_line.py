"""The command line as a user drives it: `mop-airflow up` on their own DAG folder, a run triggered
through the REST API and one through `airflow dags trigger --conf` (typed trigger-form fields),
`status`, `report`, then `airflow dags test` on the same DAG with no flags. Real processes: Airflow's api-server,
scheduler and dag-processor started by `up`, stopped by Ctrl-C (SIGINT). `up` stopped half-way through a run
(SIGTERM) starts again at once and the run ends as an undisturbed one; meanwhile `status --once`, `report`
and `runs` read the runs from the store with Airflow stopped.

The file's tests share one `up` (:class:`UpSession`: one home, one DAG folder with both their DAGs), started
by the first test that needs it running and stopped by the first that needs it stopped: a start of `up` is
an Airflow start (45 s on a quiet 2-core machine), and the tests each made their own before. Each test still
runs alone: it starts or stops `up` as it needs."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mop_airflow.deployment.local import airflow_env, free_port
from mop_airflow.hooks.rest import AirflowAPI
from mop_airflow.monitor.run_status import find_run
from mop_airflow.cli.main import OK, UNAVAILABLE, USAGE, _port_free, main
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import dag_file
from tests.test_end_to_end import tiny_spec, write_digits

DAG_ID = "my_digits"
RESUMED = "my_digits_resumed"


def cli(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mop_airflow.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float) -> list[str]:
    lines: list[str] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"no {text!r} from `mop-airflow up` (exit {proc.poll()}):\n{''.join(lines)}")


def _unpause_when_parsed(api: AirflowAPI, dag_id: str) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            api.get(f"/dags/{dag_id}")
            break
        except RuntimeError:
            time.sleep(1)
    api.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})


class UpSession:
    """`mop-airflow up` on a DAG folder holding this file's two DAGs, in one home, started and stopped as a
    user does: ``DAG_ID`` (1 iteration, 2 slots a shard, its store under ``root``, pools checked) and
    ``RESUMED`` (20 hops of 20 passes, the default store ``<home>/store``)."""

    def __init__(self, root: Path):
        self.root, self.folder, self.home = root, root / "my_dags", root / "home"
        self.folder.mkdir()
        write_digits(root / "digits.parquet")
        spec = tiny_spec(root / "digits.parquet", f"file://{root / 'store'}", iterations=1, slots_per_shard=2)
        spec["search"]["space"]["params"]["learning_rate"] = [3e-3, 1e-2]
        # pools="check": the run would fail at once if `up` had not created the pools
        dag_file(self.folder, DAG_ID, spec, pools="check")
        # 2 configurations x 2 shards x 5 iterations = 20 hops of 20 passes each: in a warm train task a pass
        # of this tiny model takes a few hundredths of a second, and the run must still be training when
        # Airflow stops, which happens as soon as its first hop is committed (19 hops to go)
        spec = tiny_spec(root / "digits.parquet", None, iterations=5, epochs_per_hop=20)
        del spec["store"]  # the default store, <home>/store: where the commands look when Airflow is away
        spec["search"]["space"]["params"]["learning_rate"] = [3e-3, 1e-2]
        dag_file(self.folder, RESUMED, spec)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "MOP_HOME": str(self.home)}
        self.env.pop("MOP_API_URL", None)
        self.env.pop("MOP_AIRFLOW_API_URL", None)  # its earlier name, still read
        self.proc: subprocess.Popen | None = None
        self.said = ""  # what the running `up` printed until it was ready

    def start(self) -> str:
        """Start `up` (at once after a stop: the stopped server's connections still wait in TIME_WAIT)."""
        assert self.proc is None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mop_airflow.cli.main", "up", "--dags-folder", str(self.folder),
             "--port", str(self.port), "--home", str(self.home)],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            # a test run started in the background inherits SIGINT ignored, and so would `up`:
            # give it the terminal's Ctrl-C, which these tests send
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.said = "".join(_wait_for_line(self.proc, "Airflow UI:", timeout=240))
        return self.said

    def running(self) -> "UpSession":
        if self.proc is None:
            self.start()
        return self

    def stop(self, sig: int) -> str:
        """Stop `up` with ``sig``; what it printed from then on. Everything it started is gone after a
        Ctrl-C: the port is free again, no process is left in its session, and the API's address file is removed."""
        up, self.proc = self.proc, None
        up.send_signal(sig)
        rest, _ = up.communicate(timeout=90)
        if sig == signal.SIGINT:
            assert up.returncode == OK, rest
            assert "stopped Airflow" in rest
            with pytest.raises(ProcessLookupError):
                os.killpg(up.pid, 0)
            assert not (self.home / "airflow" / "api_url").exists()
        return rest


@pytest.fixture(scope="module")
def up_session(tmp_path_factory):
    session = UpSession(tmp_path_factory.mktemp("up"))
    yield session
    if session.proc is not None:
        session.stop(signal.SIGINT)


@pytest.mark.integration
@pytest.mark.slow
def test_up_status_and_report_on_your_own_dag_folder(up_session, tmp_path):
    session, env = up_session.running(), up_session.env
    assert "mop_shard_0 (2 slot(s)), mop_shard_1 (2 slot(s))" in session.said
    assert f"http://127.0.0.1:{session.port}" in session.said

    with AirflowAPI(session.url) as api:
        pools = {p["name"]: p["slots"] for p in api.paged("/pools", "pools")}
        assert pools["mop_shard_0"] == pools["mop_shard_1"] == 2
        _unpause_when_parsed(api, DAG_ID)
        # a conf naming one typed field of the trigger form, through the REST API
        run_id = api.call("POST", f"/dags/{DAG_ID}/dagRuns",
                          json={"logical_date": None, "conf": {"batch_size": [64]}})["dag_run_id"]

    # `status` finds the Airflow that `up` runs from the home folder, follows the run to its end
    status = cli("status", DAG_ID, "--interval", "1", env=env)
    assert status.returncode == OK, status.stdout + status.stderr
    last = status.stdout.strip().splitlines()[-1]
    assert last.startswith("success: model hops 4/4, iteration 1/1, best val_accuracy ")
    assert "validating and sharding the data" in status.stdout or "resolving the run" in status.stdout

    once = cli("status", DAG_ID, run_id, "--once", env=env)
    assert once.returncode == OK and once.stdout.strip() == last

    report = cli("report", DAG_ID, "--out", str(tmp_path / "report"), env=env)
    assert report.returncode == OK, report.stderr
    board = json.loads((tmp_path / "report" / "leaderboard.json").read_text())
    assert [r["rank"] for r in board["leaderboard"]] == [1, 2]
    for row in board["leaderboard"]:
        assert row["status"] == "finished"
        assert f"{row['config_id']:<12} {row['val_accuracy']:>12.4f}" in report.stdout
    for png in ("learning_curves.png", "hop_timeline.png"):
        assert (tmp_path / "report" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with AirflowAPI(session.url) as api:
        first = find_run(api, DAG_ID, run_id).record
        assert [(c["optimizer_params"]["learning_rate"], c["batch_size"]) for c in first.configs] == [
            (3e-3, 64), (1e-2, 64)]
    # the same kind of conf through Airflow's own CLI
    trigger = subprocess.run([str(Path(sys.executable).with_name("airflow")), "dags", "trigger", DAG_ID,
                              "--conf", json.dumps({"learning_rate": [0.01]})],
                             env=airflow_env(session.home / "airflow", session.folder, session.port,
                                             {"MOP_HOME": str(session.home)}),
                             capture_output=True, text=True, timeout=120)
    assert trigger.returncode == 0, trigger.stderr[-3000:]
    second = cli("status", DAG_ID, "--interval", "1", env=env)
    assert second.returncode == OK and "success: model hops 2/2" in second.stdout, second.stdout + second.stderr
    with AirflowAPI(session.url) as api:
        latest = find_run(api, DAG_ID)
        assert latest.run_id != run_id
        assert [(c["optimizer_params"]["learning_rate"], c["batch_size"]) for c in latest.record.configs] == [
            (1e-2, 32)]

    missing = cli("status", "no_such_dag", "--once", env=env)
    assert missing.returncode == UNAVAILABLE and "404" in missing.stderr


def test_commands_say_what_is_wrong_with_exit_codes_scripts_can_rely_on(tmp_path, capsys):
    environment = dict(os.environ)
    assert main(["pools", "sync"]) == USAGE
    assert "--shards N" in capsys.readouterr().err
    assert main(["pools", "sync", "--dags-folder", str(tmp_path / "nope")]) == USAGE
    assert main(["up", "--dags-folder", str(tmp_path / "nope")]) == USAGE
    assert "no such folder" in capsys.readouterr().err
    # nothing listens on this port: the status of a run cannot be known
    assert main(["status", "some_dag", "--once", "--api-url", f"http://127.0.0.1:{free_port()}"]) == UNAVAILABLE
    assert "Airflow REST API at http://127.0.0.1:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["status"])
    assert usage.value.code == USAGE
    assert dict(os.environ) == environment  # in-process calls leave the environment (and later tasks' logs) alone


def test_the_port_check_lets_a_stopped_servers_waiting_connections_be_but_refuses_a_listener():
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    assert not _port_free(port)  # something really listens: `up` must refuse
    client = socket.create_connection(("127.0.0.1", port))
    server, _ = listener.accept()
    server.close()  # the server closes first, as a stopped api-server does: its end waits in TIME_WAIT
    client.close()
    listener.close()
    with socket.socket() as plain, pytest.raises(OSError):  # the old check's bind: refused for a minute
        plain.bind(("127.0.0.1", port))
    assert _port_free(port)  # uvicorn binds with SO_REUSEADDR, and so does the check now


def _board(store: Store, run_id: str) -> list[tuple[str, float, float]]:
    rows = store.read_json(RunLayout(store, RESUMED, run_id).report_uri("leaderboard.json"))["leaderboard"]
    return [(r["config_id"], r["val_accuracy"], r["val_loss"]) for r in rows]


@pytest.mark.integration
@pytest.mark.slow
def test_up_stopped_half_way_starts_again_at_once_and_runs_are_read_from_the_store_while_airflow_is_stopped(
        up_session, tmp_path):
    session, env = up_session.running(), up_session.env
    home, url, root = session.home, session.url, f"file://{session.home / 'store'}"
    store = Store(root)

    try:
        with AirflowAPI(url) as api:
            _unpause_when_parsed(api, RESUMED)
            disturbed = api.call("POST", f"/dags/{RESUMED}/dagRuns", json={"logical_date": None})["dag_run_id"]
        hops = RunLayout(store, RESUMED, disturbed).hops_glob
        deadline = time.time() + 300
        while not store.glob(hops) and time.time() < deadline:
            time.sleep(0.5)
        assert store.glob(hops), "no hop finished within 300 s"
    finally:
        session.stop(signal.SIGTERM)  # as `kill` or a closing terminal does
    done = len(store.glob(hops))
    assert 1 <= done < 20 and not store.exists(RunLayout(store, RESUMED, disturbed).report_uri("summary.json"))

    # Airflow is stopped: the store says what it can, and which source was read
    status = cli("status", RESUMED, "--once", "--api-url", url, env=env)
    assert status.returncode == OK, status.stderr
    assert f"Airflow not reachable at {url}; read the run from the store at {root}" in status.stderr
    assert status.stdout.startswith("unfinished (no report yet: training, stopped, or failed before its report")
    assert f"model hops {done}/20, iteration " in status.stdout
    listed = cli("runs", RESUMED, "--store", str(home / "store"), env=env)
    assert listed.returncode == OK and listed.stderr == ""  # --store: Airflow not asked, nothing to say about it
    assert listed.stdout.splitlines()[2].split() == [disturbed, "unfinished", "-", "-"]

    session.start()  # at once: the stopped server's connections still wait in TIME_WAIT
    try:
        resumed = cli("status", RESUMED, disturbed, "--interval", "2", env=env)
        assert resumed.returncode == OK, resumed.stdout + resumed.stderr
        with AirflowAPI(url) as api:
            undisturbed = api.call("POST", f"/dags/{RESUMED}/dagRuns", json={"logical_date": None})["dag_run_id"]
        assert cli("status", RESUMED, undisturbed, "--interval", "2", env=env).returncode == OK
        online = cli("runs", RESUMED, env=env)
    finally:
        session.stop(signal.SIGINT)  # Ctrl-C: everything `up` started is gone
    first, second = _board(store, disturbed), _board(store, undisturbed)
    assert [c for c, _, _ in first] == [c for c, _, _ in second]
    for (_, acc_a, loss_a), (_, acc_b, loss_b) in zip(first, second):
        assert acc_a == pytest.approx(acc_b, abs=1e-6) and loss_a == pytest.approx(loss_b, rel=1e-5)
    winner, accuracy = first[0][0], f"val_accuracy={first[0][1]:.4f}"
    assert online.returncode == OK and f"Runs of {RESUMED} (Airflow at {url})" in online.stdout
    assert [line.split() for line in online.stdout.splitlines()[2:]] == [
        [undisturbed, "success", winner, accuracy], [disturbed, "success", winner, accuracy]]

    # stopped again: a finished run's report and the DAG's runs, from the store alone
    report = cli("report", RESUMED, disturbed, "--store", str(home / "store"), "--out", str(tmp_path / "r"), env=env)
    assert report.returncode == OK, report.stderr
    assert report.stdout.startswith(f"{RESUMED} / {disturbed}: finished\n")
    assert json.loads((tmp_path / "r" / "leaderboard.json").read_text()) == store.read_json(
        RunLayout(store, RESUMED, disturbed).report_uri("leaderboard.json"))
    offline = cli("runs", RESUMED, "--api-url", url, env=env)
    assert offline.returncode == OK
    assert f"Airflow not reachable at {url}; read the runs from the store at {root}" in offline.stderr
    assert [line.split() for line in offline.stdout.splitlines()[2:]] == [
        [undisturbed, "finished", winner, accuracy], [disturbed, "finished", winner, accuracy]]
    once = cli("status", RESUMED, disturbed, "--once", "--store", str(home / "store"), env=env)
    assert once.stdout.startswith("finished: model hops 20/20, iteration 5/5, best val_accuracy ")
    missing = cli("report", RESUMED, "no_such_run", "--api-url", url, env=env)
    assert missing.returncode == UNAVAILABLE and "has no run 'no_such_run' of DAG" in missing.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_airflow_dags_test_with_no_flag_runs_your_dag_where_up_ran_it(up_session):
    """The standard way to try a DAG, with no flag, on the DAG `up` served (and stopped: no REST API runs
    now, and pools are not used there)."""
    session = up_session
    if session.proc is not None:
        session.stop(signal.SIGINT)
    runs = session.root / "store" / DAG_ID
    before = {r.name for r in runs.iterdir() if r.is_dir() and r.name != "shards"} if runs.exists() else set()
    test_env = airflow_env(session.home / "airflow", session.folder, session.port, {"MOP_HOME": str(session.home)})
    dags_test = subprocess.run([str(Path(sys.executable).with_name("airflow")), "dags", "test", DAG_ID],
                               env=test_env, capture_output=True, text=True, timeout=600)
    assert dags_test.returncode == 0, dags_test.stdout[-3000:] + dags_test.stderr[-3000:]
    assert "pools are not used; not checked" in dags_test.stdout + dags_test.stderr
    after = [r for r in runs.iterdir() if r.is_dir() and r.name != "shards"]
    [new] = [r for r in after if r.name not in before]
    board = json.loads((new / "report" / "leaderboard.json").read_text())
    assert [(r["rank"], r["status"]) for r in board["leaderboard"]] == [(1, "finished"), (2, "finished")]
    assert all((r / "report" / "leaderboard.json").exists() for r in after)


def test_the_embedded_scheduler_loops_every_0_2_s_when_idle_unless_the_environment_says_otherwise(tmp_path,
                                                                                                    monkeypatch):
    key = "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"
    monkeypatch.delenv(key, raising=False)
    assert airflow_env(tmp_path / "airflow", tmp_path, 8080)[key] == "0.2"
    monkeypatch.setenv(key, "1")
    assert airflow_env(tmp_path / "airflow", tmp_path, 8080)[key] == "1"
