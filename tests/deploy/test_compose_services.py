"""docker/docker-compose.yaml's own Airflow services run the demo: the file read as Compose reads it
(tests/deploy/compose.py), each service started with podman from the image docker/worker.Dockerfile
builds (FROM a stand-in for apache/airflow: tests/deploy/test_chart.py says why), with the file's
command, environment and volumes, on a network of its own where each service's name resolves to it.
Then, as docs/how-to/docker.md says: unpause and trigger ``mop_mnist1d_s3`` in the scheduler's
container, and the demo's search (4 shards, 8 configurations, 3 iterations) must succeed with its data
and store on the S3 service, each shard's tasks on that shard's worker, the pools the init service synced
to the DAG's shards, and the admin's password the one AIRFLOW_ADMIN_PASSWORD gives.

The ``postgres``, ``redis`` and ``minio`` images cannot be pulled here (no image registry is reachable):
those three services are stood up from the same software by other means (tests/deploy/services: Debian's
PostgreSQL and Redis, with the file's user, password and database; moto's S3 server in MinIO's place,
on the same name and port), and MinIO's healthcheck (its ``mc``) is replaced by a request to the server.
"""

from __future__ import annotations

import json
import secrets
import time

import pytest

from tests.conftest import REPO
from tests.deploy.compose import Compose, services, start_order

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

COMPOSE_FILE = REPO / "docker" / "docker-compose.yaml"
STANDINS = REPO / "tests" / "deploy" / "services"
DAG_ID = "mop_mnist1d_s3"  # the DAG docs/how-to/docker.md triggers
SHARDS, CONFIGURATIONS = 4, 8
STANDIN_COMMANDS = {
    "postgres": ["postgres-standin"],
    "redis": ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"],
    "minio": ["/opt/moto/bin/moto_server", "-H", "0.0.0.0", "-p", "9000"],
}
S3_UP = ["CMD", "/opt/moto/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://localhost:9000/')"]

READ_LEADERBOARD = """
import json, os, sys
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
conn = json.loads(os.environ["AIRFLOW_CONN_AWS_DEFAULT"])
store = Store("s3://mop/runs", {"key": conn["login"], "secret": conn["password"],
                                "client_kwargs": {"endpoint_url": conn["extra"]["endpoint_url"]}})
print(json.dumps(store.read_json(RunLayout(store, sys.argv[1], sys.argv[2]).report_uri("leaderboard.json"))))
"""

ADMIN_TOKEN = """
import json, os, urllib.request
body = json.dumps({"username": "admin", "password": os.environ["AIRFLOW_ADMIN_PASSWORD"]}).encode()
request = urllib.request.Request("http://localhost:8080/auth/token", body, {"Content-Type": "application/json"})
with urllib.request.urlopen(request) as response:
    print(response.status, "access_token" in json.loads(response.read()))
"""


def _sql(podman, query: str) -> list[list[str]]:
    done = podman.exec("postgres", "psql", "-U", "airflow", "-d", "airflow", "-tA", "-F", "|", "-c", query)
    assert done.returncode == 0, done.stderr
    return [line.split("|") for line in done.stdout.splitlines() if line]


def test_the_compose_files_services_run_the_demo(podman, images):
    image = images["image"]
    env = {"AIRFLOW_JWT_SECRET": secrets.token_hex(32), "AIRFLOW_ADMIN_PASSWORD": f"pw-{secrets.token_hex(8)}",
           "MOP_AIRFLOW_IMAGE": image}
    all_services = services(COMPOSE_FILE, env)
    standin = f"localhost/{podman.prefix}-services:latest"
    podman.build(standin, STANDINS, STANDINS / "Dockerfile", {"DEBIAN_BASE": images["debian"]},
                 volumes=images["build_volumes"])
    all_services["minio"]["healthcheck"]["test"] = S3_UP
    order = start_order(all_services)
    assert set(order) == set(all_services) - {"airflow-cli"}
    compose = Compose(podman, COMPOSE_FILE, all_services,
                      {name: standin if name in STANDIN_COMMANDS else image for name in all_services})
    healthy: set[str] = set()
    for name in order:
        for needed, condition in (all_services[name].get("depends_on") or {}).items():
            if condition["condition"] == "service_healthy" and needed not in healthy:
                compose.healthy(needed)
                healthy.add(needed)
        if name in STANDIN_COMMANDS:
            compose.run(name, STANDIN_COMMANDS[name])
        elif name == "airflow-init":  # service_completed_successfully: the others wait for its end
            done = compose.run(name, detach=False)
            assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
            assert "example data in s3://mop/data/mnist1d/" in done.stdout
        else:
            compose.run(name)
    stopped = [name for name in order if name != "airflow-init" and not podman.running(name)]
    assert not stopped, {name: podman.logs(name) for name in stopped}

    # The pools the init service synced: the DAG's 4 shards, a slot each.
    assert sorted(map(tuple, _sql(podman, "SELECT pool, slots FROM slot_pool WHERE pool LIKE 'mop_shard_%'"))) == [
        (f"mop_shard_{s}", "1") for s in range(SHARDS)]
    # The admin logs in with AIRFLOW_ADMIN_PASSWORD (the pool check's connection holds the same).
    token = podman.exec("airflow-apiserver", "python", "-c", ADMIN_TOKEN)
    assert token.stdout.split() == ["201", "True"], token.stdout + token.stderr

    deadline = time.monotonic() + 300
    while not _sql(podman, f"SELECT dag_id FROM dag WHERE dag_id = '{DAG_ID}'"):
        assert time.monotonic() < deadline, podman.logs("airflow-dag-processor")
        time.sleep(5)
    for command in (["airflow", "dags", "unpause", DAG_ID], ["airflow", "dags", "trigger", DAG_ID]):
        done = podman.exec("airflow-scheduler", *command, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    deadline = time.monotonic() + 1500
    while True:
        ((run_id, state),) = _sql(podman, f"SELECT run_id, state FROM dag_run WHERE dag_id = '{DAG_ID}'")
        if state in ("success", "failed") or time.monotonic() > deadline:
            break
        time.sleep(10)
    tis = [dict(zip(("task_id", "state", "queue", "hostname"), row)) for row in _sql(
        podman, f"SELECT task_id, state, queue, hostname FROM task_instance WHERE dag_id = '{DAG_ID}'")]
    assert state == "success", ([t for t in tis if t["state"] != "success"],
                                {name: podman.logs(name, 30) for name in order if name.startswith("worker")})

    hostnames = {podman("inspect", "-f", "{{.Config.Hostname}}", f"{podman.prefix}-{name}").stdout.strip(): name
                 for name in order}
    ran = [t for t in tis if t["state"] == "success"]
    for shard in range(SHARDS):  # every shard's tasks on its own worker
        mine = {hostnames.get(t["hostname"]) for t in ran if t["queue"] == f"mop_shard_{shard}"}
        assert mine == {f"worker-shard-{shard}"}, mine
    assert {hostnames.get(t["hostname"]) for t in ran if not t["queue"].startswith("mop_shard_")} == {"worker-control"}
    board = podman.exec("airflow-scheduler", "python", "-c", READ_LEADERBOARD, DAG_ID, run_id)
    assert board.returncode == 0, board.stderr[-3000:]
    rows = json.loads(board.stdout.strip().splitlines()[-1])["leaderboard"]
    assert [r["rank"] for r in rows] == list(range(1, CONFIGURATIONS + 1))
    assert all(r["status"] == "finished" for r in rows), rows
    # the demo's grid on the compose file's smaller sample (4,000 of MNIST-1D, a fifth of the demo's, so it runs
    # in minutes on CPUs): a 1-D CNN wins, as in the demo (0.7875 here on 2026-12-06, 0.9465 on the demo's data)
    assert rows[0]["model"].endswith(":cnn") and rows[0]["val_accuracy"] > 0.7, rows[0]
