"""Processes of one machine compile each train and test step once between them, not all at once.

A block's shard slots start together, and on Keras's JAX backend each one compiles the same train
and test steps (same model, same batch shapes) at the same moment, before any of them has written
them to the persistent compilation cache (:func:`~mop_airflow.training.session.compilation_cache`).
Here the first process to need a step for a batch shape compiles it holding a file lock named after
the model key and the shapes (in the cache folder); the others wait on that lock, then load what it
wrote. A lock is held only across the step's first call, dies with its process however it dies, and
a wait ends after ``WAIT_SECONDS`` whatever happens (the process then compiles for itself).

It only orders compilations: every call runs the step Keras made, on the same data, and an
executable loaded from the cache computes what a fresh compilation would (tests/training/test_jax_backend.py),
so no result depends on it. ``MOP_SHARED_COMPILE=0`` turns it off.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import logging
import os
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

SHARED_COMPILE_ENV = "MOP_SHARED_COMPILE"  # "0": every process compiles its steps whenever it needs them
WAIT_SECONDS = 180.0  # longer than a step takes to compile on a busy GPU machine (15 s measured)
POLL_SECONDS = 0.05


def enabled(environ: Any = os.environ) -> bool:
    return (environ.get(SHARED_COMPILE_ENV) or "1").strip() != "0"


def share_compilation(model: Any, key: str, folder: str, *, wait_s: float = WAIT_SECONDS) -> Any:
    """Guard ``model``'s train and test functions (made here, as ``fit`` would make them): the first
    call for each new batch shape holds ``<folder>/locks/<key and shapes>.lock``. Returns ``model``."""
    if model.run_eagerly or not model.jit_compile:
        return model  # nothing to compile
    model.make_train_function()
    model.make_test_function()
    model.train_function = _guarded(model.train_function, f"train {key}", folder, wait_s)
    model.test_function = _guarded(model.test_function, f"test {key}", folder, wait_s)
    return model


def _guarded(function: Callable[[Any, Any], Any], name: str, folder: str, wait_s: float) -> Callable[[Any, Any], Any]:
    """``function(state, batches)`` (Keras's iterator step), the first call per batch shapes under a lock."""
    import jax  # noqa: PLC0415

    seen: set[tuple] = set()

    def step(state: Any, batches: Any) -> Any:
        batches = iter(batches)
        first = next(batches)  # an exhausted iterator raises here as it would in Keras's own step
        shapes = tuple((tuple(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", type(leaf).__name__)))
                       for leaf in jax.tree_util.tree_leaves(first))
        batches = itertools.chain([first], batches)
        if shapes in seen:
            return function(state, batches)
        seen.add(shapes)
        digest = hashlib.sha256(repr((name, shapes)).encode()).hexdigest()[:32]
        with _held(os.path.join(folder, "locks", f"compile-{digest}.lock"), wait_s):
            return function(state, batches)

    return step


class _held:
    """An exclusive ``flock`` on ``path`` for the block, waited for at most ``wait_s``; without it
    (timed out, or the file cannot be made) the block runs anyway."""

    def __init__(self, path: str, wait_s: float) -> None:
        self.path, self.wait_s, self.fd = path, wait_s, None

    def __enter__(self) -> "_held":
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            log.warning("compiling without the machine's compile lock %s: %s", self.path, exc)
            return self
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.fd = fd
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    log.warning("waited %.0f s for another process to compile the step (%s): compiling here",
                                self.wait_s, self.path)
                    return self
                time.sleep(POLL_SECONDS)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the lock
            self.fd = None
