"""docker/docker-compose.yaml as Compose reads it: `docker-compose config` (Debian's ``docker-compose``
package validates and resolves the file without a Docker engine), and what the resolved services set.
tests/deploy/test_compose_services.py starts its services and runs the demo through them.

Alone the file runs on CPUs: no GPU reserved, the CPU image, a shard worker per shard of its DAG
(docker/dags), the admin's password the one the pool check logs in with. With docker/docker-compose.gpu.yaml
the shard workers get what the GPU pages prescribe (docs/how-to/gpu-workers.md): Keras on JAX
(``KERAS_BACKEND=jax``, :data:`mop_airflow.deployment.celery_config.GPU_WORKER_ENV`), an image built with
JAX for CUDA and CUDA's TensorFlow, their queue, as many slots (``MOP_SLOTS`` = ``--concurrency``) as
GPUs reserved (``MOP_GPUS`` = the device ids), and a cache volume of their own. The other services
keep Keras's default backend and reserve no GPU. Every service gets the lost-worker settings of
``mop-airflow celery config``, and the file holds no default for the secrets it needs.

Without the binary these tests skip; CI (.ci/run) installs it and sets ``MOP_REQUIRE_COMPOSE=1``,
which fails them instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from mop_airflow.deployment.celery_config import GPU_WORKER_ENV, lost_worker_settings
from tests.conftest import REPO

COMPOSE_FILE = REPO / "docker" / "docker-compose.yaml"
GPU_FILE = REPO / "docker" / "docker-compose.gpu.yaml"
# The variables the file refuses to start without (${VAR:?...}): no secret has a default in it.
REQUIRED = {"AIRFLOW_JWT_SECRET": "a-long-random-test-secret", "AIRFLOW_ADMIN_PASSWORD": "a-test-password"}


def compose_config(env: dict[str, str], files=(COMPOSE_FILE,)) -> subprocess.CompletedProcess:
    binary = shutil.which("docker-compose")
    if binary is None:
        message = "no docker-compose: install Debian's docker-compose package (validates without a Docker engine)"
        if os.environ.get("MOP_REQUIRE_COMPOSE") == "1":  # CI (.ci/run): fail rather than skip
            pytest.fail(message)
        pytest.skip(message)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
    return subprocess.run([binary, *(f"-f{f}" for f in files), "config"], capture_output=True, text=True,
                          timeout=120, env={**keep, **env}, cwd=REPO)


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    done = compose_config(REQUIRED)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["services"]


@pytest.fixture(scope="module")
def gpu_services() -> dict[str, dict]:
    done = compose_config(REQUIRED, (COMPOSE_FILE, GPU_FILE))
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["services"]


def _shard_workers(services: dict[str, dict]) -> list[str]:
    return sorted((name for name in services if name.startswith("worker-shard-")), key=lambda n: int(n.rsplit("-")[-1]))


def _airflow(services: dict[str, dict]) -> dict[str, dict]:
    return {name: s for name, s in services.items() if "AIRFLOW__CORE__EXECUTOR" in (s.get("environment") or {})}


def _gpus(service: dict) -> list[str]:
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    return [d for device in devices if device.get("driver") == "nvidia" and "gpu" in device.get("capabilities", [])
            for d in device.get("device_ids", [])]


def _command(service: dict) -> str:
    command = service["command"]  # Compose 1 writes it as given, Compose 2 as a list
    return command if isinstance(command, str) else " ".join(command)


def _mounts(service: dict) -> list[str]:
    """``source:target`` of each volume, from either Compose's short or long syntax."""
    return [":".join(v.split(":")[:2]) if isinstance(v, str) else f"{v['source']}:{v['target']}"
            for v in service.get("volumes", [])]


def test_compose_reads_the_file(services):
    assert {"postgres", "redis", "minio", "airflow-init", "airflow-apiserver", "airflow-scheduler",
            "airflow-dag-processor", "airflow-triggerer", "worker-control"} <= set(services)


def test_alone_the_file_runs_the_demo_on_cpus_with_a_worker_per_shard_of_its_dag(services):
    dag = (REPO / "docker" / "dags" / "mop_mnist1d_s3.py").read_text()
    shards = int(re.search(r'"shards": (\d+)', dag).group(1))
    assert _shard_workers(services) == [f"worker-shard-{s}" for s in range(shards)]
    for name, service in services.items():
        assert not _gpus(service) and "KERAS_BACKEND" not in (service.get("environment") or {}), name
    for name in _shard_workers(services):
        concurrency = _command(services[name]).rsplit(" ", 1)[1]
        assert services[name]["environment"]["MOP_SLOTS"] == concurrency and not services[name]["environment"].get("MOP_GPUS")
    args = services["airflow-scheduler"]["build"]["args"]
    assert args["TF_PACKAGE"] == "tensorflow" and not args.get("JAX_PACKAGE")  # TensorFlow's CPU build, no CUDA
    init = _command(services["airflow-init"])
    assert "mop-airflow pools sync --dags-folder /opt/airflow/dags" in init  # the pools of the DAG's shards
    assert "s3://mop/data/mnist1d/" in init and 's3://mop/data/mnist1d"' in dag  # the example data on the S3 service
    assert '"root": "s3://mop/runs"' in dag
    assert "mop_mnist1d_s3" in (REPO / "docs" / "how-to" / "docker.md").read_text()  # the DAG the page triggers


def test_the_admins_password_is_the_one_the_pool_check_logs_in_with(services):
    env = {k: str(v) for k, v in services["airflow-apiserver"]["environment"].items()}
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert env["AIRFLOW_ADMIN_USER"] == "admin" and env["AIRFLOW_ADMIN_PASSWORD"] == REQUIRED["AIRFLOW_ADMIN_PASSWORD"]
    assert "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in _command(services["airflow-apiserver"])  # written before it starts
    api = json.loads(env["AIRFLOW_CONN_MOP_AIRFLOW_API"])
    assert (api["login"], api["password"]) == ("admin", REQUIRED["AIRFLOW_ADMIN_PASSWORD"])
    for name, service in _airflow(services).items():  # one passwords file setting and one secret key for all
        assert service["environment"]["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == \
            env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"], name
        assert service["environment"]["AIRFLOW__API__SECRET_KEY"] == REQUIRED["AIRFLOW_JWT_SECRET"], name


def test_each_shard_worker_has_its_queue_its_gpus_as_slots_keras_on_jax_and_its_cache(gpu_services):
    services = gpu_services
    shards = _shard_workers(services)
    assert shards == [f"worker-shard-{s}" for s in range(len(shards))] and len(shards) >= 2
    gpus_taken = []
    for s, name in enumerate(shards):
        service = services[name]
        env, command = service["environment"], _command(service)
        assert re.search(rf"celery worker --queues mop_shard_{s} --concurrency (\d+)$", command), command
        concurrency = command.rsplit(" ", 1)[1]
        assert {k: env.get(k) for k in GPU_WORKER_ENV} == GPU_WORKER_ENV  # KERAS_BACKEND=jax
        gpus = _gpus(service)
        assert gpus and env["MOP_GPUS"] == str(len(gpus)) and env["MOP_SLOTS"] == concurrency, name
        gpus_taken += gpus
        build = service["build"]["args"]
        assert "jax[cuda" in build["JAX_PACKAGE"] and "[and-cuda]" in build["TF_PACKAGE"]
        assert f"shard-{s}-cache:/opt/mop/cache" in _mounts(service), service["volumes"]
    assert len(gpus_taken) == len(set(gpus_taken)), "two shard workers reserve the same GPU"


def test_the_other_services_keep_kerass_default_backend_and_no_gpu(gpu_services):
    services = gpu_services
    others = {name: s for name, s in services.items() if not name.startswith("worker-shard-")}
    assert all(s["build"]["args"]["TF_PACKAGE"] == "tensorflow" for s in others.values() if "build" in s)
    assert all("KERAS_BACKEND" not in (s.get("environment") or {}) and not _gpus(s) for s in others.values())
    assert _command(services["worker-control"]).endswith("--queues default --concurrency 2")


def test_every_airflow_service_has_the_lost_worker_settings(services):
    settings = {k: str(v).lower() for k, v in lost_worker_settings().items()}
    for name, service in _airflow(services).items():
        env = {k: str(v).lower() for k, v in service["environment"].items()}
        assert {k: env.get(k) for k in settings} == settings, name


def test_the_file_holds_no_default_for_its_secrets():
    for missing in REQUIRED:
        done = compose_config({k: v for k, v in REQUIRED.items() if k != missing})
        assert done.returncode != 0 and missing in done.stderr, (missing, done.stderr)
