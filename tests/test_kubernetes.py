"""Kubernetes without a cluster: the Helm values (a worker set per shard) use only the chart's own
keys (its values schema, tests/data/helm/) and valid Kubernetes objects; shard tasks rendered as
pods sit on their shard's volume and GPUs; the demo DAG is left as it was; golden files show any
change in review. Regenerate the golden files after a deliberate change with
``MOP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_kubernetes.py``."""

from __future__ import annotations

import json
import os
import runpy
from pathlib import Path
from typing import Any

import pytest
import yaml

from mop_airflow.cli.main import main
from mop_airflow.errors import SpecError
from mop_airflow.deployment.helm_values import CACHE_PATH, CHART_VERSION, HelmValues
from mop_airflow.deployment.shard_pods import ShardPods
from mop_airflow.deployment.kubernetes_shape import ClusterShape
from tests.conftest import REPO
from tests.kubernetes_api import api_errors, assert_valid
from tests.test_spec import spec_dict

DATA = Path(__file__).parent / "data"
CHART_SCHEMA = DATA / "helm" / f"airflow-chart-{CHART_VERSION}-values.schema.subset.json"
GOLDEN = DATA / "kubernetes"
K8S_REF = "#/definitions/io.k8s.api.core.v1."


def chart_errors(value: Any, schema: dict, path: str) -> list[str]:
    """``value`` against the chart's schema: every key one the chart declares there, every leaf of its
    type, enum and pattern, and every Kubernetes object (``$ref``) valid for the Kubernetes API."""
    import jsonschema

    ref = schema.get("$ref", "")
    if ref.startswith(K8S_REF):
        return api_errors(value, "V1" + ref[len(K8S_REF):], path)
    errors = [f"{path}: {e.message}" for e in jsonschema.Draft7Validator(
        {k: v for k, v in schema.items() if k in ("type", "enum", "pattern", "required", "anyOf")}).iter_errors(value)]
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                errors.append(f"{path}.{key}: not a key of the chart's values here "
                              f"(keys: {sorted(schema['properties'])})")
            else:
                errors += chart_errors(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += chart_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def values_errors(values: dict) -> list[str]:
    """The chart's check of a whole values file, worker sets included: a set may hold any key of
    ``workers.celery`` or ``workers`` (the chart merges it over them) and its ``name``."""
    schema = json.loads(CHART_SCHEMA.read_text())
    errors = chart_errors(values, schema, "values")
    workers = schema["properties"]["workers"]
    set_schema = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        **workers["properties"], **workers["properties"]["celery"]["properties"]}}
    for i, entry in enumerate(values.get("workers", {}).get("celery", {}).get("sets", [])):
        errors += chart_errors(entry, set_schema, f"values.workers.celery.sets[{i}]")
    return errors


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MOP_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with MOP_UPDATE_GOLDEN=1 once"
    assert text == path.read_text(), f"{name} changed: review the diff, then MOP_UPDATE_GOLDEN=1 to accept it"


def env_of(container: dict) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


# --- the checkers themselves fail on what they are there to catch ---------------------------------

def test_the_api_check_refuses_what_the_kubernetes_client_would_silently_drop():
    assert api_errors({"key": "nvidia.com/gpu", "operator": "Exists"}, "V1Toleration") == []
    assert "not a field of V1Toleration" in api_errors({"key": "a", "operater": "Exists"}, "V1Toleration")[0]
    assert "str expected" in api_errors({"name": "x", "mountPath": 5}, "V1VolumeMount")[0]
    assert "mount_path" in api_errors({"name": "x"}, "V1VolumeMount")[0]  # a required field
    assert "not a field of V1Container" in api_errors({"spec": {"containers": [{"name": "base", "gpus": 1}]}},
                                                      "V1Pod")[0]


def test_the_chart_check_refuses_a_key_the_chart_does_not_have():
    assert values_errors({"workers": {"celery": {"sets": [{"name": "s", "queue": "q"}]}}}) == []
    assert "not a key of the chart's values" in values_errors({"workers": {"celery": {"concurrency": 2}}})[0]
    assert "not a key of the chart's values" in values_errors(
        {"workers": {"celery": {"sets": [{"name": "s", "toleration": []}]}}})[0]
    assert "is not of type 'string'" in values_errors({"env": [{"name": "A", "value": 1}]})[0]
    assert "V1ResourceRequirements" in values_errors({"workers": {"celery": {"sets": [
        {"name": "s", "resources": {"limit": {"nvidia.com/gpu": "1"}}}]}}})[0]


# --- the Helm values -------------------------------------------------------------------------------

SHAPES = [
    HelmValues(ClusterShape(1)),
    HelmValues(ClusterShape(4, 2, node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}),
               storage_class="premium-rwo", storage_size="200Gi", image="example.org/mop/worker:1.0"),
    HelmValues(ClusterShape(3, 1, gpus_per_slot=2), s3_secret=None),
]


@pytest.mark.parametrize("helm", SHAPES, ids=["1x1", "4x2-selector", "3x1-2gpus-no-s3"])
def test_every_key_of_the_values_is_the_charts_and_every_object_valid_kubernetes(helm):
    for text, values in ((helm.to_yaml(), helm.values()), (helm.shards_yaml(), helm.shard_values())):
        assert yaml.safe_load(text) == values  # each file is exactly the values, its header only comments
        assert values_errors(values) == []


def test_the_cuda_image_is_the_shard_releases_and_the_control_release_has_no_shard():
    helm = HelmValues(ClusterShape(2), image="example.org/w:cuda", control_image="example.org/w:cpu",
                      release="mop")
    control, shards = helm.values(), helm.shard_values()
    assert control["images"]["airflow"] == {"repository": "example.org/w", "tag": "cpu", "pullPolicy": "IfNotPresent"}
    assert shards["images"]["airflow"] == {"repository": "example.org/w", "tag": "cuda", "pullPolicy": "IfNotPresent"}
    assert "sets" not in control["workers"]["celery"] and shards["workers"]["celery"]["enableDefault"] is False
    # the shard release runs workers only, with the control release's Secrets and API server
    assert all(shards[c] == {"enabled": False} for c in ("scheduler", "apiServer", "dagProcessor", "triggerer",
                                                         "redis", "postgresql", "migrateDatabaseJob", "createUserJob"))
    assert shards["fernetKeySecretName"] == "mop-fernet-key" and shards["data"] == {
        "metadataSecretName": "mop-metadata", "brokerUrlSecretName": "mop-broker-url"}
    assert shards["config"]["core"] == {"execution_api_server_url": "http://mop-api-server:8080/execution/"}
    assert helm.shard_release == "mop-shards"


def test_a_worker_set_per_shard_on_its_queue_slots_gpus_and_cache_volume():
    helm = HelmValues(ClusterShape(4, 2, gpus_per_slot=1, node_selector={"pool": "gpu"}), storage_size="80Gi",
                      storage_class="fast")
    values, control = helm.shard_values(), helm.values()
    celery = values["workers"]["celery"]
    assert [s["name"] for s in celery["sets"]] == ["mop-shard-0", "mop-shard-1", "mop-shard-2", "mop-shard-3"]
    for s, entry in enumerate(celery["sets"]):
        assert entry["queue"] == f"mop_shard_{s}" and entry["replicas"] == 1
        assert env_of(entry) == {"AIRFLOW__CELERY__WORKER_CONCURRENCY": "2", "MOP_GPUS": "2", "MOP_SLOTS": "2",
                                 "KERAS_BACKEND": "jax"}
        assert entry["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
        assert entry["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert entry["nodeSelector"] == {"pool": "gpu"}
        assert entry["persistence"] == {"enabled": True}  # a StatefulSet: the same claim after a restart
        (template,) = entry["volumeClaimTemplates"]
        assert template["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "80Gi"}},
                                    "storageClassName": "fast"}
        assert entry["extraVolumeMounts"] == [{"name": template["metadata"]["name"], "mountPath": CACHE_PATH}]
    # the data and control tasks keep the default worker set (of the control release), with a concurrency of their own
    default = control["workers"]["celery"]
    assert default["enableDefault"] is True and default["queue"] == "default" and default["replicas"] == 1
    # every worker set's log claim (the chart's 100 Gi otherwise), in the shard volume's class
    assert celery["persistence"] == default["persistence"] == {"size": "5Gi", "storageClassName": "fast"}
    assert env_of(control["workers"]) == {"AIRFLOW__CELERY__WORKER_CONCURRENCY": "2"}
    for release in (control, values):  # the lost-worker bound of the Celery how-to holds on the chart's pods too
        assert env_of(release)["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT"] == "30"
        assert "preload_if_task_host()" in release["airflowLocalSettings"]


def test_the_cache_volume_is_where_the_worker_image_keeps_the_shard_cache():
    dockerfile = (REPO / "docker" / "worker.Dockerfile").read_text()
    assert "MOP_AIRFLOW_HOME=/opt/mop " in dockerfile and CACHE_PATH == "/opt/mop/cache"


def test_the_store_connection_and_the_api_login_come_from_secrets_and_never_sit_in_the_values():
    helm = HelmValues(ClusterShape(2), s3_secret="team-s3", s3_conn_id="minio_store", api_secret="team-api")
    for values in (helm.values(), helm.shard_values()):
        assert values["secret"] == [{"envName": "AIRFLOW_CONN_MINIO_STORE", "secretName": "team-s3",
                                     "secretKey": "AIRFLOW_CONN_MINIO_STORE"},
                                    {"envName": "AIRFLOW_CONN_MOP_AIRFLOW_API", "secretName": "team-api",
                                     "secretKey": "AIRFLOW_CONN_MOP_AIRFLOW_API"}]
        text = json.dumps(values)
        assert text.count("AIRFLOW_CONN_") == 4 and "aws_secret" not in text and "password" not in text
    assert "--api-secret team-api" in helm.command()
    neither = HelmValues(ClusterShape(2), s3_secret=None, api_secret=None)
    assert "secret" not in neither.values() and "secret" not in neither.shard_values()
    assert neither.command().endswith("--no-s3 --no-api-secret")
    with pytest.raises(SpecError, match="--api-secret"):
        HelmValues(ClusterShape(2), api_secret="Not A Name")


def test_the_values_file_says_how_to_write_it_again():
    helm = SHAPES[1]
    for text in (helm.to_yaml(), helm.shards_yaml()):
        written = next(line for line in text.splitlines() if line.startswith("# Written by: "))
        assert written == ("# Written by: mop-airflow k8s values --shards 4 --slots 2 --node-selector "
                           "cloud.google.com/gke-accelerator=nvidia-h100-80gb --image example.org/mop/worker:1.0 "
                           "--storage-size 200Gi --storage-class premium-rwo")


def test_the_command_writes_the_golden_values(tmp_path, capsys, monkeypatch):
    out = tmp_path / "values.yaml"
    assert main(["k8s", "values", "--shards", "4", "--slots", "1", "--node-selector", "pool=gpu",
                 "--out", str(out)]) == 0
    golden("helm-values-4-shards.yaml", out.read_text())
    golden("helm-values-4-shards-shards.yaml", (tmp_path / "values-shards.yaml").read_text())
    said = capsys.readouterr().err  # where each release's values are, and how to install them, in order
    assert said.index(f"release airflow (control plane, default worker): {out}") < said.index(
        "helm upgrade --install airflow apache-airflow/airflow") < said.index(
        "helm upgrade --install airflow-shards apache-airflow/airflow") < said.index("pools sync --shards 4")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)  # without --out: mop-values.yaml and mop-values-shards.yaml, here
    assert main(["k8s", "values", "--shards", "4", "--node-selector", "pool=gpu"]) == 0

    def body(path: Path) -> str:
        return "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#"))

    assert body(here / "mop-values.yaml") == body(out)
    assert body(here / "mop-values-shards.yaml") == body(tmp_path / "values-shards.yaml")
    assert "-f mop-values-shards.yaml" in (here / "mop-values.yaml").read_text()
    assert main(["k8s", "values", "--shards", "4", "--out", "-"]) == 2


@pytest.mark.parametrize("args, option, value, words", [
    (["--shards", "0"], "--shards", "0", "must be a whole number >= 1"),
    (["--shards", "257"], "--shards", "257", "must be at most 256"),
    (["--shards", "4", "--slots", "0"], "--slots", "0", "must be a whole number >= 1"),
    (["--shards", "4", "--gpus-per-slot", "0"], "--gpus-per-slot", "0", "must be a whole number >= 1"),
    (["--shards", "4", "--slots", "5", "--gpus-per-slot", "2"], "--slots", "5", "ask 10 GPUs of one node"),
    (["--shards", "4", "--slots", "3", "--gpus-per-node", "2"], "--slots", "3", "a node has 2"),
    (["--shards", "4", "--node-selector", "pool"], "--node-selector", "'pool'", "must be one node label as key=value"),
    (["--shards", "4", "--node-selector", "pool=a=b"], "--node-selector", "'pool=a=b'", "key=value"),
    (["--shards", "4", "--node-selector", "my pool=gpu"], "--node-selector", "'my pool'", "a node label key"),
    (["--shards", "4", "--node-selector", "pool=-gpu"], "--node-selector", "'pool=-gpu'", "a node label value"),
    (["--shards", "4", "--storage-size", "50GB"], "--storage-size", "'50GB'", "must be a Kubernetes quantity"),
    (["--shards", "4", "--log-size", "5 Gi"], "--log-size", "'5 Gi'", "must be a Kubernetes quantity"),
    (["--shards", "4", "--storage-class", "Fast_SSD"], "--storage-class", "'Fast_SSD'", "StorageClass"),
    (["--shards", "4", "--s3-secret", "S3"], "--s3-secret", "'S3'", "the name of a Kubernetes Secret"),
    (["--shards", "4", "--image", "Worker:cuda"], "--image", "'Worker:cuda'", "an image reference"),
    (["--shards", "4", "--control-image", "w@sha256:0"], "--control-image", "'w@sha256:0'", "an image reference"),
    (["--shards", "4", "--release", "Airflow"], "--release", "'Airflow'", "a Helm release name"),
])
def test_bad_input_names_the_option_the_value_the_rule_and_the_fix(args, option, value, words, capsys):
    assert main(["k8s", "values", *args]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"mop-airflow: {option}={value}: "), error
    assert words in error and ". Fix: " in error, error


# --- shard tasks as pods ---------------------------------------------------------------------------

def pod_overrides(dag) -> dict[str, dict]:
    from kubernetes.client import ApiClient

    return {t.task_id: ApiClient().sanitize_for_serialization(t.executor_config["pod_override"])
            for t in dag.tasks if t.executor_config}


@pytest.fixture(scope="module")
def pod_dag():
    from mop_airflow.airflow.dag import build_mop_dag

    return build_mop_dag(spec_dict(schedule__slots_per_shard=2), dag_id="mop_pods",
                         kubernetes=ShardPods(node_selector={"pool": "gpu"}, memory="16Gi"))


def test_each_shard_task_runs_as_a_pod_on_its_shards_volume_and_gpu(pod_dag):
    pods = pod_overrides(pod_dag)
    assert sorted(pods) == ["stage_shard_0", "stage_shard_1", "train_shard_0_slot_0", "train_shard_0_slot_1",
                            "train_shard_1_slot_0", "train_shard_1_slot_1"]
    for task_id, pod in pods.items():
        assert_valid(pod, "V1Pod", task_id)
        shard = int(task_id.split("_")[2])
        task = pod_dag.get_task(task_id)
        assert task.executor == "KubernetesExecutor" and task.queue == task.pool == f"mop_shard_{shard}"
        (volume,) = pod["spec"]["volumes"]
        assert volume["persistentVolumeClaim"] == {"claimName": f"mop-shard-{shard}-cache"}
        (container,) = pod["spec"]["containers"]
        assert container["name"] == "base"
        assert container["volumeMounts"] == [{"name": volume["name"], "mountPath": CACHE_PATH}]
        assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}
        assert pod["metadata"]["labels"]["mop-airflow/shard"] == str(shard)
        if task_id.startswith("train"):
            assert container["resources"] == {"limits": {"nvidia.com/gpu": "1", "memory": "16Gi"}}
            assert env_of(container) == {"MOP_GPUS": "1", "MOP_SLOTS": "1"}
            # two slot pods share the shard's ReadWriteOnce volume: on the node of the first
            term = pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
            assert term["labelSelector"] == {"matchLabels": {"mop-airflow/shard": str(shard)}}
        else:  # staging fills the volume and needs no GPU
            assert "resources" not in container and "affinity" not in pod["spec"]
    assert all(not t.executor_config and t.executor is None for t in pod_dag.tasks if t.task_id not in pods)


def test_the_pod_overrides_survive_airflows_serialization(pod_dag):
    from airflow.serialization.serialized_objects import DagSerialization

    again = DagSerialization.from_dict(DagSerialization.to_dict(pod_dag))
    assert pod_overrides(again) == pod_overrides(pod_dag)
    assert again.get_task("train_shard_1_slot_0").executor == "KubernetesExecutor"


def test_the_rendered_pod_overrides_are_the_golden_ones(pod_dag):
    golden("pod-overrides-2-shards-2-slots.yaml", yaml.safe_dump(pod_overrides(pod_dag), sort_keys=True))


def test_a_single_slot_pod_has_no_affinity_and_executor_none_leaves_the_default_executor():
    from mop_airflow.airflow.dag import build_mop_dag

    dag = build_mop_dag(spec_dict(), dag_id="one_slot", kubernetes={"executor": None, "gpus_per_slot": 2})
    train = dag.get_task("train_shard_0")
    pod = pod_overrides(dag)["train_shard_0"]
    assert train.executor is None and "affinity" not in pod["spec"]
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "2"}}


def test_the_cpu_demo_dag_is_unchanged_no_task_carries_executor_settings():
    dag = runpy.run_path(str(REPO / "dags" / "mop_mnist1d.py"))["dag"]
    assert len(dag.tasks) > 8
    assert [t.task_id for t in dag.tasks if t.executor_config or t.executor is not None] == []


@pytest.mark.parametrize("option, field, words", [
    ({"gpus_per_slot": 0}, "kubernetes.gpus_per_slot", "must be a whole number >= 1"),
    ({"volume_claim": "shard-cache"}, "kubernetes.volume_claim", "with {shard} in it"),
    ({"volume_claim": "Shard_{shard}"}, "kubernetes.volume_claim", "PersistentVolumeClaim"),
    ({"node_selector": {"pool": "g p u"}}, "kubernetes.node_selector", "a node label value"),
    ({"executor": "kubernetes"}, "kubernetes.executor", "must name one executor class"),
    ({"cache_path": "cache"}, "kubernetes.cache_path", "absolute path"),
    ({"memory": "16 GB"}, "kubernetes.memory", "Kubernetes quantity"),
    ({"gpu_per_slot": 1}, "kubernetes.gpu_per_slot", "did you mean 'gpus_per_slot'"),
])
def test_a_bad_kubernetes_option_fails_the_dag_naming_the_field(option, field, words):
    from mop_airflow.airflow.dag import build_mop_dag

    with pytest.raises(SpecError) as info:
        build_mop_dag(spec_dict(), dag_id="bad", kubernetes=option)
    assert info.value.field == field and words in str(info.value) and ". Fix: " in str(info.value)


def test_slots_a_node_cannot_hold_fail_the_dag_naming_the_spec_field():
    from mop_airflow.airflow.dag import build_mop_dag

    with pytest.raises(SpecError) as info:
        build_mop_dag(spec_dict(schedule__slots_per_shard=3), dag_id="bad",
                      kubernetes=ShardPods(gpus_per_slot=2, gpus_per_node=4))
    assert info.value.field == "schedule.slots_per_shard" and "ask 6 GPUs of one node" in str(info.value)


def test_the_shard_volumes_are_valid_claims_named_as_the_pods_mount_them(tmp_path):
    out = tmp_path / "volumes.yaml"
    assert main(["k8s", "volumes", "--shards", "3", "--storage-size", "100Gi", "--storage-class", "fast",
                 "--out", str(out)]) == 0
    claims = list(yaml.safe_load_all(out.read_text()))
    for s, claim in enumerate(claims):
        assert_valid(claim, "V1PersistentVolumeClaim", f"claim {s}")
        assert claim["metadata"]["name"] == ShardPods().claim(s) == f"mop-shard-{s}-cache"
        assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert len(claims) == 3
