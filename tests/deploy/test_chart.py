"""The image under the official Airflow Helm chart: docker/worker.Dockerfile built with podman, the chart
(1.19.0) rendered with helm from ``mop-airflow k8s values``, and every Airflow container of both releases
started as the chart would start it (tests/deploy/pods.py): the migrations and create-user jobs, the API
server, scheduler, DAG processor, triggerer and their log groomers, the default worker and a worker set
per shard, each with its own command, args, environment and mounts. Every liveness, readiness and startup
probe the chart gives them must pass, and then a search runs to success through them, every shard's
training on its own worker set.

The image is built FROM a stand-in for ``apache/airflow`` (tests/deploy/airflow_base: Debian bookworm
from ``debootstrap``, the airflow user 50000, /entrypoint, /clean-logs), because no image registry is
reachable where this runs; pip installs Airflow and the project inside the build as it would on the
official image. The chart's PostgreSQL and Redis images cannot be pulled either: the metadata database is
a database of the test's own on the machine's PostgreSQL and the broker a redis-server of its own, given
to the chart as an external database and broker are (``data.metadataConnection``, ``data.brokerUrl``).
The store and the data are on an S3 endpoint on loopback (moto's server), through the Secret ``mop-s3``
the user creates (docs/how-to/kubernetes.md). Containers share the host's network: the API server's
port is a free one (``ports.apiServer``, ``[api] port``), and Services resolve to 127.0.0.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from mop_airflow.deployment.helm_values import worker_set_name
from mop_airflow.deployment.local import free_port
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import dag_file, make_bucket
from tests.deploy.pods import Cluster, command_line, pods
from tests.helm_render import chart_dir, helm_binary, render
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]

SHARDS = 3
DAG_ID = "mop_chart_search"
BUCKET = "mop-chart"
RELEASE, SHARD_RELEASE = "airflow", "airflow-shards"
PROBE_TIMEOUT = 420  # the chart's startup probes allow the scheduler 10 x 30 s; the machine is shared


def search_image(podman, worker_image: str, tmp_path, s3_endpoint: str) -> str:
    """The worker image with the DAG files in it, as docs/how-to/kubernetes.md builds it; the DAG reads its
    data and keeps its store on S3 through the Secret's connection (data.conn_id, store.conn_id)."""
    make_bucket(s3_endpoint, BUCKET)
    digits = tmp_path / "digits.parquet"
    write_digits(digits)
    Store(f"s3://{BUCKET}", _s3_options(s3_endpoint)).fs.put(str(digits), f"{BUCKET}/data/digits.parquet")
    spec = tiny_spec(f"s3://{BUCKET}/data/digits.parquet", f"s3://{BUCKET}/runs", shards=SHARDS)
    spec["data"]["conn_id"] = spec["store"]["conn_id"] = "aws_default"
    context = tmp_path / "search-image"
    (context / "dags").mkdir(parents=True)
    dag_file(context / "dags", DAG_ID, spec)
    (context / "Dockerfile").write_text(f"FROM {worker_image}\nCOPY dags/ /opt/airflow/dags/\n")
    tag = f"localhost/{podman.prefix}-worker:chart-dags"
    podman.build(tag, context, context / "Dockerfile")
    return tag


def _s3_options(endpoint: str) -> dict:
    return {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint}}


def values(image: str, tmp_path, postgres_url: str, redis_url: str, api_port: int) -> tuple[str, str]:
    """``mop-airflow k8s values`` as the how-to runs it, and the settings of this cluster a user adds
    (an external database and broker, the API server's port): both releases' values, as YAML."""
    out = tmp_path / "mop-values.yaml"
    done = subprocess.run([sys.executable, "-m", "mop_airflow.cli.main", "k8s", "values", "--shards", str(SHARDS),
                           "--slots", "1", "--image", image, "--control-image", image, "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    database = postgres_url.rsplit("/", 1)[1]
    ours = {
        "postgresql": {"enabled": False}, "redis": {"enabled": False},
        "data": {"metadataConnection": {"user": "postgres", "pass": "", "protocol": "postgresql", "host": "127.0.0.1",
                                        "port": 5432, "db": database, "sslmode": "disable"},
                 "brokerUrl": redis_url},
        "ports": {"apiServer": api_port}, "config": {"api": {"port": api_port}},
    }
    execution_api = {"config": {"core": {"execution_api_server_url": f"http://{RELEASE}-api-server:{api_port}/execution/"},
                                "api": {"port": api_port}}}
    control = out.read_text() + "\n" + yaml.safe_dump(ours)
    shards = out.with_name("mop-values-shards.yaml").read_text()
    shards_values = yaml.safe_load(shards)
    shards_values["config"]["core"].update(execution_api["config"]["core"])
    shards_values["config"]["api"] = execution_api["config"]["api"]
    return control, yaml.safe_dump(shards_values)


def _db(postgres_url: str):
    import sqlalchemy  # noqa: PLC0415

    return sqlalchemy.create_engine(postgres_url, poolclass=sqlalchemy.pool.NullPool)


def _rows(engine, sql: str, **params) -> list[dict]:
    import sqlalchemy  # noqa: PLC0415

    with engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(sqlalchemy.text(sql), params)]


def test_every_chart_container_starts_passes_its_probes_and_runs_a_search(
        podman, worker_image, postgres_url, redis_url, s3_endpoint, tmp_path):
    helm = helm_binary(tmp_path / "helm-bin")
    chart = chart_dir()
    assert helm is not None and chart is not None, "helm (the test extra) and the chart's source (MOP_AIRFLOW_CHART)"
    image = search_image(podman, worker_image, tmp_path, s3_endpoint)
    api_port = free_port()
    control_yaml, shards_yaml = values(image, tmp_path, postgres_url, redis_url, api_port)
    docs = render(helm, chart, control_yaml, tmp_path, RELEASE) + render(helm, chart, shards_yaml, tmp_path, SHARD_RELEASE)
    connection = json.dumps({"conn_type": "aws", "login": "test", "password": "test",
                             "extra": {"endpoint_url": s3_endpoint}})
    all_pods = [p for p in pods(docs) if any(c["image"] == image for c in p.containers())]
    hosts = {f"{RELEASE}-api-server": "127.0.0.1", f"{RELEASE}-statsd": "127.0.0.1",
             **{p.hostname: "127.0.0.1" for p in all_pods}}
    # the Secrets the how-to creates: the store's connection, and the tasks' REST API login (the chart's
    # createUserJob makes admin/admin; its API server runs the FAB auth manager, which needs one)
    api_login = f"http://admin:admin@{RELEASE}-api-server:{api_port}"
    cluster = Cluster(podman, docs, tmp_path, hosts,
                      extra_secrets={"mop-s3": {"AIRFLOW_CONN_AWS_DEFAULT": connection},
                                     "mop-api": {"AIRFLOW_CONN_MOP_AIRFLOW_API": api_login}})

    # The jobs first (a cluster runs them at install; the others' init containers wait for the migrations).
    jobs = {p.name: p for p in all_pods if p.kind == "Job"}
    assert set(jobs) == {f"{RELEASE}-run-airflow-migrations", f"{RELEASE}-create-user"}
    for name in (f"{RELEASE}-run-airflow-migrations", f"{RELEASE}-create-user"):
        (container,) = jobs[name].containers()
        done = cluster.run(jobs[name], container, detach=False)
        assert done.returncode == 0, f"{name}: {command_line(container)}\n{(done.stdout + done.stderr)[-3000:]}"
    workloads = {p.name: p for p in all_pods if p.kind != "Job"}
    expected = {f"{RELEASE}-{c}" for c in ("api-server", "scheduler", "dag-processor", "triggerer", "worker")}
    expected |= {f"{SHARD_RELEASE}-worker-{worker_set_name(s)}" for s in range(SHARDS)}
    assert set(workloads) == expected
    with ThreadPoolExecutor(4) as pool:  # as a cluster starts them: together, each pod's init containers first
        list(pool.map(cluster.start, workloads.values()))

    def check(probe) -> str | None:
        name, kind, spec = probe
        ok, said = cluster.wait_for_probe(name, spec, PROBE_TIMEOUT)
        return None if ok else f"{name} {kind}: {said}\n--- its log:\n{podman.logs(name)}"

    with ThreadPoolExecutor(4) as pool:  # as the kubelet probes: every container at once
        failed = [said for said in pool.map(check, cluster.probes()) if said]
    assert not failed, "\n\n".join(failed)
    probed = {name for name, _, _ in cluster.probes()}
    assert probed >= {f"{p}-{c}" for p, c in [(f"{RELEASE}-api-server", "api-server"), (f"{RELEASE}-scheduler", "scheduler"),
                                              (f"{RELEASE}-dag-processor", "dag-processor"),
                                              (f"{RELEASE}-triggerer", "triggerer"), (f"{RELEASE}-worker", "worker")]}
    assert all(f"{SHARD_RELEASE}-worker-{worker_set_name(s)}-worker" in probed for s in range(SHARDS))
    stopped = [name for name in cluster.started if not podman.running(name)]
    assert not stopped, {name: podman.logs(name) for name in stopped}

    # A search, as the how-to runs one: the pools, then the DAG unpaused and triggered in the scheduler's pod.
    scheduler = f"{RELEASE}-scheduler-scheduler"
    engine = _db(postgres_url)
    deadline = time.monotonic() + 300
    while not _rows(engine, "SELECT dag_id FROM dag WHERE dag_id = :d", d=DAG_ID):
        assert time.monotonic() < deadline, f"the DAG processor never parsed {DAG_ID}:\n" + podman.logs(
            f"{RELEASE}-dag-processor-dag-processor")
        time.sleep(5)
    for command in (["mop-airflow", "pools", "sync", "--shards", str(SHARDS), "--slots", "1"],
                    ["airflow", "dags", "unpause", DAG_ID], ["airflow", "dags", "trigger", DAG_ID]):
        done = podman.exec(scheduler, *command, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    deadline = time.monotonic() + 900
    while True:
        (run,) = _rows(engine, "SELECT run_id, state FROM dag_run WHERE dag_id = :d", d=DAG_ID)
        if run["state"] in ("success", "failed") or time.monotonic() > deadline:
            break
        time.sleep(10)
    tis = _rows(engine, "SELECT task_id, map_index, state, queue, pool, hostname, try_number FROM task_instance "
                        "WHERE dag_id = :d AND run_id = :r", d=DAG_ID, r=run["run_id"])
    assert run["state"] == "success", ([t for t in tis if t["state"] != "success"],
                                       {name: podman.logs(name, 30) for name in cluster.started if "worker" in name})
    ran = [t for t in tis if t["state"] == "success"]
    for shard in range(SHARDS):  # every shard's task ran on its own worker set's pod
        mine = [t for t in ran if t["queue"] == f"mop_shard_{shard}"]
        assert mine and {t["hostname"] for t in mine} == {f"{SHARD_RELEASE}-worker-{worker_set_name(shard)}-0"}, mine
    assert {t["hostname"] for t in ran if not t["queue"].startswith("mop_shard_")} == {f"{RELEASE}-worker-0"}
    store = Store(f"s3://{BUCKET}/runs", _s3_options(s3_endpoint))
    board = store.read_json(RunLayout(store, DAG_ID, run["run_id"]).report_uri("leaderboard.json"))
    assert [r["rank"] for r in board["leaderboard"]] == [1, 2, 3]  # the three configurations, ranked
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in board["leaderboard"])
    stopped = [name for name in cluster.started if not podman.running(name)]
    assert not stopped, {name: podman.logs(name) for name in stopped}
