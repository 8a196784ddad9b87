"""A real Airflow 3 on this machine, as child processes in a project-local AIRFLOW_HOME.

Embedded default: SQLite + LocalExecutor with api-server, scheduler and dag-processor (what
``airflow standalone`` runs, without its generated admin password so the demo can drive the REST
API). Distributed topology on one machine: a PostgreSQL metadata database, a Celery broker, a
triggerer and one Celery worker per shard queue. Talks to the REST API, and stops everything it
started — also when the caller fails or is interrupted. Used by ``mop-airflow demo``, the tests and
the benchmark.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mop_airflow.config.environment import env
from mop_airflow.errors import AirflowApiError
from mop_airflow.hooks.rest import PASSWORD_ENV, USER_ENV, AirflowAPI
from mop_airflow.training.session import HOPS_PER_WORKER_ENV

SERVICES = ("api-server", "scheduler", "dag-processor")
WORKER_NAME_ENV = "MOP_WORKER_NAME"
# A folder where a freshly migrated SQLite metadata database is kept and copied into every new
# embedded deployment instead of migrating again (12 s on an idle 2-core machine, 20-30 s beside
# other work). The test suite sets it: it starts a dozen embedded Airflows of one Airflow version.
MIGRATED_DB_ENV = "MOP_MIGRATED_DB_DIR"


def worker_hostname() -> str:
    """Airflow ``[core] hostname_callable`` for several workers on one machine: ``<host>-<worker name>``."""
    name = env(WORKER_NAME_ENV)
    return f"{socket.getfqdn()}-{name}" if name else socket.getfqdn()


@dataclass(frozen=True)
class CeleryWorker:
    """One ``airflow celery worker``: its name, the queues it serves and its process count (GPUs).

    ``own_home``: the worker gets a ``MOP_HOME`` (shard cache) of its own, as if it were on a
    machine of its own; without it, it shares the deployment's, as workers on one machine do.
    """

    name: str
    queues: tuple[str, ...]
    concurrency: int = 1
    own_home: bool = True


SQLITE_LOCK_WAIT_S = 60  # the embedded SQLite database's lock wait (see airflow_env)
IDLE_SLEEP_SECONDS = "0.2"  # the embedded scheduler's [scheduler] scheduler_idle_sleep_time (see airflow_env)
EMBEDDED_PARALLELISM = 8  # task processes at once: the demo's 4 one-slot shard pools and default-pool tasks
# Default-pool tasks at once (data and control tasks; hops and stage tasks have their shard pools).
# A scatter task holds about 0.6 GB whatever its slice's size: 8 of them at once took 5.4 GB above
# idle at 8 GB of data on a 2-core machine, 4 of them at once keep a run under 4 GB, as fast
# (benchmarks/task_parallel.py).
DATA_TASKS_AT_ONCE = max(4, os.cpu_count() or 1)


@contextlib.contextmanager
def throwaway_postgres(host: str = "127.0.0.1", port: int = 5432, *, prefix: str = "mop_airflow") -> Iterator[str]:
    """A database of its own on a PostgreSQL server (user postgres, trust auth), for a metadata database
    as production runs it; dropped afterwards, and never one this did not create. Yields its URL."""
    import psycopg2  # noqa: PLC0415 - only the PostgreSQL topology needs it

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(host=host, port=port, user="postgres", dbname="postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg2://postgres@{host}:{port}/{name}"
    finally:
        cursor = admin.cursor()
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def airflow_env(home: Path, dags_folder: Path, port: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of every Airflow process of the embedded deployment."""
    base = f"http://127.0.0.1:{port}"
    secret_file = home / "jwt_secret"
    if not secret_file.exists():
        home.mkdir(parents=True, exist_ok=True)
        secret_file.write_text(secrets.token_hex(32))
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        # SQLite lets one writer in at a time and makes the others wait up to `timeout` seconds
        # (Python's default: 5) before "database is locked". On a busy machine the scheduler, the
        # dag-processor, the API server and every task's heartbeat write at once, and 5 s ran out:
        # the API answered a PATCH of a DAG run with 500 "Database error". 60 s rides that out.
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db?timeout={SQLITE_LOCK_WAIT_S}",
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secret_file.read_text().strip(),
        # Pick up a new DAG file within seconds instead of minutes.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        # A MOP run hands off after every hop, and the next hop is queued only by the scheduler's next
        # loop: 0.2 s between idle loops instead of Airflow's 1 s cut the demo grid's DAG run from
        # 41-43 s to 35-36 s (benchmarks/demo_grid.py --airflow-env, two runs each, 2 cores). The
        # price is the idle scheduler's CPU: 6.4 % of a core against 2.5 % (benchmarks/scheduler_idle.py).
        # A value set in the environment wins.
        "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": os.environ.get("AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME",
                                                                        IDLE_SLEEP_SECONDS),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        # Airflow's LocalExecutor forks all of [core] parallelism (32 by default) worker processes
        # when it starts, each a fork of the scheduler that preloaded TensorFlow: ~40 MB of its own
        # each (PSS; RSS shows 0.5 GB, shared), 1.3 GB for 32. On one machine no more tasks run at
        # once than the shard pools' slots and a few default-pool tasks beside them, so the
        # deployment holds at most that many task processes (measured: benchmarks/task_parallel.py).
        "AIRFLOW__CORE__PARALLELISM": os.environ.get("AIRFLOW__CORE__PARALLELISM", str(EMBEDDED_PARALLELISM)),
        # The default pool's size when the metadata database is made (a later change: `airflow pools set`).
        "AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT": os.environ.get("AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT",
                                                                      str(DATA_TASKS_AT_ONCE)),
        # Every shard pool runs on this one machine: a spec that asks for threads_per_hop "auto"
        # gets one TensorFlow thread per train task here too (the default, 1, does without this), so
        # parallel hops do not oversubscribe the cores.
        HOPS_PER_WORKER_ENV: str(os.cpu_count() or 1),
    }
    env.update(extra or {})
    return env


def _bin(name: str) -> str:
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


class LocalAirflow:
    """Context manager: ``with LocalAirflow(home, dags) as af: af.trigger(...)``."""

    def __init__(self, home: Path, dags_folder: Path, *, port: int | None = None,
                 extra_env: Mapping[str, str] | None = None, log=print, sql_alchemy_conn: str | None = None,
                 celery_broker: str | None = None, workers: Sequence[CeleryWorker] = ()):
        self.home = Path(home).absolute()
        self.dags_folder = Path(dags_folder).absolute()
        self.port = port or free_port()
        topology: dict[str, str] = {}
        if sql_alchemy_conn:
            topology["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = sql_alchemy_conn
        if celery_broker:
            if not sql_alchemy_conn:
                raise ValueError("the Celery topology needs sql_alchemy_conn: its result backend is that database")
            topology.update({
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": celery_broker,
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + sql_alchemy_conn.replace("+psycopg2", ""),
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": "mop_airflow.deployment.local.worker_hostname",
            })
        self.workers = tuple(workers)
        self.env = airflow_env(self.home, self.dags_folder, self.port, {**topology, **(extra_env or {})})
        celery = self.env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        self.services = SERVICES + (("triggerer",) if celery else ())
        # where this machine's processes reach the API server: 127.0.0.1 unless extra_env moved it (`up --host`)
        self.base_url = self.env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].rstrip("/").removesuffix("/execution")
        self.processes: dict[str, subprocess.Popen] = {}
        self.service_env: dict[str, dict[str, str] | None] = {}
        self.log = log
        # A deployment with logins (mop-airflow celery config writes one) names its user in extra_env; a
        # login merely inherited from the caller's environment (for another Airflow) is not this one's.
        login = extra_env or {}
        # A request may wait SQLITE_LOCK_WAIT_S for the database and then do its work: the client's
        # default 30 s gave up on a PATCH of a pool that CI's busy machine answered later.
        self.rest = AirflowAPI(self.base_url, env(USER_ENV, environ=login), env(PASSWORD_ENV, environ=login),
                               timeout=SQLITE_LOCK_WAIT_S + 30)

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "LocalAirflow":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def run_cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([_bin(args[0]), *args[1:]], env=self.env, check=check, capture_output=True, text=True)

    def start(self) -> None:
        from mop_airflow.deployment.preload import LOCAL_SETTINGS  # noqa: PLC0415

        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        # Airflow imports $AIRFLOW_HOME/config/airflow_local_settings.py in every process it starts.
        (self.home / "config").mkdir(exist_ok=True)
        (self.home / "config" / "airflow_local_settings.py").write_text(LOCAL_SETTINGS)
        self.migrate()
        atexit.register(self.stop)
        if threading.current_thread() is threading.main_thread():
            # `kill` of the demo must stop Airflow too: turn SIGTERM into a normal exit.
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        for name in self.services:
            self.start_service(name)
        for worker in self.workers:
            self.start_worker(worker)
        self.log(f"started {', '.join(self.processes)}; api at {self.base_url}")
        # The execution API is built while the scheduler still imports what it preloads (its longest
        # part of a start) instead of after it: 15-36 s of a start's wall time when a busy 2-core machine
        # ran it last; where the CPUs are all busy anyway it gains nothing (tests/embedded_start.py).
        self.wait_api()
        self.warm_execution_api()
        self.wait_healthy()

    def migrate(self) -> None:
        """Migrate the metadata database, or copy one migrated earlier (``MIGRATED_DB_ENV``).

        A copy is taken only for a new SQLite database, and only of one made by the same Airflow
        version with the same default pool: what ``airflow db migrate`` would have made here."""
        folder, db = env(MIGRATED_DB_ENV), self.home / "airflow.db"
        sqlite = self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{db}?timeout={SQLITE_LOCK_WAIT_S}"
        if not folder or not sqlite or db.exists():
            self._migrate_here()
            return
        import fcntl  # noqa: PLC0415 - POSIX only, as the embedded deployment is
        from importlib.metadata import version  # noqa: PLC0415

        template = Path(folder) / (f"airflow-{version('apache-airflow')}-default-pool-"
                                   f"{self.env['AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT']}.db")
        template.parent.mkdir(parents=True, exist_ok=True)
        with open(template.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process migrates; the others wait, then copy
            if template.exists():
                self.log(f"airflow home {self.home}; copying the metadata database migrated in {template}")
                shutil.copyfile(template, db)
                return
            self._migrate_here()
            shutil.copyfile(db, template.with_suffix(".partial"))
            os.replace(template.with_suffix(".partial"), template)

    def _migrate_here(self) -> None:
        self.log(f"airflow home {self.home}; migrating the metadata database")
        migrate = self.run_cli("airflow", "db", "migrate", check=False)
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{migrate.stderr[-4000:]}")

    def warm_execution_api(self) -> None:
        """Build the api-server's task execution API now, not in the first task of the first run.

        It is built on its first request: 3.8-5.1 s on a 2-core machine, which the first task of a
        run waited for in its ``/run`` call (the demo's preflight took 5 s, of which 4.4 s was this).
        """
        import httpx  # noqa: PLC0415

        try:
            self.client.get("/execution/health", timeout=120)
        except httpx.HTTPError as exc:  # only a warm-up: the first task then waits as it would have
            self.log(f"the task execution API did not answer its warm-up ({exc!r}); the first task will wait for it")

    def start_service(self, name: str, env: Mapping[str, str] | None = None) -> None:
        """Start (or start again, after :meth:`stop_service`) one of :attr:`services`; ``env``: settings
        of this start only, over the deployment's (kept in :attr:`service_env` until the next start)."""
        self.service_env[name] = dict(env) if env else None
        self._spawn(name, [_bin("airflow"), name] + (["--port", str(self.port)] if name == "api-server" else []),
                    {**self.env, **(env or {})})

    def stop_service(self, name: str, timeout: float = 120) -> None:
        """Stop a service as an operator restarting it would, and forget it until :meth:`start_service`.

        SIGTERM goes to the service's own process only: the scheduler then leaves its loop and its
        LocalExecutor waits for the task processes it runs, which the signal would fail if it reached
        them too (as :meth:`stop` sends it). What is left after ``timeout`` is killed.
        """
        proc = self.processes.pop(name)
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def start_worker(self, worker: CeleryWorker) -> None:
        """Start (or start again, after :meth:`kill`) a Celery worker serving ``worker.queues``."""
        env = {**self.env, WORKER_NAME_ENV: worker.name,
               # each worker on this machine serves its logs on its own port
               "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}
        if worker.own_home:
            env["MOP_HOME"] = str(self.home / "workers" / worker.name)
        self._spawn(f"worker-{worker.name}", [_bin("airflow"), "celery", "worker", "--queues", ",".join(worker.queues),
                                              "--concurrency", str(worker.concurrency),
                                              "--celery-hostname", f"{worker.name}@%h"], env)

    def wait_worker_ready(self, name: str, timeout: float = 180) -> None:
        """Wait until Celery worker ``name`` (started by :meth:`start_worker`) says it is ready in its log."""
        log = self.home / "logs" / f"worker-{name}.log"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if log.exists() and re.search(rf"{name}@\S+ ready", log.read_text(errors="replace")):
                return
            time.sleep(0.5)
        raise TimeoutError(f"worker {name} did not say ready in {timeout}s; see {log}")

    def kill(self, name: str) -> None:
        """SIGKILL a service and every process it started (a worker and the tasks it runs), as a
        machine that dies would; it is forgotten, so :meth:`wait_for_run` does not count it as dead."""
        proc = self.processes.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def _spawn(self, name: str, args: list[str], env: Mapping[str, str]) -> None:
        out = open(self.home / "logs" / f"{name}.log", "ab")
        # A session of its own, so stop() can end the service and every process it forked.
        self.processes[name] = subprocess.Popen(args, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def stop(self) -> None:
        self.rest.close()
        for name, proc in list(self.processes.items()):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 20
        for name, proc in list(self.processes.items()):
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
            try:  # whatever is left in the session (task processes included) goes too
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            del self.processes[name]

    def alive(self) -> dict[str, bool]:
        return {name: proc.poll() is None for name, proc in self.processes.items()}

    def _raise_if_exited(self, during: str) -> None:
        """A RuntimeError naming every service that has exited, with its exit code and how its log ends:
        a service that dies says why where the error is read (a CI log, a terminal), not only on this
        machine's disk."""
        dead = {name: proc.returncode for name, proc in self.processes.items() if proc.poll() is not None}
        if dead:
            raise RuntimeError("\n".join(
                f"the {name} exited (exit code {code}) {during}; its log ({self.home / 'logs' / f'{name}.log'}) ends:\n"
                f"{self._log_tail(name)}" for name, code in dead.items()))

    # -- REST API ----------------------------------------------------------------------------
    @property
    def client(self):
        return self.rest.client

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """``method`` on ``/api/v2{path}``; :class:`~mop_airflow.errors.AirflowApiError` (a RuntimeError) on failure.

        An idempotent request that the embedded SQLite database failed with 500 "Database error" is sent
        once more: a request caught in a cycle of SQLite locks waits out ``SQLITE_LOCK_WAIT_S`` and fails,
        and then the others go on (seen: a PATCH of a DAG beside two task heartbeats, all three held 60 s,
        2026-11-28). Its transaction was rolled back: it changed nothing."""
        try:
            return self.rest.call(method, path, **kwargs)
        except AirflowApiError as exc:
            if exc.status != 500 or method.upper() not in ("GET", "PUT", "PATCH", "DELETE") or "Database error" not in str(exc):
                raise
            self.log(f"{method} {path}: Airflow's database failed it ({exc}); sending it again")
            return self.rest.call(method, path, **kwargs)

    def wait_api(self, timeout: float = 180) -> None:
        """Until the api-server answers (the other services may still be starting)."""
        import httpx  # noqa: PLC0415

        deadline = time.time() + timeout
        while time.time() < deadline:
            self._raise_if_exited("while Airflow started")
            try:
                if self.client.get("/api/v2/monitor/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the api-server did not answer in {timeout}s; see {self.home / 'logs'}")

    def wait_healthy(self, timeout: float = 180) -> None:
        import httpx  # noqa: PLC0415

        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            self._raise_if_exited("while Airflow started")
            try:
                health = self.client.get("/api/v2/monitor/health").json()
                last = health
                if all(health.get(c, {}).get("status") == "healthy" for c in ("metadatabase", "scheduler", "dag_processor")):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"Airflow did not become healthy in {timeout}s (last health: {last})")

    def wait_for_dag(self, dag_id: str, timeout: float = 300, folder: Path | None = None) -> None:
        """Until the dag-processor has written ``dag_id`` to the metadata database.

        A parse takes well under a second, but the dag-processor's writes wait for SQLite's lock like
        every other process's (up to ``SQLITE_LOCK_WAIT_S`` each) on a busy machine: the bound allows
        a few such waits. A dead dag-processor or an import error fails at once; a timeout says what
        the api-server last answered and how the dag-processor's log ends.

        Import errors count for files that still exist (under ``folder`` where given): one for a file
        deleted while it was parsed ("Failed to write serialized DAG": FileNotFoundError) stays until
        the dag-processor's next listing of the folder, and says nothing about ``dag_id``."""
        deadline, last = time.time() + timeout, None
        while time.time() < deadline:
            self._raise_if_exited(f"while {dag_id} waited to be parsed")
            try:
                errors = [e for e in self.api("GET", "/importErrors").get("import_errors", [])
                          if self._live_file(e.get("filename") or "", folder)]
                if errors:
                    raise RuntimeError("DAG import errors:\n" + "\n".join(e["stack_trace"][-2000:] for e in errors))
                self.api("GET", f"/dags/{dag_id}")
                return
            except AirflowApiError as exc:
                last = exc
                time.sleep(1)
        raise TimeoutError(f"DAG {dag_id} was not parsed within {timeout}s; the api-server last answered: {last}\n"
                           f"the dag-processor's log ends:\n{self._log_tail('dag-processor')}")

    def _live_file(self, filename: str, folder: Path | None) -> bool:
        path = self.dags_folder / filename  # an absolute filename stays as it is
        return path.exists() and (folder is None or path.resolve().is_relative_to(Path(folder).resolve()))

    def _log_tail(self, service: str, lines: int = 25) -> str:
        """The last ``lines`` of a service's log, but its bundle refresh messages (one every few seconds)."""
        log = self.home / "logs" / f"{service}.log"
        if not log.exists():
            return f"(no {log})"
        noise = ("Refreshing bundle", "Searching for files", "Not time to refresh", "Found ")
        kept = [line for line in log.read_text(errors="replace").splitlines() if not any(n in line for n in noise)]
        return "\n".join(line[:300] for line in kept[-lines:])

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None) -> str:
        self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        run = self.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": dict(conf or {})})
        return run["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return list(self.rest.paged(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", "task_instances"))

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> str:
        body = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                        params={"full_content": True, "map_index": map_index}, headers={"Accept": "application/json"})
        content = body.get("content", [])
        return "\n".join(json.dumps(part) if not isinstance(part, str) else part for part in content)

    def wait_for_run(self, dag_id: str, run_id: str, *, timeout: float, on_tick=None, tick: float = 3.0) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.run_state(dag_id, run_id)
            if on_tick:
                on_tick(state)
            if state in ("success", "failed"):
                return state
            self._raise_if_exited(f"during run {run_id} of {dag_id}")
            time.sleep(tick)
        raise TimeoutError(f"run {run_id} of {dag_id} did not finish within {timeout}s")
