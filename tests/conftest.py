"""Test session setup: a throw-away AIRFLOW_HOME and MOP_HOME, set before Airflow is imported.

Tests never touch a developer's own Airflow home or metadata database.
"""

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

_SESSION = Path(tempfile.mkdtemp(prefix="mop-airflow-tests-"))
# each pytest process (every xdist worker too) makes its own; without this every `make test` left them behind
atexit.register(shutil.rmtree, _SESSION, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = str(_SESSION / "airflow")
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_SESSION / 'airflow' / 'airflow.db'}"
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
# dag.test() loads DAGs from the dags-folder bundle, so tests write their DAG files here.
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_SESSION / "dags")
os.environ["MOP_HOME"] = str(_SESSION / "mop")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every embedded Airflow of the session copies one migrated metadata database instead of migrating
# its own (mop_airflow.deployment.local.MIGRATED_DB_ENV). setdefault: xdist's workers inherit the
# folder of the process that started them, which removes it when the session ends.
os.environ.setdefault("MOP_MIGRATED_DB_DIR", str(_SESSION / "migrated"))

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated metadata database (SQLite) for dag.test()."""
    (_SESSION / "airflow").mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).with_name("airflow")
    result = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True, env=os.environ.copy())
    assert result.returncode == 0, result.stderr[-3000:]
    return _SESSION / "airflow"


@pytest.fixture(scope="session")
def session_dir() -> Path:
    return _SESSION


def dag_file(folder, dag_id: str, spec: dict, **kwargs):
    """Write ``folder/<dag_id>.py``: a DAG file as a user writes one, ``build_mop_dag(spec, **kwargs)``."""
    import json

    path = folder / f"{dag_id}.py"
    path.write_text(
        "import json\nfrom mop_airflow import build_mop_dag\n"
        f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={dag_id!r}, **{kwargs!r})\n"
    )
    return path


def write_dag_file(dag_id: str, spec: dict, **kwargs) -> object:
    """Write a DAG file built from ``spec`` into the test dags folder and return its DAG."""
    import importlib.util

    folder = _SESSION / "dags"
    folder.mkdir(parents=True, exist_ok=True)
    path = dag_file(folder, dag_id, spec, **kwargs)
    module_spec = importlib.util.spec_from_file_location(f"dagfile_{dag_id}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.dag


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


class RestartableS3:
    """A loopback S3 endpoint (moto's server) that can go away and come back on the same port.

    Clients talk to a TCP proxy in front of moto: an outage closes the proxy's port and every open
    connection (keep-alive ones too, which a stopped HTTP server would go on serving), so a client
    sees refused and reset connections as when a real endpoint goes down. moto keeps running
    behind it, so what was written before an outage is there after it.
    """

    def __init__(self):
        import threading

        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.target = self.server.get_host_and_port()[1]
        self.port = 0
        self.lock = threading.Lock()
        self.connections = set()
        self.listener = None
        self.start()

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        import socket
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener):
        import socket
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed: an outage
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.connections |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                self._close(sock)

    @staticmethod
    def _close(sock):
        import socket

        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def stop(self):
        """The endpoint goes away: new connections are refused, open ones are cut."""
        self._close(self.listener)
        with self.lock:
            for sock in self.connections:
                self._close(sock)
            self.connections.clear()

    def outage(self, seconds):
        """Stop answering now and come back ``seconds`` later, in the background."""
        import threading

        self.stop()
        timer = threading.Timer(seconds, self.start)
        timer.start()
        return timer

    def close(self):
        self.stop()
        self.server.stop()


@pytest.fixture
def restartable_s3():
    s3 = RestartableS3()
    yield s3
    s3.close()


def logged(capfd, caplog) -> str:
    """Everything logged and printed so far: a message goes to Airflow's handler or to pytest's,
    depending on which set up logging first in this process."""
    out, err = capfd.readouterr()
    return out + err + "\n".join(r.getMessage() for r in caplog.records)


def make_bucket(endpoint, name):
    import boto3

    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                 region_name="us-east-1").create_bucket(Bucket=name)


def failed_logs(af, dag_id: str, run_id: str) -> str:
    """What failed in a run of a real Airflow, with the end of each failed task's log: an assertion's
    message, so a failed run says why."""
    failed = [ti["task_id"] for ti in af.task_instances(dag_id, run_id) if ti["state"] == "failed"]
    return f"{run_id}: failed {failed}\n" + "\n".join(af.task_log(dag_id, run_id, t)[-3000:] for t in failed[:2])


# -- one embedded Airflow per test worker ----------------------------------------------------------
# The files that need a real scheduler (LocalExecutor, SQLite, api-server, scheduler, dag-processor)
# share one per pytest process instead of starting their own (one start is 40 s and more on two busy
# cores). Each file gets a part of it of its own (:func:`airflow_part`): a DAG folder, a
# MOP_HOME and a store, and no pool or DAG of the file before it.


class SharedAirflow:
    """The embedded Airflow that the files using it share, on the test worker that takes them (a unit of
    work, :func:`pytest_xdist_make_scheduler`): started when a file first asks for it, stopped when the
    worker goes on to a file that does not use it (:func:`pytest_runtest_setup`).

    An idle embedded Airflow costs about a tenth of a core (its scheduler loops every 0.2 s: 8.5 % of a
    core on a 2-core AMD EPYC, 2026-11-28). One for each worker, kept to the session's end, idled
    through most of a whole run, and each start costs some 30 CPU-seconds.
    """

    def __init__(self, root: Path):
        self.root, self.af, self.starts = root, None, 0
        self._started = contextlib.ExitStack()  # LocalAirflow's own context: stopped if its start fails
        (root / "dags").mkdir()

    def running(self):
        if self.af is None:
            from mop_airflow.deployment.local import LocalAirflow

            # a home of its own each start: a fresh metadata database, nothing of an earlier file in it;
            # parallelism 10: test_slots_at_user_shapes runs 8 train tasks at once beside a control task
            # (the LocalExecutor forks its worker processes once, idle ones cost nothing)
            self.starts += 1
            self.af = self._started.enter_context(LocalAirflow(
                self.root / f"airflow{self.starts}", self.root / "dags", log=lambda *_: None,
                sql_alchemy_conn=self._database(),
                extra_env={"MOP_HOME": str(self.root / "mop"), "AIRFLOW__CORE__PARALLELISM": "10"}))
        return self.af

    def _database(self) -> str | None:
        """A PostgreSQL database of its own (dropped when it stops) where a server is on 127.0.0.1:5432 (CI's
        and every machine `.ci/run` prepared), else the embedded SQLite. On SQLite every process's write
        waits for one lock: in whole runs the dag-processor stood 60 s at a time (its heartbeat "recovered
        after 60.65 seconds", a DAG deactivated as not parsed for 91 s) and a file's DAGs were not
        parsed within 120 s, while the files beside it trained and killed task processes."""
        from mop_airflow.deployment.local import throwaway_postgres
        from tests.test_distributed import PG, _reachable

        if not _reachable(PG):
            return None
        return self._started.enter_context(throwaway_postgres(*PG, prefix="mop_airflow_tests_shared"))

    def stop(self) -> None:
        af, self.af = self.af, None
        self._started.close()
        if af is not None:
            assert not any(af.alive().values())  # stop() ended every service it started


_SHARED: list[SharedAirflow] = []  # this worker's, once a file asked for it (pytest_runtest_setup stops it)
_USES_SHARED: set = set()  # the files with a test that uses it (pytest_collection_modifyitems)
SHARED_UNIT = "the files of the shared Airflow"  # their units of work under xdist: this, then " 1", " 2"...


@pytest.fixture(scope="session")
def _shared_airflow_holder(tmp_path_factory):
    holder = SharedAirflow(tmp_path_factory.mktemp("shared_airflow"))
    _SHARED.append(holder)
    yield holder
    holder.stop()


@pytest.fixture(scope="module")
def shared_airflow(_shared_airflow_holder):
    """The embedded Airflow of this test worker, running; files use it through :func:`airflow_part`."""
    return _shared_airflow_holder.running()


def shared_units(files: list[str], units: int) -> dict[str, str]:
    """Each file of the shared Airflow's unit of work, ``units`` units as even in seconds as
    :data:`FILE_SECONDS` makes them: the longest file first, each to the unit with the fewest seconds yet."""
    seconds = {path: FILE_SECONDS.get(Path(path).name, 0) for path in files}
    load = [0] * units
    unit_of = {}
    for path in sorted(files, key=lambda f: -seconds[f]):
        k = load.index(min(load))
        load[k] += seconds[path]
        unit_of[path] = SHARED_UNIT if units == 1 else f"{SHARED_UNIT} {k + 1}"
    return unit_of


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (`make test`'s), with the files that use the shared Airflow as units of work of
    their own: one unit for each worker but one (each worker that takes one starts its own Airflow), so
    that one worker always takes the other files, which compute, while the files of the shared Airflows,
    which mostly wait on bounds, run beside it. The files are those whose source names the fixture (xdist's
    controller does not collect, it sees test ids)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    shared = [path.relative_to(config.rootpath).as_posix() for path in sorted((REPO / "tests").rglob("test_*.py"))
              if "shared_airflow" in path.read_text()]
    workers = config.getvalue("numprocesses")
    unit_of = shared_units(shared, max(1, (workers if isinstance(workers, int) else 2) - 1))

    class SharedAirflowUnits(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return unit_of.get(path, path)

    return SharedAirflowUnits(config, log)


def pytest_runtest_setup(item):
    """A file that does not use the shared Airflow stops it: the files that do are one unit of work, run
    one after the other (see :func:`pytest_collection_modifyitems`), so it is not started again."""
    if _SHARED and item.path not in _USES_SHARED:
        _SHARED[0].stop()


class AirflowPart:
    """A test file's part of the shared Airflow: everything of :class:`LocalAirflow` (attributes are
    the shared one's), with a DAG folder of its own under the shared one (``dags``), a folder for its
    data and store (``root``), and the environment its DAG files set for the processes that parse
    them: the task processes, which parse their DAG file before they run, and the dag-processor.

    ``env`` (``MOP_HOME`` under ``root`` unless given) and ``paths`` (put in front of
    ``sys.path`` and ``PYTHONPATH``: model builders outside the DAG folder) are written at the top of
    every DAG file written with :meth:`write_dag` or :meth:`dag_file`.
    """

    def __init__(self, af, root: Path, name: str, env=None, paths=()):
        self.af, self.root, self.name = af, root, name
        self.dags = Path(af.dags_folder) / name
        self.dag_env = {"MOP_HOME": str(root / "mop"), **(env or {})}
        self.paths = [str(p) for p in paths]
        if self.paths:
            self.dag_env["PYTHONPATH"] = os.pathsep.join(self.paths + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    def __getattr__(self, name):
        return getattr(self.af, name)

    def header(self) -> str:
        return ("# the test file's environment, for the processes that parse this file (a shared Airflow)\n"
                f"import os as _os, sys as _sys\n_os.environ.update({self.dag_env!r})\n"
                f"_sys.path[:0] = [p for p in {self.paths!r} if p not in _sys.path]\n")

    def write_dag(self, dag_id: str, source: str) -> Path:
        """Write ``<dags>/<dag_id>.py`` (the header, then ``source``) in one rename: never parsed half-written."""
        self.dags.mkdir(parents=True, exist_ok=True)
        path = self.dags / f"{dag_id}.py"
        partial = path.with_suffix(".partial")
        partial.write_text(with_header(source, self.header()))
        os.replace(partial, path)
        return path

    def dag_file(self, dag_id: str, spec: dict, **kwargs) -> Path:
        """:func:`dag_file` in this part's DAG folder."""
        import json

        return self.write_dag(dag_id, "import json\nfrom mop_airflow import build_mop_dag\n"
                              f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={dag_id!r}, "
                              f"**{kwargs!r})\n")

    def wait_for_dag(self, dag_id: str, timeout: float = 300) -> None:
        """:meth:`LocalAirflow.wait_for_dag`, failed by import errors of this file's DAGs only.

        A dag-processor that exited is started again, once, with a warning that carries why it exited:
        the shared Airflow is the tests' infrastructure, which a deployment's supervisor would restart,
        and the files after it must not fail for it (CI saw it exit once, after 20 minutes of a whole run)."""
        try:
            self.af.wait_for_dag(dag_id, timeout=timeout, folder=self.dags)
        except RuntimeError as exc:
            if self.af.alive().get("dag-processor") is not False:
                raise
            import warnings

            warnings.warn(f"{exc}\n(the shared Airflow's dag-processor is started again)", stacklevel=2)
            self.af.stop_service("dag-processor", timeout=10)
            self.af.start_service("dag-processor")
            self.af.wait_for_dag(dag_id, timeout=timeout, folder=self.dags)

    def wait_for_dags(self, *dag_ids: str) -> None:
        for dag_id in dag_ids:
            self.wait_for_dag(dag_id)

    def my_dags(self) -> list[str]:
        folder = str(self.dags.resolve())
        return [d["dag_id"] for d in self.af.rest.paged("/dags", "dags")
                if str(d.get("fileloc") or "").startswith(folder + os.sep)]

    def pools(self) -> list[str]:
        return [p["name"] for p in self.af.rest.paged("/pools", "pools") if p["name"] != "default_pool"]

    def delete_pools(self) -> None:
        for name in self.pools():
            self.af.api("DELETE", f"/pools/{name}")

    def clear(self) -> None:
        """Leave nothing of this file to the next: its DAGs (runs included) and every pool but the default."""
        import shutil

        ids = self.my_dags()
        shutil.rmtree(self.dags, ignore_errors=True)
        for dag_id in ids:
            self.af.api("PATCH", f"/dags/{dag_id}", json={"is_paused": True})
            for run in self.af.rest.paged(f"/dags/{dag_id}/dagRuns", "dag_runs"):
                if run["state"] in ("queued", "running"):
                    self.af.api("PATCH", f"/dags/{dag_id}/dagRuns/{run['dag_run_id']}", json={"state": "failed"})
        for dag_id in ids:
            _delete_dag(self.af, dag_id)
        self.delete_pools()


def _delete_dag(af, dag_id, timeout=60):
    """DELETE a DAG (its runs with it); refused while task instances of it still run, so tried again."""
    import time

    deadline = time.time() + timeout
    while True:
        try:
            af.api("DELETE", f"/dags/{dag_id}")
            return
        except RuntimeError:
            if time.time() > deadline:
                raise
            time.sleep(2)


def with_header(source: str, header: str) -> str:
    """``source`` with ``header`` after its docstring and ``from __future__`` imports (which must come first)."""
    import ast

    lines = source.splitlines(keepends=True)
    after = 0
    for node in ast.parse(source).body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        if not (docstring or (isinstance(node, ast.ImportFrom) and node.module == "__future__")):
            break
        after = node.end_lineno
    return "".join(lines[:after]) + header + "".join(lines[after:])


@contextlib.contextmanager
def airflow_part(shared, root: Path, name: str, env=None, paths=()):
    """This file's part of ``shared`` (:class:`AirflowPart`), cleared when the file ends. The services the file
    stopped are started again with the shared environment, and a scheduler started with another
    environment (:meth:`LocalAirflow.start_service`'s ``env``) is started again with it."""
    part = AirflowPart(shared, root, name, env=env, paths=paths)
    part.delete_pools()  # whatever the previous file left (it clears its own; this is for one that failed to)
    try:
        yield part
    finally:
        for service in shared.services:
            if service not in shared.processes or shared.processes[service].poll() is not None \
                    or getattr(shared, "service_env", {}).get(service) is not None:
                if service in shared.processes:
                    shared.stop_service(service, timeout=10)
                shared.start_service(service)
        shared.wait_healthy()
        part.clear()


# Seconds a file took in a whole `make test` (setup, calls and teardown of its tests, three workers; a
# 2-core AMD EPYC shared with other work, 2026-12-06, with the tests added that day), for the files of 25 s
# or more: the longest go first, and the shared Airflow's files are dealt into units by them. A file's
# first test that starts the shared Airflow counts its start.
FILE_SECONDS = {
    "test_slot_faults_scheduler.py": 881, "test_slots_at_user_shapes.py": 697, "test_distributed.py": 400,
    "test_celery_howto.py": 381, "test_command_line.py": 365, "test_real_scheduler.py": 311, "test_slot_sim.py": 310,
    "test_shard_loop.py": 216, "test_task_group.py": 213, "test_end_to_end.py": 200, "test_pbt_runs.py": 180,
    "test_fused.py": 146, "test_one_run_searches.py": 134, "test_jax_backend.py": 116, "test_results_page.py": 112,
    "test_credentials.py": 111, "test_hyperband_blocks.py": 95, "test_retraining_dags.py": 82, "test_asha_runs.py": 79,
    "test_failing_configurations.py": 75, "test_shared_compile.py": 73, "test_tracking.py": 48, "test_group_runs.py": 44,
    "test_setup_errors.py": 38, "test_champion_cli.py": 37, "test_example_project.py": 35, "test_slot_faults.py": 35,
    "test_champion.py": 32, "test_layers.py": 31, "test_hop.py": 30, "test_failures_travel.py": 28, "test_docs.py": 28,
}


def pytest_collection_modifyitems(config, items):
    """`make test`'s units of work and their order.

    The files that use the shared Airflow are units of work of their own, one for each worker but one
    (:func:`pytest_xdist_make_scheduler`): a worker that takes one runs its files one after the other on
    one embedded Airflow of its own, while the last worker takes the other files, one file a unit, as
    ``--dist loadfile`` does. Those files mostly wait on heartbeat, stall and wait bounds, so they run
    beside files that compute: `make test` runs three workers on two cores. The units come first, then
    the other files: the longest first (:data:`FILE_SECONDS`), then the other files holding a slow test,
    then the rest, each group in the order collected. A worker stops its Airflow when it goes on to
    another file (:func:`pytest_runtest_setup`).

    The suite ends when the worker that took the last long file ends it: xdist's own order (most tests
    first) left the files of one long test, such as the Celery how-to's five minutes, for last, with the
    other worker idle; taking the long files first took the suite from 22:03 to 19:27 on a 2-core
    machine (two whole runs, 2026-11-26).
    """
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    _USES_SHARED.update(item.path for item in items if "shared_airflow" in getattr(item, "fixturenames", ()))
    # stable: the order within each group stays
    items.sort(key=lambda item: (item.path not in _USES_SHARED, -FILE_SECONDS.get(item.path.name, 0),
                                 item.path not in slow))


def _freeze_what_is_alive() -> None:
    """Every object alive now moves to the garbage collector's permanent generation: Keras's ``clear_session``
    (the model check before training, every slot between models) runs a full collection, which walked
    TensorFlow's, Keras's, Airflow's and every test module's objects each time (about a second a call late in
    a test worker; test_model_check alone took 13.6 s, 6.7 s with this). Reference counting still frees
    what a test drops; only a cycle among objects alive now is kept."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_collection_finish(session):
    _freeze_what_is_alive()


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if nextitem is not None and nextitem.path != item.path:  # a file's fixtures are torn down by now
        _freeze_what_is_alive()
