"""Shard tasks as Kubernetes pods: the ``executor_config`` pod override the DAG factory gives each
shard task when ``build_mop_dag(..., kubernetes=ShardPods(...))`` is set, and the shard volumes the
pods mount.

With the KubernetesExecutor (or Airflow 3's several executors, ``executor=`` per task) every task is a
pod. A block trains in one long task per shard slot, so a train pod starts once per block, not once
per hop; it claims its slot's GPU(s) and mounts its shard's PersistentVolumeClaim on the shard cache,
so the shard is read from the store once and found on the volume by every later block and run. The
stage task of a shard (which warms that cache) gets the same volume and node placement without a GPU:
a claim bound on first use (``WaitForFirstConsumer``) then lands in a zone of the GPU nodes.

The pod is plain data here, in the Kubernetes API's field names (``{"spec": {"containers": ...}}``);
:func:`executor_config` turns it into the client's ``V1Pod`` Airflow expects, and only it needs the
``kubernetes`` package (``pip install "mop-airflow[kubernetes]"``).
"""

from __future__ import annotations

import functools
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from mop_airflow.errors import MopError, SpecError
from mop_airflow.deployment.helm_values import CACHE_PATH, CACHE_VOLUME, GPU_TOLERATIONS
from mop_airflow.deployment.kubernetes_shape import GPU_RESOURCE, GPUS_PER_NODE, dns_subdomain, node_selector, \
    positive_int, quantity

BASE_CONTAINER = "base"  # the KubernetesExecutor runs the task in the pod template's container of this name
SHARD_LABEL = "mop-airflow/shard"
# The executor names Airflow accepts: a class name or its import path (the chart's executor pattern).
_EXECUTOR = re.compile(r"^(([A-Za-z_][A-Za-z0-9_]*\.)*[A-Z][A-Za-z0-9]+Executor)$")


@dataclass(frozen=True)
class ShardPods:
    """Run each shard task in a pod of its own, on its shard's volume and GPU(s).

    Attributes:
        executor: The executor of the shard tasks (``executor=`` of each task), e.g.
            ``"KubernetesExecutor"`` beside a default CeleryExecutor (``[core] executor =
            CeleryExecutor,KubernetesExecutor``). ``None``: the deployment's default executor, when that
            is the KubernetesExecutor.
        gpus_per_slot: GPUs each train pod asks for (``nvidia.com/gpu``), at least 1.
        gpus_per_node: GPUs of one node: a shard's slot pods share its volume, so they share a node.
        node_selector: Node labels the shard pods must carry (the GPU node pool's).
        volume_claim: The shard's PersistentVolumeClaim, ``{shard}`` replaced by the shard's number
            (``mop-airflow k8s volumes`` writes them).
        cache_path: Where the claim is mounted: the store spec's cache folder in the image
            (``/opt/mop/cache`` in docker/worker.Dockerfile).
        image: The pods' image; ``None``: the pod template's (the chart's ``images.airflow``).
        memory: Memory each train pod requests and is limited to (a Kubernetes quantity), or ``None``.
    """

    executor: str | None = "KubernetesExecutor"
    gpus_per_slot: int = 1
    gpus_per_node: int = GPUS_PER_NODE
    node_selector: Mapping[str, str] = field(default_factory=dict)
    volume_claim: str = "mop-shard-{shard}-cache"
    cache_path: str = CACHE_PATH
    image: str | None = None
    memory: str | None = None

    def __post_init__(self) -> None:
        if self.executor is not None and (not isinstance(self.executor, str) or not _EXECUTOR.match(self.executor)):
            raise SpecError("kubernetes.executor", self.executor, "must name one executor class, or be None",
                            'use "KubernetesExecutor" (listed in [core] executor), or None when the KubernetesExecutor '
                            "is the deployment's default")
        positive_int("kubernetes.gpus_per_slot", self.gpus_per_slot,
                     "every train task needs a GPU of its own: leave it out (1) or give e.g. 2")
        positive_int("kubernetes.gpus_per_node", self.gpus_per_node, "give the GPUs of one node, e.g. 8")
        object.__setattr__(self, "node_selector", node_selector("kubernetes.node_selector", self.node_selector))
        if not isinstance(self.volume_claim, str) or "{shard}" not in self.volume_claim:
            raise SpecError("kubernetes.volume_claim", self.volume_claim, "must name each shard's claim with {shard} "
                                                                          "in it", 'use e.g. "mop-shard-{shard}-cache"')
        dns_subdomain("kubernetes.volume_claim", self.volume_claim.replace("{shard}", "0"), "PersistentVolumeClaim",
                      '"mop-shard-{shard}-cache"')
        if not isinstance(self.cache_path, str) or not posixpath.isabs(self.cache_path):
            raise SpecError("kubernetes.cache_path", self.cache_path, "must be an absolute path in the container",
                            f'use the image\'s cache folder, "{CACHE_PATH}", or the store spec\'s cache_dir')
        if self.image is not None and (not isinstance(self.image, str) or not self.image.strip()
                                       or any(c.isspace() for c in self.image)):
            raise SpecError("kubernetes.image", self.image, "must be an image reference or None",
                            'use e.g. "example.org/mop-airflow-worker:cuda"')
        if self.memory is not None:
            quantity("kubernetes.memory", self.memory, '"16Gi"')

    @classmethod
    def of(cls, value: "ShardPods | Mapping[str, Any]") -> "ShardPods":
        """The option as given to ``build_mop_dag(kubernetes=...)``: a ShardPods or a dict of its fields."""
        if isinstance(value, ShardPods):
            return value
        if not isinstance(value, Mapping):
            raise SpecError("kubernetes", value, "must be a ShardPods or a dict of its fields",
                            'use e.g. kubernetes={"executor": "KubernetesExecutor", "gpus_per_slot": 1}')
        from mop_airflow.errors import unknown_key  # noqa: PLC0415

        unknown_key("kubernetes", value, cls.__dataclass_fields__, what="a ShardPods field")
        return cls(**value)

    def check_fits(self, slots: int) -> None:
        """A shard's slot pods share one node (their volume): refuse a spec whose slots it cannot hold."""
        if slots * self.gpus_per_slot > self.gpus_per_node:
            raise SpecError("schedule.slots_per_shard", slots,
                            f"{slots} slot pods x {self.gpus_per_slot} GPU(s) (kubernetes.gpus_per_slot) ask "
                            f"{slots * self.gpus_per_slot} GPUs of one node, which has {self.gpus_per_node} "
                            "(kubernetes.gpus_per_node): a shard's pods share its volume, so they share a node",
                            f"use at most {self.gpus_per_node // self.gpus_per_slot} slots per shard and more shards, "
                            "or fewer GPUs per slot")

    def claim(self, shard: int) -> str:
        return self.volume_claim.replace("{shard}", str(shard))

    def pod(self, shard: int, *, train: bool, slots: int = 1) -> dict[str, Any]:
        """The pod override of shard ``shard``'s train task (``train``) or its stage task."""
        container: dict[str, Any] = {"name": BASE_CONTAINER,
                                     "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": self.cache_path}]}
        if self.image is not None:
            container["image"] = self.image
        if train:
            limits = {GPU_RESOURCE: str(self.gpus_per_slot), **({"memory": self.memory} if self.memory else {})}
            container["resources"] = {"limits": limits}
            # One slot a pod: the pod sees only its own GPUs, and its task takes slot 0 of them.
            container["env"] = [{"name": "MOP_GPUS", "value": str(self.gpus_per_slot)},
                                {"name": "MOP_SLOTS", "value": "1"}]
        spec: dict[str, Any] = {
            "containers": [container],
            "volumes": [{"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": self.claim(shard)}}],
            "tolerations": [dict(t) for t in GPU_TOLERATIONS],
        }
        if self.node_selector:
            spec["nodeSelector"] = dict(self.node_selector)
        if train and slots > 1:
            # A ReadWriteOnce claim attaches to one node: the shard's slot pods go where the first one runs
            # (a pod that matches its own required affinity may start on a node with none of the others).
            spec["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {SHARD_LABEL: str(shard)}},
                "topologyKey": "kubernetes.io/hostname"}]}}
        labels = {"app.kubernetes.io/part-of": "mop-airflow", SHARD_LABEL: str(shard)}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": labels}, "spec": spec}

    def volume_claims(self, shards: int, *, size: str, storage_class: str | None = None) -> list[dict[str, Any]]:
        """The shards' PersistentVolumeClaims (``mop-airflow k8s volumes``), one per shard."""
        quantity("--storage-size", size, "--storage-size 50Gi")
        spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
        if storage_class is not None:
            spec["storageClassName"] = dns_subdomain("--storage-class", storage_class, "StorageClass",
                                                     "--storage-class standard-rwo")
        return [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": self.claim(s), "labels": {"app.kubernetes.io/part-of": "mop-airflow",
                                                                SHARD_LABEL: str(s)}},
                 "spec": spec} for s in range(shards)]


def executor_config(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``{"pod_override": V1Pod}``, as Airflow's KubernetesExecutor reads a task's ``executor_config``."""
    # The client has no public dict-to-model call (kubernetes-client/python#977); Airflow's own
    # pod deserialization uses this one.
    return {"pod_override": _api_client()._ApiClient__deserialize(dict(pod), "V1Pod")}  # noqa: SLF001


@functools.lru_cache(maxsize=1)
def _api_client() -> Any:
    """One client per process for every shard task a DAG file renders. A fresh Configuration keeps no
    in-cluster state in the models."""
    try:
        from kubernetes.client import Configuration  # noqa: PLC0415 - only DAGs with the option need it
        from kubernetes.client.api_client import ApiClient  # noqa: PLC0415
    except ImportError as exc:
        raise MopError('shard tasks as pods need the Kubernetes client: pip install "mop-airflow[kubernetes]"') \
            from exc
    return ApiClient(configuration=Configuration())
