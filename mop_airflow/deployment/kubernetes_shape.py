"""What a cluster must hold for a MOP search, checked before anything is written: shards, slots per
shard, GPUs per slot, the GPUs one node has, where the pods may go, and the names and sizes the
generated objects carry. Every refusal names the option, the value, the rule and the fix.

A shard's slots run in one pod (a Celery worker set of one replica, or the shard's volume shared by
its train pods), so a shard's GPUs must all be on one node: slots x GPUs per slot <= GPUs per node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from mop_airflow.errors import SpecError

MAX_SHARDS = 256  # one Airflow pool and one queue each, as schedule.shards allows
GPUS_PER_NODE = 8  # the most GPUs the common GPU nodes carry (8 x A100/H100/H200)
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's extended resource

# Kubernetes's own rules (apimachinery validation): a DNS-1123 label / subdomain, a label key's
# optional prefix and name, a label value, and a resource quantity.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


def positive_int(option: str, value: object, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(option, value, "must be a whole number >= 1", fix)
    return value


def dns_subdomain(option: str, value: object, what: str, example: str) -> str:
    """A Kubernetes object name (a Secret, a StorageClass, a PersistentVolumeClaim)."""
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise SpecError(option, value, f"must be the name of a Kubernetes {what}: lower-case letters, digits, '-' "
                                       "and '.', starting and ending with a letter or digit, at most 253 characters",
                        f"use e.g. {example}")
    return value


def quantity(option: str, value: object, example: str) -> str:
    if not isinstance(value, str) or not _QUANTITY.match(value):
        raise SpecError(option, value, "must be a Kubernetes quantity: a number with an optional unit (Ki, Mi, Gi, "
                                       "Ti, k, M, G, T)", f"use e.g. {example}")
    return value


def _label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and bool(_LABEL_NAME.match(value)))


def node_selector(option: str, pairs: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    """``["k=v", ...]`` (or a mapping) as a node selector; each key and value by Kubernetes's label rules."""
    items = pairs.items() if isinstance(pairs, Mapping) else [_split_pair(option, pair) for pair in pairs]
    out: dict[str, str] = {}
    for key, value in items:
        if not isinstance(key, str) or not _label_key(key):
            raise SpecError(option, key, "a node label key is an optional DNS prefix and '/', then a name of at "
                                         "most 63 letters, digits, '-', '_' or '.'",
                            "use e.g. cloud.google.com/gke-accelerator=nvidia-h100-80gb or pool=gpu")
        if not isinstance(value, str) or not _label_value(value):
            raise SpecError(option, f"{key}={value}", "a node label value is at most 63 letters, digits, '-', '_' "
                                                      "or '.', starting and ending with a letter or digit",
                            f"use e.g. {key}=gpu")
        out[key] = value
    return out


def _split_pair(option: str, pair: object) -> tuple[str, str]:
    if not isinstance(pair, str) or pair.count("=") != 1 or pair.startswith("="):
        raise SpecError(option, pair, "must be one node label as key=value",
                        "repeat the option for each label, e.g. --node-selector pool=gpu "
                        "--node-selector nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
    key, value = pair.split("=")
    return key, value


@dataclass(frozen=True)
class ClusterShape:
    """``shards`` worker sets (or shard volumes) of ``slots`` train tasks, each slot on ``gpus_per_slot``
    GPUs; a shard's slots share one node of ``gpus_per_node`` GPUs. ``node_selector``: the GPU nodes."""

    shards: int
    slots: int = 1
    gpus_per_slot: int = 1
    gpus_per_node: int = GPUS_PER_NODE
    node_selector: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        positive_int("--shards", self.shards, "give the schedule's shards, e.g. --shards 4")
        if self.shards > MAX_SHARDS:
            raise SpecError("--shards", self.shards, f"must be at most {MAX_SHARDS} (one Airflow pool, queue and "
                                                     "worker set each)", "use fewer, larger shards")
        positive_int("--slots", self.slots, "give the models a shard trains at once, e.g. --slots 1")
        positive_int("--gpus-per-slot", self.gpus_per_slot,
                     "every train task needs a GPU of its own: leave it out (1) or give e.g. --gpus-per-slot 2")
        positive_int("--gpus-per-node", self.gpus_per_node, "give the GPUs of one node of your GPU pool, e.g. 8")
        if self.slots * self.gpus_per_slot > self.gpus_per_node:
            raise SpecError("--slots", self.slots,
                            f"a shard's {self.slots} slot(s) x {self.gpus_per_slot} GPU(s) ask "
                            f"{self.slots * self.gpus_per_slot} GPUs of one node, and a node has {self.gpus_per_node} "
                            "(--gpus-per-node): a shard's slots share its worker and its volume, so they cannot be "
                            "spread over nodes",
                            f"use at most {self.gpus_per_node // self.gpus_per_slot} slot(s) per shard and more "
                            "shards, fewer GPUs per slot, or --gpus-per-node with your nodes' count")
        object.__setattr__(self, "node_selector", node_selector("--node-selector", self.node_selector))

    @property
    def gpus_per_shard(self) -> int:
        return self.slots * self.gpus_per_slot
