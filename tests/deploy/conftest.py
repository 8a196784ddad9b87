"""The deployment tests' shared pieces: they run only when asked (``make test-deploy`` sets
``MOP_DEPLOY_TESTS=1``), since they build an image (minutes) and start a dozen containers; there a
missing podman, runc or debootstrap fails them instead of skipping them. The image is built once for
all of them and removed at the end with every container they started, whatever happens."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.deploy.podman import Podman, build_images, build_volumes, built_line, tools_missing, workdir

ENABLED = os.environ.get("MOP_DEPLOY_TESTS") == "1"


def pytest_collection_modifyitems(items):
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="a deployment test: run it with `make test-deploy` (MOP_DEPLOY_TESTS=1)")
    for item in items:
        if "tests/deploy/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def podman():
    missing = tools_missing()
    if missing:
        pytest.fail(f"the deployment tests need {', '.join(missing)}: apt-get install podman runc debootstrap")
    if os.geteuid() != 0:
        pytest.fail("the deployment tests run podman and debootstrap as root")
    folder = workdir()
    made = Podman(folder)
    try:
        yield made
    finally:
        made.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def images(podman) -> dict:
    """docker/worker.Dockerfile built FROM the stand-in for apache/airflow, and the Debian base under it
    (tests/deploy/podman.py). ``MOP_DEPLOY_IMAGE`` and ``MOP_DEPLOY_DEBIAN`` name images built before
    (yours to remove), to run the tests again without building."""
    if os.environ.get("MOP_DEPLOY_IMAGE"):
        return {"image": os.environ["MOP_DEPLOY_IMAGE"], "debian": os.environ.get("MOP_DEPLOY_DEBIAN", ""),
                "build_volumes": build_volumes()}
    built = build_images(podman)
    print(f"\n{built_line(built)}", file=sys.stderr)
    return built


@pytest.fixture(scope="session")
def worker_image(images) -> str:
    return images["image"]


@pytest.fixture
def postgres_url():
    """A database of the test's own on the machine's PostgreSQL, dropped at the end."""
    from mop_airflow.deployment.local import throwaway_postgres  # noqa: PLC0415

    if not _reachable(5432):
        pytest.fail("the deployment tests need PostgreSQL on 127.0.0.1:5432 (.ci/run starts it)")
    with throwaway_postgres(prefix="mop_deploy") as url:
        yield url


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of the test's own on a free port (the broker), stopped at the end."""
    from mop_airflow.deployment.local import free_port  # noqa: PLC0415

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("the deployment tests need redis-server (apt-get install redis-server)")
    port = free_port()
    server = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if _reachable(port):
                break
            server.poll()
            assert server.returncode is None, "redis-server exited"
            import time  # noqa: PLC0415

            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=30)
