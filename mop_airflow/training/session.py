"""What the hops of one shard slot's task process share: the shard read once, compiled models, threads.

A shard slot trains the hops of many configurations in turn on one shard. Building a Keras model
and tracing its train step costs 0.5-2 s on a CPU, more than many hops train; so a model compiled
for one configuration is reused by every later configuration with the same
:func:`~mop_airflow.planning.lineup.model_key`. Reuse never changes a result: every model and optimizer
variable (weights, seed-generator states, step, learning rate, moments) is overwritten from the
configuration's own checkpoint, or, at its first hop, from a fresh build with its own seed.
Keras then runs the train step it already traced.

The models kept are bounded by their bytes as well as their count (:func:`cache_bytes`): a quarter
of the accelerator's memory, or on the CPU a sixteenth of the machine's memory up to 1 GiB, shared
by the slots of the machine (``MOP_MODEL_CACHE_BYTES`` sets it). A device that runs out of memory
all the same empties the cache before a configuration is blamed (:func:`out_of_memory`).
"""

from __future__ import annotations

import gc
import logging
import math
import os
from collections import OrderedDict
from typing import Any

from mop_airflow.config import environment
from mop_airflow.errors import SpecError
from mop_airflow.training import progress

from mop_airflow.records import Manifest, RunRecord

# Compiled models kept per task: a slot training many architectures keeps the most recently used.
MAX_MODELS = 4
# A shard slot's warm process trains every configuration of its block: it keeps more of them
# (a compiled model of the demo's CNN with Adam's moments is a few MB; rebuilding and tracing one
# costs 0.5-2 s on a CPU, several seconds of compilation on a GPU).
WARM_MODELS = 32
CACHE_BYTES_ENV = "MOP_MODEL_CACHE_BYTES"
HOST_CACHE_MOST = 1 << 30  # on the CPU, at most 1 GiB of models kept per process
log = logging.getLogger(__name__)
HOPS_PER_WORKER_ENV = "MOP_HOPS_PER_WORKER"
COMPILATION_CACHE_ENV = "MOP_COMPILATION_CACHE"  # "0": JAX compiles every hop's steps afresh
DEVICE_ARRAYS_ENV = "MOP_DEVICE_ARRAYS"  # "0": shards stay in host memory; "1": on the device, the CPU too
# The most a shard's arrays take in an accelerator's memory (x and y): an in-memory shard is a small file
# (a larger one streams through its hops), and the slots share the device with their models.
DEVICE_ARRAYS_MAX_BYTES = 1 << 30


def threads_for(setting: int | str, slots: int, *, cores: int | None = None, env: Any = os.environ) -> int:
    """TensorFlow's intra-op threads for one train task: a number (``schedule.threads_per_hop``'s
    default is 1, whatever the worker), or ``"auto"`` = the worker's cores shared by the train tasks
    that run on it at once (``MOP_HOPS_PER_WORKER`` where the deployment knows it, e.g.
    every shard pool on one machine; else the shard's slots). CPU results depend on the count, so
    only a number gives the same results on every executor and machine."""
    if setting != "auto":
        return int(setting)
    sharing = int(environment.env(HOPS_PER_WORKER_ENV, environ=env) or slots)
    return max(1, (cores or os.cpu_count() or 1) // max(1, sharing))


def apply_threads(threads: int) -> int | None:
    """Set TensorFlow's CPU thread pools before its first op; returns the intra-op count in effect
    (unchanged when TensorFlow already started in this process, e.g. ``dag.test()``). None on Keras's
    other backends, whose pools this leaves alone (JAX fixes its own from ``XLA_FLAGS`` when it starts)."""
    import keras  # noqa: PLC0415

    if keras.config.backend() != "tensorflow":
        return None
    import tensorflow as tf  # noqa: PLC0415

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(threads, 2))
    except RuntimeError:
        pass  # the runtime is initialised: its pools are fixed for this process
    return tf.config.threading.get_intra_op_parallelism_threads() or (os.cpu_count() or 1)


def compilation_cache(cache_dir: str, environ: Any = os.environ) -> str | None:
    """On the JAX backend, keep compiled train and test steps in ``<cache_dir>/jax-compilation``.

    JAX compiles a model's steps again in every process that builds it (XLA, about a second per step
    function on a GPU), and a train task is a process of its own each block and each retry; with the
    cache on disk, a later build of the same model on this worker loads them instead. Returns the folder in use; None on other backends, or with
    ``MOP_COMPILATION_CACHE=0``. A folder the user set (``JAX_COMPILATION_CACHE_DIR``) is kept.
    """
    import keras  # noqa: PLC0415

    if keras.config.backend() != "jax" or (environ.get(COMPILATION_CACHE_ENV) or "1").strip() == "0":
        return None
    import jax  # noqa: PLC0415

    folder = jax.config.jax_compilation_cache_dir
    if not folder:
        folder = os.path.join(cache_dir, "jax-compilation")
        jax.config.update("jax_compilation_cache_dir", folder)
        # JAX's default keeps only compilations over a second: a hop's steps often take less, and
        # every hop of the model pays them again
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return folder


def on_accelerator(x: Any, y: Any, environ: Any = os.environ) -> tuple[Any, Any]:
    """A shard's arrays in the accelerator's memory, on Keras's JAX backend (cast as Keras casts what
    ``fit`` is given): each pass then gathers its batches there, in its own order, instead of copying the
    permuted shard on the host and every batch to the device. The values are the same, so is what the
    model learns. Left on the host on the CPU, under a distribution, above ``DEVICE_ARRAYS_MAX_BYTES``,
    and with ``MOP_DEVICE_ARRAYS=0`` (``1`` moves them on the CPU too)."""
    setting = (environ.get(DEVICE_ARRAYS_ENV) or "").strip()
    if setting == "0":
        return x, y
    import keras  # noqa: PLC0415

    from mop_airflow.training.steps import as_keras_arrays, jax_accelerator  # noqa: PLC0415

    if keras.config.backend() != "jax" or keras.distribution.distribution() is not None:
        return x, y
    if setting != "1" and not jax_accelerator():
        return x, y
    import jax  # noqa: PLC0415

    x, y = as_keras_arrays(x, y)
    held = sum(v.nbytes for v in (x.values() if isinstance(x, dict) else [x])) + y.nbytes
    if held > DEVICE_ARRAYS_MAX_BYTES:
        return x, y
    return jax.device_put((x, y))


def model_bytes(model: Any) -> int:
    """What a compiled model holds: its variables' and its optimizer's (weights, moments, step)."""
    import numpy as np  # noqa: PLC0415

    optimizer = getattr(model, "optimizer", None)
    variables = [*model.variables, *(getattr(optimizer, "variables", None) or [])]
    return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables)


def cache_bytes(slots: int = 1, environ: Any = os.environ) -> int:
    """The bytes of compiled models one process keeps: ``MOP_MODEL_CACHE_BYTES``; else on a JAX
    accelerator a quarter of its memory, shared by the ``slots`` that share it; else (the CPU, or a
    device whose size Keras does not say) a sixteenth of the machine's memory, at most 1 GiB, shared
    the same way. Evicting a model costs a build and a trace when it comes back, never a result."""
    value = (environ.get(CACHE_BYTES_ENV) or "").strip()
    if value:
        if not value.isdigit():
            raise SpecError(CACHE_BYTES_ENV, value, "must be a number of bytes",
                            f"set {CACHE_BYTES_ENV}=536870912 (512 MiB) or unset it")
        return int(value)
    device = _device_memory()
    if device:
        return device // 4 // max(1, slots)
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        host = 16 * HOST_CACHE_MOST
    return min(HOST_CACHE_MOST, host // 16) // max(1, slots)


def _device_memory() -> int | None:
    import keras  # noqa: PLC0415

    if keras.config.backend() != "jax":
        return None
    from mop_airflow.training.steps import jax_accelerator  # noqa: PLC0415

    if not jax_accelerator():
        return None
    import jax  # noqa: PLC0415

    stats = jax.devices()[0].memory_stats() or {}
    return int(stats.get("bytes_limit") or 0) or None


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says the device (or the host) ran out of memory: TensorFlow's
    ResourceExhaustedError, XLA's RESOURCE_EXHAUSTED, a MemoryError."""
    if isinstance(exc, MemoryError):
        return True
    name, text = type(exc).__name__, str(exc)
    return "ResourceExhausted" in name or "RESOURCE_EXHAUSTED" in text or (
        name in ("XlaRuntimeError", "JaxRuntimeError") and "out of memory" in text.lower())


class TaskSession:
    """Per task process: the loaded shard and validation arrays, and compiled models by key."""

    def __init__(self, run: RunRecord, manifest: Manifest, cache_dir: str, *, max_models: int = MAX_MODELS,
                 max_bytes: int | None = None) -> None:
        self.run = run
        self.max_models = max_models
        self.max_bytes = max_bytes  # None: cache_bytes(), once the backend has started
        self.emptied = 0  # times a device out of memory emptied the cache
        self.manifest = manifest
        self.cache_dir = cache_dir
        self.threads: int | None = None
        self._started = False
        self._compile_dir: str | None = None  # JAX's persistent cache in use: where slots share compilations
        self._arrays: dict[str, Any] = {}
        self._models: OrderedDict[str, Any] = OrderedDict()
        self._bytes: dict[str, int] = {}

    def start_backend(self) -> int | None:
        """Thread pools and compilation cache, once per task, before the backend's first op."""
        if not self._started:
            schedule = self.run.schedule
            self.threads = apply_threads(threads_for(schedule.threads_per_hop, schedule.slots_per_shard))
            self._compile_dir = compilation_cache(self.cache_dir)
            self._started = True
        return self.threads

    def arrays(self, path: str) -> Any:
        """A cached shard file as (x, y), decoded once per task."""
        if path not in self._arrays:
            from mop_airflow.data.cache import load_shard  # noqa: PLC0415

            self.start_backend()  # before the arrays may go to the device
            self._arrays[path] = on_accelerator(*load_shard(path, self.manifest))
        return self._arrays[path]

    def model(self, config: dict[str, Any], *, seed: int, fresh: bool) -> tuple[Any, bool]:
        """A compiled model for ``config`` and whether it was reused. ``fresh``: give it the initial state
        a new build with ``seed`` has (a first hop); else the caller restores a checkpoint into it."""
        from mop_airflow.planning.lineup import model_key  # noqa: PLC0415
        from mop_airflow.data.cache import manifest_inputs  # noqa: PLC0415
        from mop_airflow.data.inputs import input_shapes  # noqa: PLC0415
        from mop_airflow.training.builder import build_model  # noqa: PLC0415

        key = model_key(config)
        cached = self._models.get(key)
        if cached is not None and not fresh:
            self._models.move_to_end(key)
            self._bytes[key] = model_bytes(cached)  # its optimizer's variables exist once it has trained
            return cached, True
        manifest = self.manifest
        # a model built mid-block (its build, restore, first trace and compile) has the watchdog's long
        # bound again: a warm slot's steps may be a hundred times shorter than a first compile
        progress.long_step()
        built = build_model(config, input_shapes=input_shapes(manifest_inputs(manifest)),
                            num_classes=len(manifest.classes), seed=seed, task=manifest.task)
        if cached is None:
            from mop_airflow.training import shared_compile  # noqa: PLC0415

            if self._compile_dir and shared_compile.enabled():  # the machine's slots compile its steps once
                shared_compile.share_compilation(built, key, self._compile_dir)
            self._remember(key, built)
            return built, False
        # A first hop in a model already traced: take the new build's initial state, keep the trace.
        for target, value in [*zip(cached.variables, built.variables),
                              *zip(cached.optimizer.variables, built.optimizer.variables)]:
            target.assign(value)
        self._models.move_to_end(key)
        return cached, True

    def forget(self, config: dict[str, Any]) -> None:
        """Drop a model a configuration left in an unknown state (its hop failed half-way)."""
        from mop_airflow.planning.lineup import model_key  # noqa: PLC0415

        key = model_key(config)
        self._models.pop(key, None)
        self._bytes.pop(key, None)

    @property
    def held(self) -> int:
        """Compiled models kept."""
        return len(self._models)

    def empty(self) -> None:
        """Let every compiled model go (a device ran out of memory): what they held is freed."""
        self._models.clear()
        self._bytes.clear()
        self.emptied += 1
        gc.collect()

    def _remember(self, key: str, model: Any) -> None:
        self._models[key] = model
        if self.max_bytes is None:
            self.max_bytes = cache_bytes(self.run.schedule.slots_per_shard)
        self._bytes[key] = model_bytes(model)
        # the newest stays whatever its size: the hop in progress trains it
        while len(self._models) > 1 and (len(self._models) > self.max_models
                                         or sum(self._bytes.values()) > self.max_bytes):
            old, _ = self._models.popitem(last=False)
            log.info("compiled model %s let go: %d kept, %d bytes at most", old, len(self._models), self.max_bytes)
            self._bytes.pop(old, None)
