"""The command line as a user drives it: `mop-airflow up` on their own DAG folder, a run triggered
through the REST API and one through `airflow dags trigger --conf` (typed trigger-form fields),
`status`, `report`, then `airflow dags test` on the same DAG with no flags. Real processes: Airflow's api-server,
scheduler and dag-processor started by `up`, stopped by Ctrl-C (SIGINT). `up` stopped half-way through a run
(SIGTERM) starts again at once and the run ends as an undisturbed one; meanwhile `status --once`, `report`
and `runs` read the runs from the store with Airflow stopped."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mop_airflow.airflow.local import airflow_env, free_port
from mop_airflow.hooks.rest import AirflowAPI
from mop_airflow.airflow.run_status import find_run
from mop_airflow.cli.main import OK, UNAVAILABLE, USAGE, _port_free, main
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import dag_file
from tests.test_end_to_end import tiny_spec, write_digits

DAG_ID = "my_digits"


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


def _up(folder: Path, home: Path, port: int, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mop_airflow.cli.main", "up", "--dags-folder", str(folder),
                             "--port", str(port), "--home", str(home)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            # a test run started in the background inherits SIGINT ignored, and so would `up`:
                            # give it the terminal's Ctrl-C, which these tests send
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _unpause_when_parsed(api: AirflowAPI) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            api.get(f"/dags/{DAG_ID}")
            break
        except RuntimeError:
            time.sleep(1)
    api.call("PATCH", f"/dags/{DAG_ID}", json={"is_paused": False})


@pytest.mark.integration
@pytest.mark.slow
def test_up_status_report_and_dags_test_on_your_own_dag_folder(tmp_path):
    folder = tmp_path / "my_dags"
    folder.mkdir()
    write_digits(tmp_path / "digits.parquet")
    spec = tiny_spec(tmp_path / "digits.parquet", f"file://{tmp_path / 'store'}", iterations=1, slots_per_shard=2)
    spec["search"]["space"]["params"]["learning_rate"] = [3e-3, 1e-2]
    # pools="check": the run would fail at once if `up` had not created the pools
    dag_file(folder, DAG_ID, spec, pools="check")
    home, port = tmp_path / "home", free_port()
    env = {**os.environ, "MOP_AIRFLOW_HOME": str(home)}
    env.pop("MOP_AIRFLOW_API_URL", None)
    up = _up(folder, home, port, env)
    try:
        lines = _wait_for_line(up, "Airflow UI:", timeout=240)
        out = "".join(lines)
        assert "mop_shard_0 (2 slot(s)), mop_shard_1 (2 slot(s))" in out
        assert f"http://127.0.0.1:{port}" in out

        with AirflowAPI(f"http://127.0.0.1:{port}") as api:
            pools = {p["name"]: p["slots"] for p in api.paged("/pools", "pools")}
            assert pools["mop_shard_0"] == pools["mop_shard_1"] == 2
            _unpause_when_parsed(api)
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

        with AirflowAPI(f"http://127.0.0.1:{port}") as api:
            first = find_run(api, DAG_ID, run_id).record
            assert [(c["optimizer_params"]["learning_rate"], c["batch_size"]) for c in first.configs] == [
                (3e-3, 64), (1e-2, 64)]
        # the same kind of conf through Airflow's own CLI
        trigger = subprocess.run([str(Path(sys.executable).with_name("airflow")), "dags", "trigger", DAG_ID,
                                  "--conf", json.dumps({"learning_rate": [0.01]})],
                                 env=airflow_env(home / "airflow", folder, port, {"MOP_AIRFLOW_HOME": str(home)}),
                                 capture_output=True, text=True, timeout=120)
        assert trigger.returncode == 0, trigger.stderr[-3000:]
        second = cli("status", DAG_ID, "--interval", "1", env=env)
        assert second.returncode == OK and "success: model hops 2/2" in second.stdout, second.stdout + second.stderr
        with AirflowAPI(f"http://127.0.0.1:{port}") as api:
            latest = find_run(api, DAG_ID)
            assert latest.run_id != run_id
            assert [(c["optimizer_params"]["learning_rate"], c["batch_size"]) for c in latest.record.configs] == [
                (1e-2, 32)]

        missing = cli("status", "no_such_dag", "--once", env=env)
        assert missing.returncode == UNAVAILABLE and "404" in missing.stderr
    finally:
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=60)
    assert up.returncode == OK, rest
    assert "stopped Airflow" in rest
    # everything `up` started is gone: the port is free again and no process is left in its session
    with pytest.raises(ProcessLookupError):
        os.killpg(up.pid, 0)
    assert not (home / "airflow" / "api_url").exists()

    # the standard way to try a DAG, with no flag: no REST API runs now, and pools are not used there
    test_env = airflow_env(home / "airflow", folder, port, {"MOP_AIRFLOW_HOME": str(home)})
    dags_test = subprocess.run([str(Path(sys.executable).with_name("airflow")), "dags", "test", DAG_ID],
                               env=test_env, capture_output=True, text=True, timeout=600)
    assert dags_test.returncode == 0, dags_test.stdout[-3000:] + dags_test.stderr[-3000:]
    assert "pools are not used; not checked" in dags_test.stdout + dags_test.stderr
    runs = [r for r in (tmp_path / "store" / DAG_ID).iterdir() if r.is_dir() and r.name != "shards"]
    assert len(runs) == 3 and all((r / "report" / "leaderboard.json").exists() for r in runs)


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


def _stop(up: subprocess.Popen, sig: int) -> str:
    up.send_signal(sig)
    rest, _ = up.communicate(timeout=90)
    return rest


def _board(store: Store, run_id: str) -> list[tuple[str, float, float]]:
    rows = store.read_json(RunLayout(store, DAG_ID, run_id).report_uri("leaderboard.json"))["leaderboard"]
    return [(r["config_id"], r["val_accuracy"], r["val_loss"]) for r in rows]


@pytest.mark.integration
@pytest.mark.slow
def test_up_stopped_half_way_starts_again_at_once_and_runs_are_read_from_the_store_while_airflow_is_stopped(tmp_path):
    folder = tmp_path / "dags"
    folder.mkdir()
    write_digits(tmp_path / "digits.parquet")
    # 2 configurations x 2 shards x 5 iterations = 20 hops of 20 passes each: in a warm train task a pass
    # of this tiny model takes a few hundredths of a second, and the run must still be training when
    # Airflow stops, which happens as soon as its first hop is committed (19 hops to go)
    spec = tiny_spec(tmp_path / "digits.parquet", None, iterations=5, epochs_per_hop=20)
    del spec["store"]  # the default store, <home>/store: where the commands look when Airflow is away
    spec["search"]["space"]["params"]["learning_rate"] = [3e-3, 1e-2]
    dag_file(folder, DAG_ID, spec)
    home, port = tmp_path / "home", free_port()
    url, root = f"http://127.0.0.1:{port}", f"file://{home / 'store'}"
    env = {**os.environ, "MOP_AIRFLOW_HOME": str(home)}
    env.pop("MOP_AIRFLOW_API_URL", None)
    store = Store(root)

    up = _up(folder, home, port, env)
    try:
        _wait_for_line(up, "Airflow UI:", timeout=240)
        with AirflowAPI(url) as api:
            _unpause_when_parsed(api)
            disturbed = api.call("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None})["dag_run_id"]
        hops = RunLayout(store, DAG_ID, disturbed).hops_glob
        deadline = time.time() + 300
        while not store.glob(hops) and time.time() < deadline:
            time.sleep(0.5)
        assert store.glob(hops), "no hop finished within 300 s"
    finally:
        _stop(up, signal.SIGTERM)  # as `kill` or a closing terminal does
    done = len(store.glob(hops))
    assert 1 <= done < 20 and not store.exists(RunLayout(store, DAG_ID, disturbed).report_uri("summary.json"))

    # Airflow is stopped: the store says what it can, and which source was read
    status = cli("status", DAG_ID, "--once", "--api-url", url, env=env)
    assert status.returncode == OK, status.stderr
    assert f"Airflow not reachable at {url}; read the run from the store at {root}" in status.stderr
    assert status.stdout.startswith("unfinished (no report yet: training, stopped, or failed before its report")
    assert f"model hops {done}/20, iteration " in status.stdout
    listed = cli("runs", DAG_ID, "--store", str(home / "store"), env=env)
    assert listed.returncode == OK and listed.stderr == ""  # --store: Airflow not asked, nothing to say about it
    assert listed.stdout.splitlines()[2].split() == [disturbed, "unfinished", "-", "-"]

    up = _up(folder, home, port, env)  # at once: the stopped server's connections still wait in TIME_WAIT
    try:
        _wait_for_line(up, "Airflow UI:", timeout=240)
        resumed = cli("status", DAG_ID, disturbed, "--interval", "2", env=env)
        assert resumed.returncode == OK, resumed.stdout + resumed.stderr
        with AirflowAPI(url) as api:
            undisturbed = api.call("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None})["dag_run_id"]
        assert cli("status", DAG_ID, undisturbed, "--interval", "2", env=env).returncode == OK
        online = cli("runs", DAG_ID, env=env)
    finally:
        rest = _stop(up, signal.SIGINT)
    assert "stopped Airflow" in rest
    first, second = _board(store, disturbed), _board(store, undisturbed)
    assert [c for c, _, _ in first] == [c for c, _, _ in second]
    for (_, acc_a, loss_a), (_, acc_b, loss_b) in zip(first, second):
        assert acc_a == pytest.approx(acc_b, abs=1e-6) and loss_a == pytest.approx(loss_b, rel=1e-5)
    winner, accuracy = first[0][0], f"val_accuracy={first[0][1]:.4f}"
    assert online.returncode == OK and f"Runs of {DAG_ID} (Airflow at {url})" in online.stdout
    assert [line.split() for line in online.stdout.splitlines()[2:]] == [
        [undisturbed, "success", winner, accuracy], [disturbed, "success", winner, accuracy]]

    # stopped again: a finished run's report and the DAG's runs, from the store alone
    report = cli("report", DAG_ID, disturbed, "--store", str(home / "store"), "--out", str(tmp_path / "r"), env=env)
    assert report.returncode == OK, report.stderr
    assert report.stdout.startswith(f"{DAG_ID} / {disturbed}: finished\n")
    assert json.loads((tmp_path / "r" / "leaderboard.json").read_text()) == store.read_json(
        RunLayout(store, DAG_ID, disturbed).report_uri("leaderboard.json"))
    offline = cli("runs", DAG_ID, "--api-url", url, env=env)
    assert offline.returncode == OK
    assert f"Airflow not reachable at {url}; read the runs from the store at {root}" in offline.stderr
    assert [line.split() for line in offline.stdout.splitlines()[2:]] == [
        [undisturbed, "finished", winner, accuracy], [disturbed, "finished", winner, accuracy]]
    once = cli("status", DAG_ID, disturbed, "--once", "--store", str(home / "store"), env=env)
    assert once.stdout.startswith("finished: model hops 20/20, iteration 5/5, best val_accuracy ")
    missing = cli("report", DAG_ID, "no_such_run", "--api-url", url, env=env)
    assert missing.returncode == UNAVAILABLE and "has no run 'no_such_run' of DAG" in missing.stderr


def test_the_embedded_scheduler_loops_every_0_2_s_when_idle_unless_the_environment_says_otherwise(tmp_path,
                                                                                                    monkeypatch):
    key = "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"
    monkeypatch.delenv(key, raising=False)
    assert airflow_env(tmp_path / "airflow", tmp_path, 8080)[key] == "0.2"
    monkeypatch.setenv(key, "1")
    assert airflow_env(tmp_path / "airflow", tmp_path, 8080)[key] == "1"
