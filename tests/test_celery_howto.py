"""docs/how-to/celery.md, followed step by step: the demo DAG on Celery workers from an empty machine.

PostgreSQL (a database created for this test and dropped after it) and Redis on loopback, nothing
else. The steps are the page's: `mop-airflow celery config` writes the environment file every
process loads, `mop-airflow example-data`, `airflow db migrate`, the api-server, scheduler,
dag-processor and triggerer, one worker per shard queue and one for the default queue (each with
its --celery-hostname, its log-server port and the shared MOP_HOME), `mop-airflow pools
sync`, `airflow dags unpause` and `airflow dags trigger`, `mop-airflow report`; the tasks sign in
with the login the file names. The page's commands are checked against the ones run here.

Two workers die during the run, by SIGKILL of the worker and every process it started: shard 1's
while a task is queued to it (its pool process is stopped first, so the task is taken and never
started: the message stays unacknowledged in Redis), and shard 2's while a task runs on it. While
the first waits, `mop-airflow status` must name it and since when. Each task must run again on its
queue's restarted worker within the bound the page states, and the leaderboard must equal the
embedded `mop-airflow demo`'s to every digit.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mop_airflow.deployment import celery_config
from mop_airflow.deployment.local import CeleryWorker, LocalAirflow, free_port, throwaway_postgres
from mop_airflow.monitor.run_status import WAITING_AFTER_S
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from mop_airflow.slots.commits import rewritten_after_marked
from tests.test_distributed import PG, REDIS, _reachable, _skip_or_fail

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

ROOT = Path(__file__).resolve().parents[1]
HOWTO = ROOT / "docs" / "how-to" / "celery.md"
DAG_ID = "mop_mnist1d"
SHARDS = 4
REDIS_DB = 8  # not test_distributed's: under xdist both may run at once, and the queue names are the same
MARGIN_S = 60  # a 2-core machine running five workers, four services, this test and another test file (CI saw 148 s)


def bash_block(path: Path) -> str:
    """The page's first bash block: the steps."""
    return re.search(r"```bash\n(.*?)```", path.read_text(), re.DOTALL).group(1)


def source(env_file: Path) -> dict[str, str]:
    """The variables `set -a; . FILE; set +a` gives a shell, as the page says to load the file."""
    out = subprocess.run(["bash", "-c", 'set -a; . "$0"; set +a; env -0', str(env_file)],
                         env={"PATH": os.environ["PATH"]}, capture_output=True, check=True).stdout.decode()
    loaded = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    return {k: v for k, v in loaded.items() if k in celery_config.read_env_file(env_file)}


def utc(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def tis_on(af, run_id: str, queue: str, state: str) -> list[dict]:
    return [ti for ti in af.task_instances(DAG_ID, run_id) if ti["queue"] == queue and ti["state"] == state]


def ti_now(af, run_id: str, key: tuple[str, int]) -> dict:
    return next(t for t in af.task_instances(DAG_ID, run_id) if (t["task_id"], t["map_index"]) == key)


def unacked_queues(broker: str) -> list[str]:
    """The queues of the messages a worker took and never acknowledged (kombu keeps them in ``unacked``)."""
    import redis  # noqa: PLC0415

    client = redis.Redis.from_url(broker)
    return [json.loads(raw)[2] for raw in client.hvals("unacked")]


def kill_with_task_queued(af, run_id: str, worker: CeleryWorker, broker: str, timeout: float = 300):
    """Stop ``worker``'s processes but its main one, so the next task it takes is never started; when a
    task waits queued to it and its message is unacknowledged in Redis, SIGKILL the worker and start
    it again. Returns (task key, kill time)."""
    import psutil  # noqa: PLC0415

    queue = worker.queues[0]
    for child in psutil.Process(af.processes[f"worker-{worker.name}"].pid).children(recursive=True):
        child.suspend()
    deadline = time.time() + timeout
    while time.time() < deadline:
        queued = tis_on(af, run_id, queue, "queued")
        if queued and queue in unacked_queues(broker):
            key = (queued[0]["task_id"], queued[0]["map_index"])
            killed = time.time()
            af.kill(f"worker-{worker.name}")
            af.start_worker(worker)
            return key, killed
        time.sleep(0.5)
    raise TimeoutError(f"no task was taken by the worker of {queue} within {timeout}s")


def kill_with_task_running(af, run_id: str, worker: CeleryWorker, timeout: float = 600):
    """SIGKILL ``worker`` while a task has run on it for a second, and start it again; a task that
    ended between the poll and the kill was not interrupted, and the kill is repeated on a later one.
    Returns (task key, kill time)."""
    queue = worker.queues[0]
    deadline = time.time() + timeout
    spared = set()
    while time.time() < deadline:
        for ti in tis_on(af, run_id, queue, "running"):
            key = (ti["task_id"], ti["map_index"])
            if key in spared or time.time() - utc(ti["start_date"]) < 1:
                continue
            killed = time.time()
            af.kill(f"worker-{worker.name}")
            af.start_worker(worker)
            time.sleep(2)  # a success reported just before the kill has landed by now
            if ti_now(af, run_id, key)["state"] == "success":
                spared.add(key)
                break
            return key, killed
        time.sleep(0.5)
    raise TimeoutError(f"no task ran on {queue} long enough to be killed")


def leaderboard(store_root: Path, run_id: str | None = None) -> list[dict]:
    """A run's leaderboard from a file store: ``run_id``'s, or the only run's."""
    store = Store(f"file://{store_root}")
    if run_id is None:
        [path] = (store_root / DAG_ID).glob("*/report/leaderboard.json")
        return json.loads(path.read_text())
    return store.read_json(RunLayout(store, DAG_ID, run_id).report_uri("leaderboard.json"))


def start_demo_in(folder: Path) -> subprocess.Popen:
    """`mop-airflow demo` in ``folder`` (its home, DAGs and log), without this deployment's Airflow settings."""
    demo_dags = folder / "demo_dags"
    demo_dags.mkdir()
    shutil.copy(ROOT / "dags" / f"{DAG_ID}.py", demo_dags)
    demo_env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_"))}
    with open(folder / "demo.log", "w") as log:
        return subprocess.Popen([str(Path(sys.executable).with_name("mop-airflow")), "demo", "--home",
                                 str(folder / "demo"), "--dags-folder", str(demo_dags)],
                                env=demo_env, stdout=log, stderr=subprocess.STDOUT)


def stop_demo(demo: subprocess.Popen) -> None:
    if demo.poll() is None:
        demo.terminate()  # the demo stops its Airflow on SIGTERM
        try:
            demo.wait(120)
        except subprocess.TimeoutExpired:
            demo.kill()


@contextlib.contextmanager
def run_demo(folder: Path):
    """Starts `mop-airflow demo` in ``folder``; yields a function that waits for it and returns its
    leaderboard (the same each call). Stopped (with its Airflow) if the caller ends before it does."""
    demo, board = start_demo_in(folder), []

    def leaderboard_of_demo() -> dict:
        if not board:
            assert demo.wait(900) == 0, (folder / "demo.log").read_text()[-6000:]
            board.append(leaderboard(folder / "demo" / "store"))
        return board[0]

    try:
        yield leaderboard_of_demo
    finally:
        stop_demo(demo)


@pytest.fixture
def start_demo(tmp_path):
    """Starts `mop-airflow demo` in a home of its own, without this deployment's Airflow settings;
    stopped (with its Airflow) if the test ends before it does."""
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        started.append(start_demo_in(tmp_path))
        return started[-1]

    yield start
    for demo in started:
        stop_demo(demo)


@pytest.mark.slow
def test_the_howto_on_celery_gives_the_demo_leaderboard_and_a_lost_worker_costs_seconds(tmp_path, start_demo):
    if not _reachable(PG):
        _skip_or_fail(f"PostgreSQL is not reachable on {PG[0]}:{PG[1]}; start it (.ci/run does)")
    if not _reachable(REDIS):
        _skip_or_fail(f"Redis is not reachable on {REDIS[0]}:{REDIS[1]}; start it (.ci/run does)")
    broker = f"redis://{REDIS[0]}:{REDIS[1]}/{REDIS_DB}"
    import redis  # noqa: PLC0415

    # a run of this test that was killed may have left messages on its queues, or taken and unacknowledged
    redis.Redis.from_url(broker).delete("unacked", "unacked_index", "unacked_mutex", "default",
                                        *(f"mop_shard_{s}" for s in range(SHARDS)))
    page = bash_block(HOWTO)
    workers = [CeleryWorker(f"shard{s}", (f"mop_shard_{s}",), own_home=False) for s in range(SHARDS)]
    workers.append(CeleryWorker("default", ("default",), concurrency=2, own_home=False))
    # the page's commands, as run here (LocalAirflow starts the services and the workers the same way)
    for line in ["mop-airflow celery config --broker redis://", "--database postgresql+psycopg2://",
                 'set -a; . "$AIRFLOW_HOME/mop-celery.env"; set +a', "mop-airflow example-data",
                 f"cp dags/{DAG_ID}.py", "airflow db migrate", "airflow api-server", "airflow scheduler",
                 "airflow dag-processor", "airflow triggerer",
                 "MOP_WORKER_NAME=shard0 AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=8794 airflow celery worker "
                 "--queues mop_shard_0 --concurrency 1 --celery-hostname shard0@%h",
                 "--queues default --concurrency 2 --celery-hostname default@%h",
                 f"mop-airflow pools sync --shards {SHARDS} --slots 1", f"airflow dags unpause {DAG_ID}",
                 f"airflow dags trigger {DAG_ID}", f"mop-airflow status {DAG_ID}", f"mop-airflow report {DAG_ID}"]:
        assert line in page, f"docs/how-to/celery.md no longer says {line!r}: change the page and this test together"

    home, mop_home, dags = tmp_path / "airflow", tmp_path / "mop", tmp_path / "dags"
    port = free_port()
    bin_dir = Path(sys.executable).parent
    with throwaway_postgres(*PG, prefix="mop_airflow_howto") as database:
        config = subprocess.run([str(bin_dir / "mop-airflow"), "celery", "config", "--broker", broker,
                                 "--database", database, "--api-url", f"http://127.0.0.1:{port}",
                                 "--airflow-home", str(home), "--mop-home", str(mop_home), "--dags-folder", str(dags)],
                                capture_output=True, text=True)
        assert config.returncode == 0, config.stderr
        env = source(home / celery_config.ENV_FILE_NAME)
        assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"  # the tasks really sign in
        shutil.copy(ROOT / "dags" / f"{DAG_ID}.py", dags)
        data = subprocess.run([str(bin_dir / "mop-airflow"), "example-data"], env={**os.environ, **env},
                              capture_output=True, text=True)
        assert data.returncode == 0, data.stderr
        with LocalAirflow(home, dags, port=port, extra_env=env, workers=workers) as af:
            af.wait_for_dag(DAG_ID)
            for worker in workers:
                af.wait_worker_ready(worker.name)
            for command in (("mop-airflow", "pools", "sync", "--shards", str(SHARDS), "--slots", "1"),
                            ("airflow", "dags", "unpause", DAG_ID), ("airflow", "dags", "trigger", DAG_ID)):
                done = af.run_cli(*command, check=False)
                assert done.returncode == 0, (command, done.stderr[-3000:])
            [run] = af.api("GET", f"/dags/{DAG_ID}/dagRuns")["dag_runs"]
            run_id = run["dag_run_id"]
            started = time.time()

            queued_key, queued_kill = kill_with_task_queued(af, run_id, workers[1], broker)
            # while it waits, `mop-airflow status` (signed in with the file's login) names it and since when
            queued_when = utc(ti_now(af, run_id, queued_key)["queued_when"])
            time.sleep(max(0.0, queued_when + WAITING_AFTER_S + 1 - time.time()))
            status = af.run_cli("mop-airflow", "status", DAG_ID, run_id, "--once", check=False)
            waiting = f"{queued_key[0]} waiting for a worker on queue mop_shard_1 since"
            assert waiting in status.stdout, status.stdout + status.stderr[-3000:]
            running_key, running_kill = kill_with_task_running(af, run_id, workers[2])
            # `make demo` (the embedded Airflow: SQLite, LocalExecutor) on the same data and seed, to compare
            # leaderboards: started now, while the Celery run mostly waits for the lost worker's heartbeat
            demo = start_demo()
            state = af.wait_for_run(DAG_ID, run_id, timeout=900)
            took = time.time() - started
            tis = af.task_instances(DAG_ID, run_id)
            assert state == "success", [(ti["task_id"], ti["state"]) for ti in tis if ti["state"] != "success"]

            # the task queued to the killed worker ran on its first try, on the restarted worker, in time
            again = ti_now(af, run_id, queued_key)
            assert again["try_number"] == 1 and again["queue"] == "mop_shard_1", again
            queued_wait = utc(again["start_date"]) - queued_kill
            assert queued_wait <= celery_config.QUEUED_BOUND_S + MARGIN_S, (queued_key, queued_wait)
            # the task running on the killed worker failed its try and ran again, in time
            again = ti_now(af, run_id, running_key)
            assert again["try_number"] == 2 and again["queue"] == "mop_shard_2", again
            running_wait = utc(again["start_date"]) - running_kill
            assert running_wait <= celery_config.RUNNING_BOUND_S + MARGIN_S, (running_key, running_wait)
            assert max(queued_wait, running_wait) <= celery_config.LOST_WORKER_BOUND_S + MARGIN_S
            retried = sorted((ti["task_id"], ti["map_index"]) for ti in tis if ti["try_number"] > 1)
            assert retried == [running_key]  # nothing else ran twice
            hosts = {ti["hostname"].rsplit("-", 1)[-1] for ti in tis if ti["queue"] == "mop_shard_3" and ti["hostname"]}
            assert hosts == {"shard3"}  # a shard's tasks ran on its worker

            # the command line signs in with the file's login
            report = af.run_cli("mop-airflow", "report", DAG_ID, run_id, "--out", str(tmp_path / "report"), check=False)
            assert report.returncode == 0, report.stderr[-3000:]
        print(f"celery run {took:.0f} s; task queued to a killed worker started {queued_wait:.0f} s after the kill, "
              f"task running on one {running_wait:.0f} s after it")

    celery_board = leaderboard(mop_home / "store", run_id)
    # the retried train task skipped what its first try committed: every hop marked committed, and no record
    # rewritten by a later try than one that marked it (a retry that took a hop whose next hop another shard
    # had trained for "not committed" trained it again from a checkpoint already cleaned up, and overwrote
    # its record)
    store = Store(f"file://{mop_home / 'store'}")
    layout = RunLayout(store, DAG_ID, run_id)
    marks = {name.split(".", 2)[2] for folder in store.glob(f"{layout.run_uri}/slots/*/commits/*")
             for name in store.names_after(folder)}
    assert marks == {f"{r['config_id']}.{r['t']}" for r in map(store.read_json, store.glob(layout.hops_glob))}
    assert rewritten_after_marked(layout) == []
    assert demo.wait(900) == 0, (tmp_path / "demo.log").read_text()[-6000:]
    demo_board = leaderboard(tmp_path / "demo" / "store")
    assert len(celery_board["leaderboard"]) == 8 and all(row["val_accuracy"] > 0 for row in celery_board["leaderboard"])
    assert celery_board == demo_board  # every configuration's rank and metrics, to every digit
