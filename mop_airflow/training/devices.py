"""Which GPU a train task trains on: each slot of a machine on its own GPU.

A shard's pool bounds how many train tasks (shard slots) run at once but not which GPU each uses; left
alone, TensorFlow in every task process takes the first GPU and reserves nearly all of every GPU's
memory, so a second train task on the machine fails or shares GPU 0. So a train task claims a slot of
its machine (a file lock held until the process dies) and restricts itself to that slot's GPU before
TensorFlow starts.
Settings come from the worker's environment: ``MOP_GPUS`` (a count, or ids with a comma),
``MOP_SLOTS``, ``MOP_SLOT_LOCK_DIR``, ``MOP_SLOT_WAIT_SECONDS``, ``MOP_GPU_RESERVE``. Without ``MOP_GPUS`` or
``CUDA_VISIBLE_DEVICES`` nothing changes: a CPU worker runs exactly as before.

The variables take effect only if CUDA has not started in the process. The worker process that forks
the tasks may import TensorFlow and Keras (:mod:`mop_airflow.deployment.preload`) but must not list
devices, run an op or build a model: CUDA does not survive a fork, and its settings would be fixed
once, in the parent, for every child.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from mop_airflow.config.environment import env
from mop_airflow.errors import SpecError

log = logging.getLogger(__name__)

GPUS_ENV = "MOP_GPUS"
SLOTS_ENV = "MOP_SLOTS"
LOCK_DIR_ENV = "MOP_SLOT_LOCK_DIR"
WAIT_ENV = "MOP_SLOT_WAIT_SECONDS"
# "1": a slot alone on its GPU lets the backend reserve the GPU's memory when it starts, as TensorFlow and
# JAX do by default. Off by default: measured when every hop was a short process of its own, reserving
# the GPU cost more than a whole hop's training (1.5 s of each process's start on an H200 with JAX, for
# models that used at most 151 MB; benchmarks/gpu_hops.py, docs/performance.md).
RESERVE_ENV = "MOP_GPU_RESERVE"
# Consulted for MOP_SLOTS in this order when it is unset: both say how many train tasks share the machine.
SLOTS_FALLBACK_ENV = ("MOP_HOPS_PER_WORKER", "AIRFLOW__CELERY__WORKER_CONCURRENCY")
# Airflow frees a pool slot when a task reports its state, a moment before its process exits and drops
# its lock, so the next train task may find every slot taken for a second or so. A longer wait means the
# pools allow more train tasks than MOP_SLOTS: that fails loudly rather than put two on one GPU unasked.
DEFAULT_WAIT_S = 60.0


@dataclass(frozen=True)
class DevicePlacement:
    """Where one slot trains. ``visible_devices`` None: leave the environment alone (CPU)."""

    slot: int
    gpu: str | None            # the id as CUDA_VISIBLE_DEVICES names it; None on a CPU machine
    visible_devices: str | None
    memory_growth: bool        # allocate on demand, never reserve the GPU (always when slots share it)
    slots_sharing: int         # slots of the machine on this GPU (on a CPU machine: all of them)


@dataclass(frozen=True)
class SlotClaim:
    slot: int
    path: str
    fd: int

    def release(self) -> None:
        os.close(self.fd)  # closing the last descriptor drops the lock


def choose_device(slot: int, gpus: int | Sequence[str], slots: int, *, reserve: bool = False) -> DevicePlacement:
    """Slot ``slot`` of ``slots`` gets GPU ``gpus[slot % len(gpus)]``; ``gpus`` a count or the ids.

    Its memory grows on demand, unless ``reserve`` and the slot is alone on its GPU."""
    if isinstance(gpus, int):
        if gpus < 0:
            raise SpecError(GPUS_ENV, gpus, "must be a count of at least 0 or a list of GPU ids",
                            f"set {GPUS_ENV} to the GPUs this worker may use, e.g. 2 or 0,1 (0 for none)")
        ids = [str(i) for i in range(gpus)]
    else:
        ids = _checked_ids(list(gpus))
    if slots < 1:
        raise SpecError(SLOTS_ENV, slots, "must be at least 1",
                        f"set {SLOTS_ENV} to the train tasks that run at once on this machine (the worker's --concurrency)")
    if not 0 <= slot < slots:
        raise SpecError("slot", slot, f"must be in 0..{slots - 1} ({SLOTS_ENV}={slots})",
                        f"take the slot from claim_slot({slots}), or raise {SLOTS_ENV} if the machine runs more hops")
    if not ids:
        return DevicePlacement(slot, None, None, memory_growth=False, slots_sharing=slots)
    n, i = len(ids), slot % len(ids)
    sharing = slots // n + (1 if i < slots % n else 0)
    return DevicePlacement(slot, ids[i], ids[i], memory_growth=sharing > 1 or not reserve, slots_sharing=sharing)


def _checked_ids(ids: list[str]) -> list[str]:
    ids = [str(g).strip() for g in ids]
    if any(not g for g in ids) or len(set(ids)) != len(ids):
        raise SpecError(GPUS_ENV, ",".join(ids), "GPU ids must be non-empty and distinct",
                        f"list each GPU once, e.g. {GPUS_ENV}=0,1")
    return ids


def _visible(value: str | None) -> list[str]:
    # CUDA's own rule: devices after the first invalid entry (e.g. -1) are hidden
    ids: list[str] = []
    for item in (value or "").split(","):
        item = item.strip()
        if not item or re.fullmatch(r"-\d+", item):
            break
        ids.append(item)
    return ids


def gpus_from_env(environ: Mapping[str, str]) -> list[str] | None:
    """The GPU ids this worker divides among its slots; None when no GPU is configured."""
    visible = _visible(environ.get("CUDA_VISIBLE_DEVICES"))
    value = (environ.get(GPUS_ENV) or "").strip()
    if not value:
        return visible or None
    if "," in value:
        ids = _checked_ids(value.split(","))
        outside = [g for g in ids if visible and g not in visible]
        if outside:
            raise SpecError(GPUS_ENV, value, f"names GPUs outside CUDA_VISIBLE_DEVICES={','.join(visible)}: "
                            + ",".join(outside), f"list only GPUs of CUDA_VISIBLE_DEVICES, or give {GPUS_ENV} a count")
        return ids
    try:
        count = int(value)
    except ValueError:
        raise SpecError(GPUS_ENV, value, "must be a count (2) or a comma-separated list of GPU ids (0,1)",
                        f"set {GPUS_ENV}=<number of GPUs> or {GPUS_ENV}=<id>,<id>") from None
    if count < 0 or (visible and count > len(visible)):
        raise SpecError(GPUS_ENV, value, f"must be between 0 and the visible GPUs ({len(visible) or 'any'})",
                        f"set {GPUS_ENV} to at most the GPUs CUDA_VISIBLE_DEVICES names")
    if count == 0:
        return None
    return visible[:count] if visible else [str(i) for i in range(count)]


def slots_from_env(environ: Mapping[str, str], gpus: int) -> int:
    for name in (SLOTS_ENV, *SLOTS_FALLBACK_ENV):
        value = (env(name, environ=environ) or "").strip()
        if value:
            try:
                slots = int(value)
            except ValueError:
                slots = 0
            if slots < 1:
                raise SpecError(name, value, "must be a whole number of at least 1",
                                f"set {SLOTS_ENV} to the train tasks that run at once on this machine")
            return slots
    return max(1, gpus)


def default_lock_dir(gpus: Sequence[str]) -> str:
    # Keyed by the GPUs divided: two workers on one machine share slots exactly when they share GPUs.
    key = "-".join(re.sub(r"[^A-Za-z0-9.]", "_", g) for g in gpus) or "cpu"
    return os.path.join(tempfile.gettempdir(), "mop_airflow-slots", f"gpus-{key}")


def claim_slot(slots: int, lock_dir: str, *, wait_s: float = DEFAULT_WAIT_S, poll_s: float = 0.1) -> SlotClaim:
    """Lock the first free ``<lock_dir>/slot-<i>.lock``; the OS drops it when the process dies, however it dies."""
    if slots < 1:
        raise SpecError(SLOTS_ENV, slots, "must be at least 1", f"set {SLOTS_ENV} to the train tasks on this machine")
    deadline = time.monotonic() + wait_s
    while True:
        for slot in range(slots):
            path = os.path.join(lock_dir, f"slot-{slot}.lock")
            fd = _lock_file(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return SlotClaim(slot, path, fd)
            except BlockingIOError:
                os.close(fd)
        if time.monotonic() >= deadline:
            raise SpecError(SLOTS_ENV, slots, f"all {slots} slots in {lock_dir} are held by live processes "
                            f"(waited {wait_s:g} s)", f"give this machine's shard pools and the worker's "
                            f"--concurrency at most {SLOTS_ENV} slots in all (mop-airflow pools sync --slots N), "
                            f"or raise {SLOTS_ENV}")
        time.sleep(poll_s)


def _lock_file(path: str) -> int:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:  # e.g. another user's folder in the shared temp dir
        raise SpecError(LOCK_DIR_ENV, os.path.dirname(path), f"cannot write a lock file there ({exc.strerror})",
                        f"point {LOCK_DIR_ENV} at a local folder every worker process of this machine can write") from None


def apply_placement(placement: DevicePlacement, environ: MutableMapping[str, str]) -> dict[str, str]:
    """Set the variables CUDA and TensorFlow read when they start; returns what was set ({} on a CPU)."""
    if placement.visible_devices is None:
        return {}
    changes = {"CUDA_VISIBLE_DEVICES": placement.visible_devices}
    if placement.memory_growth:
        # TensorFlow reserves nearly all of the GPU, and JAX (Keras's jax backend) three quarters of
        # it, when they start; PyTorch allocates on demand already
        changes["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
        changes["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    environ.update(changes)
    return changes


def backend_started(modules: Mapping[str, Any] = sys.modules) -> bool:
    """True when TensorFlow or JAX in this process already enumerated its devices: the placement comes
    too late."""
    eager = modules.get("tensorflow.python.eager.context")
    bridge = modules.get("jax._src.xla_bridge")
    try:
        ctx = eager.context_safe() if eager is not None else None
        tf_started = ctx is not None and bool(ctx._initialized or ctx._physical_devices is not None)
        return tf_started or (bridge is not None and bool(bridge._backends))
    except AttributeError:  # internals that moved: say nothing rather than guess
        return False


def _flag(value: str | None, name: str) -> bool:
    text = (value or "").strip().lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise SpecError(name, value, "must be 1 or 0", f"set {name}=1 to let a lone slot reserve its GPU, or unset it")


def _seconds(value: str | None) -> float:
    try:
        return float(value) if value and value.strip() else DEFAULT_WAIT_S
    except ValueError:
        raise SpecError(WAIT_ENV, value, "must be a number of seconds", f"set {WAIT_ENV}=60 or unset it") from None


_placed: dict[int, tuple[DevicePlacement, SlotClaim]] = {}


def place_this_process(environ: MutableMapping[str, str] = os.environ) -> DevicePlacement | None:
    """Claim a slot of this machine and restrict this process to its GPU; None (and no change) without GPUs.

    Call it at the start of a train task, before TensorFlow or JAX runs anything. With ``os.environ``, a second
    call in the same process returns the first placement: a process never holds two slots."""
    own = environ is os.environ
    if own and os.getpid() in _placed:
        return _placed[os.getpid()][0]
    gpus = gpus_from_env(environ)
    if gpus is None:
        return None
    slots = slots_from_env(environ, len(gpus))
    lock_dir = environ.get(LOCK_DIR_ENV) or default_lock_dir(gpus)
    reserve = _flag(environ.get(RESERVE_ENV), RESERVE_ENV)  # read before a slot is held: a bad value holds none
    claim = claim_slot(slots, lock_dir, wait_s=_seconds(env(WAIT_ENV, environ=environ)))
    placement = choose_device(claim.slot, gpus, slots, reserve=reserve)
    apply_placement(placement, environ)
    if own:
        _placed[os.getpid()] = (placement, claim)
    log.info("slot %d of %d on GPU %s (%d slot(s) share it, memory growth %s)", placement.slot, slots,
             placement.gpu, placement.slots_sharing, "on" if placement.memory_growth else "off")
    if backend_started():
        log.warning("TensorFlow or JAX had already started in this process: CUDA_VISIBLE_DEVICES=%s does not take "
                    "effect here (was it started before the fork, or is this dag.test()?)", placement.visible_devices)
    return placement
