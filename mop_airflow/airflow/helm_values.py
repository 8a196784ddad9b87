"""The values file of the official Apache Airflow Helm chart for a MOP deployment, as
``mop-airflow k8s values`` writes it.

The chart (1.19.0 and later) renders one Celery worker StatefulSet per entry of ``workers.celery.sets``;
each entry overrides the keys of ``workers`` and ``workers.celery`` for its set. A shard gets one:
queue ``mop_shard_<s>``, one replica, as many worker processes as slots, the slots' GPUs, the GPU
nodes' selector and taint toleration, ``MOP_GPUS``/``MOP_SLOTS`` for the slot placement
(:mod:`mop_airflow.training.devices`), Keras on JAX, and a volume claim template mounted on the shard
cache: the StatefulSet gives its one pod the same claim after every restart, so the shard is read from
the store once and stays on its volume across blocks and runs. The default worker set stays for the
data and control tasks (queue ``default``). The S3 store's connection comes from a Kubernetes
Secret the chart maps into every Airflow container; the values file never holds it.

Every worker StatefulSet also claims the chart's log volume (``logs``, 100 Gi unless sized): the chart
drops it only for a shared log volume (``logs.persistence``, ReadWriteMany) and makes a worker without
persistence a Deployment, which has no claim templates and so no shard volume. So it is sized
(``log_size``). The chart has one image for every Airflow component (``images.airflow``; no per-worker
image in 1.19.0): the scheduler, API server and DAG processor run the worker image too, and need
mop_airflow in it to parse the DAGs anyway.

The keys written here are checked against the chart's values schema in the tests
(``tests/data/helm/``), for :data:`CHART_VERSION`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mop_airflow.airflow.celery_config import GPU_WORKER_ENV, lost_worker_settings
from mop_airflow.airflow.preload import LOCAL_SETTINGS
from mop_airflow.errors import SpecError
from mop_airflow.airflow.kubernetes_shape import GPU_RESOURCE, GPUS_PER_NODE, ClusterShape, dns_subdomain, positive_int, \
    quantity
from mop_airflow.planning.task_plan import shard_pool

CHART_VERSION = "1.19.0"  # the first chart with workers.celery.sets and workers.celery.persistence
AIRFLOW_VERSION = "3.3.1"  # the Airflow the worker image installs; the chart makes choices by it
# docker/worker.Dockerfile built with TF_PACKAGE="tensorflow[and-cuda]" and JAX_PACKAGE="jax[cuda12]"
DEFAULT_IMAGE = "mop-airflow-worker:cuda"
CACHE_VOLUME = "mop-shard-cache"
CACHE_PATH = "/opt/mop/cache"  # the worker image's MOP_AIRFLOW_HOME/cache: the store spec's default cache_dir
# GPU node pools carry this taint (GKE and AKS add it; EKS and the NVIDIA GPU operator are set up so):
# only pods that tolerate it, ours, land there.
GPU_TOLERATIONS = ({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},)
_REPOSITORY = re.compile(r"^[a-z0-9]([a-z0-9._:/-]*[a-z0-9])?$")  # registry[:port]/path, lower case
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def worker_set_name(shard: int) -> str:
    """``mop-shard-<s>``: the chart names the set's StatefulSet ``<release>-worker-mop-shard-<s>``."""
    return f"mop-shard-{shard}"


def split_image(image: object) -> tuple[str, str]:
    """``repository[:tag]`` as the chart's ``images.airflow.repository`` and ``tag`` (default ``latest``)."""
    repository, tag = image, "latest"
    if isinstance(image, str) and ":" in image.rsplit("/", 1)[-1]:
        repository, tag = image.rsplit(":", 1)
    if not isinstance(repository, str) or not _REPOSITORY.match(repository) or "//" in repository \
            or not _TAG.match(tag):
        raise SpecError("--image", image, "must be an image reference repository[:tag] (the repository in lower "
                                          "case), without a digest",
                        "build docker/worker.Dockerfile with --build-arg TF_PACKAGE=\"tensorflow[and-cuda]\", push "
                        "it, and give e.g. --image example.org/mop-airflow-worker:cuda")
    return repository, tag


@dataclass(frozen=True)
class HelmValues:
    """What ``mop-airflow k8s values`` was asked for; :meth:`values` is the chart's values."""

    shape: ClusterShape
    image: str = DEFAULT_IMAGE
    storage_size: str = "50Gi"
    log_size: str = "5Gi"  # task logs of a few tasks a block; the log groomer deletes them after 15 days
    storage_class: str | None = None
    s3_secret: str | None = "mop-s3"
    s3_conn_id: str = "aws_default"
    control_concurrency: int = 2

    def __post_init__(self) -> None:
        split_image(self.image)
        quantity("--storage-size", self.storage_size, "--storage-size 50Gi (at least the shard, its validation "
                                                      "split and their decoded copies)")
        quantity("--log-size", self.log_size, "--log-size 5Gi (the worker's task logs)")
        if self.storage_class is not None:
            dns_subdomain("--storage-class", self.storage_class, "StorageClass", "--storage-class standard-rwo "
                                                                                  "(kubectl get storageclass)")
        if self.s3_secret is not None:
            dns_subdomain("--s3-secret", self.s3_secret, "Secret", "--s3-secret mop-s3")
        if not isinstance(self.s3_conn_id, str) or not re.match(r"^[A-Za-z0-9_]+$", self.s3_conn_id):
            raise SpecError("--s3-conn-id", self.s3_conn_id, "must be an Airflow connection id of letters, "
                            "digits and '_'", "use the store spec's conn_id, e.g. aws_default")
        positive_int("--control-concurrency", self.control_concurrency,
                     "give the data and control tasks the default worker runs at once, e.g. 2")

    @property
    def s3_env(self) -> str:
        """The variable Airflow reads the connection from: ``AIRFLOW_CONN_<CONN_ID>``."""
        return f"AIRFLOW_CONN_{self.s3_conn_id.upper()}"

    def command(self) -> str:
        """The command that writes these values: the values file says how to write it again."""
        shape = self.shape
        parts = [f"mop-airflow k8s values --shards {shape.shards} --slots {shape.slots}"]
        if shape.gpus_per_slot != 1:
            parts.append(f"--gpus-per-slot {shape.gpus_per_slot}")
        if shape.gpus_per_node != GPUS_PER_NODE:
            parts.append(f"--gpus-per-node {shape.gpus_per_node}")
        parts += [f"--node-selector {key}={value}" for key, value in shape.node_selector.items()]
        defaults = {field: HelmValues.__dataclass_fields__[field].default for field in
                    ("image", "storage_size", "log_size", "storage_class", "s3_secret", "s3_conn_id", "control_concurrency")}
        for name, default in defaults.items():
            value = getattr(self, name)
            if value != default:
                parts.append(f"--{name.replace('_', '-')} {value}" if value is not None else "--no-s3")
        return " ".join(parts)

    def values(self) -> dict[str, Any]:
        repository, tag = split_image(self.image)
        shape = self.shape
        env = [{"name": key, "value": value} for key, value in lost_worker_settings().items()]
        values: dict[str, Any] = {
            "executor": "CeleryExecutor",
            "airflowVersion": AIRFLOW_VERSION,
            "images": {"airflow": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}},
            # Replaces the chart's own airflow_local_settings.py (mounted over the image's): Celery workers
            # import Keras once and fork every task with it (mop_airflow.airflow.preload).
            "airflowLocalSettings": LOCAL_SETTINGS,
            "env": env,
        }
        if self.s3_secret is not None:
            values["secret"] = [{"envName": self.s3_env, "secretName": self.s3_secret, "secretKey": self.s3_env}]
        values["workers"] = {
            # The default worker set, for preflight, the data, plan, report and decision tasks (queue default).
            "env": [{"name": "AIRFLOW__CELERY__WORKER_CONCURRENCY", "value": str(self.control_concurrency)}],
            "celery": {"enableDefault": True, "replicas": 1, "queue": "default",
                       "persistence": self.log_claim(),  # every worker set's, the default one's too
                       "sets": [self.worker_set(s) for s in range(shape.shards)]},
        }
        return values

    def log_claim(self) -> dict[str, Any]:
        """The chart's log volume of each worker StatefulSet, at ``log_size`` (module docstring)."""
        claim: dict[str, Any] = {"size": self.log_size}
        if self.storage_class is not None:  # as the shard volume: both bind in the zone of the pod's node
            claim["storageClassName"] = self.storage_class
        return claim

    def worker_set(self, shard: int) -> dict[str, Any]:
        """Shard ``shard``'s worker set: its queue, its slots, their GPUs, its cache volume."""
        shape = self.shape
        claim: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                 "resources": {"requests": {"storage": self.storage_size}}}
        if self.storage_class is not None:
            claim["storageClassName"] = self.storage_class
        entry: dict[str, Any] = {
            "name": worker_set_name(shard),
            "queue": shard_pool(shard),
            "replicas": 1,  # one pod per shard: a second would read the shard again, onto a volume of its own
            "persistence": {"enabled": True},  # a StatefulSet: the same claim after every restart
            "resources": {"limits": {GPU_RESOURCE: str(shape.gpus_per_shard)}},
            "tolerations": [dict(t) for t in GPU_TOLERATIONS],
            # The set's env replaces the parent's (lists are not merged): everything the shard needs is here.
            "env": [{"name": "AIRFLOW__CELERY__WORKER_CONCURRENCY", "value": str(shape.slots)},
                    {"name": "MOP_GPUS", "value": str(shape.gpus_per_shard)},
                    {"name": "MOP_SLOTS", "value": str(shape.slots)},
                    *({"name": key, "value": value} for key, value in GPU_WORKER_ENV.items())],
            "volumeClaimTemplates": [{"metadata": {"name": CACHE_VOLUME}, "spec": claim}],
            "extraVolumeMounts": [{"name": CACHE_VOLUME, "mountPath": CACHE_PATH}],
        }
        if shape.node_selector:
            entry["nodeSelector"] = dict(shape.node_selector)
        return entry

    def to_yaml(self) -> str:
        import yaml  # noqa: PLC0415 - only the command writes YAML

        shape = self.shape
        header = [
            f"# Values for the official Apache Airflow Helm chart {CHART_VERSION} (or later): a Celery worker set per "
            f"shard ({shape.shards} x {shape.slots} slot(s), {shape.gpus_per_slot} GPU(s) a slot).",
            f"# Written by: {self.command()}",
            "# helm upgrade --install airflow apache-airflow/airflow -f THIS_FILE; then the shard pools:",
            f"# kubectl exec deploy/airflow-scheduler -- mop-airflow pools sync --shards {shape.shards} "
            f"--slots {shape.slots}",
            "# The shard workers run Keras on JAX: the image needs JAX for CUDA (docker/worker.Dockerfile, "
            "--build-arg JAX_PACKAGE=\"jax[cuda12]\").",
        ]
        if self.s3_secret is not None:
            header.append(f"# The store's connection comes from the Secret {self.s3_secret} (key {self.s3_env}); "
                          "create it first (docs/how-to/kubernetes.md).")
        body = yaml.dump(self.values(), Dumper=_block_dumper(), sort_keys=False, default_flow_style=False, width=120)
        return "\n".join(header) + "\n" + body


def _block_dumper() -> type:
    """A safe YAML dumper that writes a multi-line string as a ``|`` block, as a person would."""
    import yaml  # noqa: PLC0415

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: Any, value: str) -> Any:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return Dumper
