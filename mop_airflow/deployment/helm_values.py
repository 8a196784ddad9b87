"""The values files of the official Apache Airflow Helm chart for a MOP deployment, as
``mop-airflow k8s values`` writes them: two releases of the chart, so that only the shard workers run
the CUDA image.

The chart (1.19.0) has one image for every Airflow component (``images.airflow``), and a worker set
can override only the keys of ``workers`` and ``workers.celery``, not the image. So:

- **The control release** (``release``, ``airflow`` by default: :meth:`HelmValues.values`): the API
  server, scheduler, DAG processor, triggerer, PostgreSQL, Redis and the default worker set (queue
  ``default``: preflight, the data, plan, report and decision tasks), on ``control_image``, the worker
  image built without CUDA (Keras on TensorFlow's CPU build: the report task saves the best model).
- **The shard release** (``<release>-shards``: :meth:`HelmValues.shard_values`): only a Celery worker
  set per shard, on ``image``, the CUDA build. Everything else of the chart is off, and its workers use
  the control release's Secrets (Fernet key, metadata connection, broker URL, JWT secret, API secret
  key, by the names the chart gives them: ``<release>-fernet-key`` and so on) and its API server
  (``core.execution_api_server_url``) and StatsD. The tests render both releases and check that a shard
  worker runs with what the default worker runs with but for its own set's keys.

The chart renders one Celery worker StatefulSet per entry of ``workers.celery.sets``; each entry
overrides the keys of ``workers`` and ``workers.celery`` for its set. A shard gets one: queue
``mop_shard_<s>``, one replica, as many worker processes as slots, the slots' GPUs, the GPU nodes'
selector and taint toleration, ``MOP_GPUS``/``MOP_SLOTS`` for the slot placement
(:mod:`mop_airflow.training.devices`), Keras on JAX, and a volume claim template mounted on the shard
cache: the StatefulSet gives its one pod the same claim after every restart, so the shard is read from
the store once and stays on its volume across blocks and runs. The S3 store's connection comes from a
Kubernetes Secret the chart maps into every Airflow container of both releases; the values files never
hold it.

Every worker StatefulSet also claims the chart's log volume (``logs``, 100 Gi unless sized): the chart
drops it only for a shared log volume (``logs.persistence``, ReadWriteMany) and makes a worker without
persistence a Deployment, which has no claim templates and so no shard volume. So it is sized
(``log_size``).

The keys written here are checked against the chart's values schema in the tests
(``tests/data/helm/``), for :data:`CHART_VERSION`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mop_airflow.deployment.celery_config import GPU_WORKER_ENV, lost_worker_settings
from mop_airflow.deployment.preload import LOCAL_SETTINGS
from mop_airflow.errors import SpecError
from mop_airflow.hooks.rest import API_CONN_ID
from mop_airflow.deployment.kubernetes_shape import GPU_RESOURCE, GPUS_PER_NODE, ClusterShape, dns_subdomain, \
    positive_int, quantity
from mop_airflow.planning.task_plan import shard_pool

CHART_VERSION = "1.19.0"  # the first chart with workers.celery.sets and workers.celery.persistence
AIRFLOW_VERSION = "3.3.1"  # the Airflow the worker image installs; the chart makes choices by it
# docker/worker.Dockerfile built with TF_PACKAGE="tensorflow[and-cuda]" and JAX_PACKAGE="jax[cuda12]": the shard workers
DEFAULT_IMAGE = "mop-airflow-worker:cuda"
# docker/worker.Dockerfile built as it is (TensorFlow's CPU build, no CUDA): every other Airflow component
CONTROL_IMAGE = "mop-airflow-worker:cpu"
RELEASE = "airflow"  # the control release's name; the shard workers are the release <RELEASE>-shards
API_SERVER_PORT = 8080  # the chart's ports.apiServer
# The chart's components the shard release leaves to the control release.
OFF_IN_SHARD_RELEASE = ("scheduler", "apiServer", "dagProcessor", "triggerer", "statsd", "redis", "postgresql",
                        "migrateDatabaseJob", "createUserJob")
CACHE_VOLUME = "mop-shard-cache"
CACHE_PATH = "/opt/mop/cache"  # the worker image's MOP_HOME/cache: the store spec's default cache_dir
# GPU node pools carry this taint (GKE and AKS add it; EKS and the NVIDIA GPU operator are set up so):
# only pods that tolerate it, ours, land there.
GPU_TOLERATIONS = ({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},)
_REPOSITORY = re.compile(r"^[a-z0-9]([a-z0-9._:/-]*[a-z0-9])?$")  # registry[:port]/path, lower case
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# A Helm release name: a DNS label of at most 53 characters; 46 here, so that <release>-shards fits.
_RELEASE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,44}[a-z0-9])?$")


def worker_set_name(shard: int) -> str:
    """``mop-shard-<s>``: the chart names the set's StatefulSet ``<release>-worker-mop-shard-<s>``."""
    return f"mop-shard-{shard}"


def split_image(image: object, option: str = "--image") -> tuple[str, str]:
    """``repository[:tag]`` as the chart's ``images.airflow.repository`` and ``tag`` (default ``latest``)."""
    repository, tag = image, "latest"
    if isinstance(image, str) and ":" in image.rsplit("/", 1)[-1]:
        repository, tag = image.rsplit(":", 1)
    if not isinstance(repository, str) or not _REPOSITORY.match(repository) or "//" in repository \
            or not _TAG.match(tag):
        example = "--image example.org/mop-airflow-worker:cuda" if option == "--image" else \
            f"{option} example.org/mop-airflow-worker:cpu"
        raise SpecError(option, image, "must be an image reference repository[:tag] (the repository in lower "
                                       "case), without a digest",
                        "build docker/worker.Dockerfile (with --build-arg TF_PACKAGE=\"tensorflow[and-cuda]\" for the "
                        f"shard workers' CUDA image), push it, and give e.g. {example}")
    return repository, tag


@dataclass(frozen=True)
class HelmValues:
    """What ``mop-airflow k8s values`` was asked for: :meth:`values` are the control release's values,
    :meth:`shard_values` the shard release's (module docstring)."""

    shape: ClusterShape
    image: str = DEFAULT_IMAGE  # the shard workers' (CUDA)
    control_image: str = CONTROL_IMAGE  # every other Airflow component's (no CUDA)
    release: str = RELEASE
    storage_size: str = "50Gi"
    log_size: str = "5Gi"  # task logs of a few tasks a block; the log groomer deletes them after 15 days
    storage_class: str | None = None
    s3_secret: str | None = "mop-s3"
    s3_conn_id: str = "aws_default"
    # the REST API login the tasks sign in with (the pools, a never-started task failed): the chart's API server
    # runs the FAB auth manager, which gives no token without one
    api_secret: str | None = "mop-api"
    control_concurrency: int = 2

    def __post_init__(self) -> None:
        split_image(self.image)
        split_image(self.control_image, "--control-image")
        if not isinstance(self.release, str) or not _RELEASE.match(self.release):
            raise SpecError("--release", self.release, "must be a Helm release name: lower-case letters, digits and "
                            "'-', at most 46 characters (the shard workers' release adds -shards)",
                            "--release airflow")
        quantity("--storage-size", self.storage_size, "--storage-size 50Gi (at least the shard, its validation "
                                                      "split and their decoded copies)")
        quantity("--log-size", self.log_size, "--log-size 5Gi (the worker's task logs)")
        if self.storage_class is not None:
            dns_subdomain("--storage-class", self.storage_class, "StorageClass", "--storage-class standard-rwo "
                                                                                  "(kubectl get storageclass)")
        if self.s3_secret is not None:
            dns_subdomain("--s3-secret", self.s3_secret, "Secret", "--s3-secret mop-s3")
        if self.api_secret is not None:
            dns_subdomain("--api-secret", self.api_secret, "Secret", "--api-secret mop-api")
        if not isinstance(self.s3_conn_id, str) or not re.match(r"^[A-Za-z0-9_]+$", self.s3_conn_id):
            raise SpecError("--s3-conn-id", self.s3_conn_id, "must be an Airflow connection id of letters, "
                            "digits and '_'", "use the store spec's conn_id, e.g. aws_default")
        positive_int("--control-concurrency", self.control_concurrency,
                     "give the data and control tasks the default worker runs at once, e.g. 2")

    @property
    def s3_env(self) -> str:
        """The variable Airflow reads the connection from: ``AIRFLOW_CONN_<CONN_ID>``."""
        return f"AIRFLOW_CONN_{self.s3_conn_id.upper()}"

    @property
    def api_env(self) -> str:
        """The variable Airflow reads the tasks' REST API connection from."""
        return f"AIRFLOW_CONN_{API_CONN_ID.upper()}"

    @property
    def shard_release(self) -> str:
        """The shard workers' release: ``<release>-shards``."""
        return f"{self.release}-shards"

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
                    ("image", "control_image", "release", "storage_size", "log_size", "storage_class", "s3_secret",
                     "s3_conn_id", "api_secret", "control_concurrency")}
        left_out = {"s3_secret": "--no-s3", "api_secret": "--no-api-secret"}
        for name, default in defaults.items():
            value = getattr(self, name)
            if value != default:
                parts.append(f"--{name.replace('_', '-')} {value}" if value is not None else left_out[name])
        return " ".join(parts)

    def _common(self, image: str) -> dict[str, Any]:
        """What both releases' Airflow containers share: the executor, the image, the preload hook, the
        lost-worker settings and the store's connection."""
        repository, tag = split_image(image)
        values: dict[str, Any] = {
            "executor": "CeleryExecutor",
            "airflowVersion": AIRFLOW_VERSION,
            "images": {"airflow": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"}},
            # Replaces the chart's own airflow_local_settings.py (mounted over the image's): Celery workers
            # import Keras once and fork every task with it (mop_airflow.deployment.preload).
            "airflowLocalSettings": LOCAL_SETTINGS,
            "env": [{"name": key, "value": value} for key, value in lost_worker_settings().items()],
        }
        secrets = [(self.s3_env, self.s3_secret), (self.api_env, self.api_secret)]
        if any(name is not None for _, name in secrets):
            values["secret"] = [{"envName": env, "secretName": name, "secretKey": env} for env, name in secrets
                                if name is not None]
        return values

    def values(self) -> dict[str, Any]:
        """The control release's values: the chart's components and the default worker set, on the image
        without CUDA."""
        values = self._common(self.control_image)
        values["workers"] = {
            # The default worker set, for preflight, the data, plan, report and decision tasks (queue default).
            "env": [{"name": "AIRFLOW__CELERY__WORKER_CONCURRENCY", "value": str(self.control_concurrency)}],
            "celery": {"enableDefault": True, "replicas": 1, "queue": "default",
                       "persistence": self.log_claim()},
        }
        return values

    def shard_values(self) -> dict[str, Any]:
        """The shard release's values: a worker set per shard on the CUDA image, the rest of the chart off,
        the control release's Secrets, API server and StatsD (module docstring)."""
        release = self.release
        values = self._common(self.image)
        values.update({
            # The chart's names of the control release's Secrets (airflow.fullname is the release's name).
            "fernetKeySecretName": f"{release}-fernet-key",
            "jwtSecretName": f"{release}-jwt-secret",
            "apiSecretKeySecretName": f"{release}-api-secret-key",
            "data": {"metadataSecretName": f"{release}-metadata", "brokerUrlSecretName": f"{release}-broker-url"},
            "config": {"core": {"execution_api_server_url": f"http://{release}-api-server:{API_SERVER_PORT}/execution/"},
                       # the chart writes StatsD's settings under [metrics] and, for older Airflows, [scheduler]
                       **{section: {"statsd_on": "True", "statsd_host": f"{release}-statsd"}
                          for section in ("metrics", "scheduler")}},
            **{component: {"enabled": False} for component in OFF_IN_SHARD_RELEASE},
        })
        values["workers"] = {"celery": {
            "enableDefault": False,  # the control release's default worker takes queue default
            "persistence": self.log_claim(),
            "sets": [self.worker_set(s) for s in range(self.shape.shards)]}}
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

    def helm_commands(self, control_file: str, shards_file: str) -> list[str]:
        """How to install both releases (the control release first: it makes the Secrets the shard release
        reads), then the shard pools."""
        shape, chart = self.shape, f"apache-airflow/airflow --version {CHART_VERSION}"
        return [f"helm upgrade --install {self.release} {chart} -n airflow -f {control_file}",
                f"helm upgrade --install {self.shard_release} {chart} -n airflow -f {shards_file}",
                f"kubectl -n airflow exec deploy/{self.release}-scheduler -- mop-airflow pools sync "
                f"--shards {shape.shards} --slots {shape.slots}"]

    def to_yaml(self, shards_file: str = "mop-values-shards.yaml", control_file: str = "mop-values.yaml") -> str:
        """The control release's values file."""
        header = [
            f"# Values for the official Apache Airflow Helm chart {CHART_VERSION}: the release {self.release}, the API "
            "server, scheduler, DAG processor, triggerer and the default worker",
            f"# on {self.control_image} (no CUDA). The shard workers are the release {self.shard_release} "
            f"({shards_file}).",
            f"# Written by: {self.command()}",
            *(f"# {line}" for line in self.helm_commands(control_file, shards_file)),
        ]
        return self._file(header, self.values())

    def shards_yaml(self, control_file: str = "mop-values.yaml", shards_file: str = "mop-values-shards.yaml") -> str:
        """The shard release's values file."""
        shape = self.shape
        header = [
            f"# Values for the official Apache Airflow Helm chart {CHART_VERSION}: the release {self.shard_release}, "
            f"a Celery worker set per shard ({shape.shards} x {shape.slots} slot(s),",
            f"# {shape.gpus_per_slot} GPU(s) a slot) on {self.image}, with the Secrets and the API server of the "
            f"release {self.release} ({control_file}), installed first.",
            f"# Written by: {self.command()}",
            *(f"# {line}" for line in self.helm_commands(control_file, shards_file)),
            "# The shard workers run Keras on JAX: the image needs JAX for CUDA (docker/worker.Dockerfile, "
            "--build-arg JAX_PACKAGE=\"jax[cuda12]\").",
        ]
        return self._file(header, self.shard_values())

    def _file(self, header: list[str], values: dict[str, Any]) -> str:
        import yaml  # noqa: PLC0415 - only the command writes YAML

        if self.s3_secret is not None:
            header.append(f"# The store's connection comes from the Secret {self.s3_secret} (key {self.s3_env}); "
                          "create it first (docs/how-to/kubernetes.md).")
        if self.api_secret is not None:
            header.append(f"# The tasks' REST API login comes from the Secret {self.api_secret} (key {self.api_env}): "
                          "a user who may edit pools; create it first (docs/how-to/kubernetes.md).")
        body = yaml.dump(values, Dumper=_block_dumper(), sort_keys=False, default_flow_style=False, width=120)
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
