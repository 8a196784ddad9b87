"""Train and evaluate in-memory arrays one batch at a time on the step Keras traced for the model.

``model.fit`` and ``model.evaluate`` build a tf.data pipeline, its iterator, data adapters and a
callback list on every call: about 0.1 s a call on a CPU, paid per pass and per configuration a
slot trains, often more than the training itself on a small shard. Here the model's own
``train_step`` / ``test_step`` (what the ``tf.function`` that ``fit`` and ``train_on_batch`` run
calls), traced once as a concrete function, is called on numpy slices of the very batches
``fit(shuffle=False)`` would make, in the same order, with the same metric resets: the same
optimizer steps on the same rows, so the variables, the loss and the metrics come out bit for bit
as from ``fit`` (tests/training/test_steps.py).

The step is traced once per model for any batch size (:func:`_step_function`). Keras's own
``train_function`` fed numpy batches traced it up to three times: for the first batch's exact
shape, again because the first trace created the compiled metrics' variables, and again for a
partial last batch. Each trace cost 0.2-0.5 s on a 2-core CPU for the demo's MLP and CNN, more
than a small shard's whole pass; ``fit`` avoids them with a tf.data iterator whose batch size is
unknown and metrics it builds beforehand, which is what this does for plain arrays.

On Keras's JAX backend the same idea runs through the model's own jitted ``train_function`` /
``test_function`` (what ``fit`` and ``evaluate`` call per batch with ``steps_per_execution=1``), its
state held as JAX arrays for the whole pass and written back to the variables once at its end, as
``fit`` does (:func:`_jax_pass`): the same steps on the same batches, without ``fit``'s epoch
iterator, callbacks and per-batch host sync. A diverging pass is found at its end there, not at the
first non-finite batch.

Only where that equivalence is known to hold: the TensorFlow or JAX backend and no distribution
(a strategy would replicate a plain batch to every replica instead of splitting it). Elsewhere
callers keep ``fit``/``evaluate`` (:func:`stepwise_supported`).
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
import weakref
from typing import Any, Callable, Iterable, Iterator

import keras
import numpy as np

from mop_airflow.training.progress import tick


def stepwise_supported(model: keras.Model) -> bool:
    """Whether :func:`train_pass` and :func:`evaluate_arrays` give exactly what ``fit``/``evaluate`` give."""
    if keras.backend.backend() == "jax":
        return keras.distribution.distribution() is None and getattr(model, "steps_per_execution", 1) == 1
    if keras.backend.backend() != "tensorflow":
        return False  # other backends' train_function takes other arguments
    import tensorflow as tf  # noqa: PLC0415

    # Keras keeps the strategy a model was built under in a private attribute; reading it with a
    # default keeps a Keras that renames it on the safe side (fit) only when a strategy is active.
    return not tf.distribute.has_strategy() and getattr(model, "_distribute_strategy", None) is None


def as_keras_arrays(x: Any, y: np.ndarray) -> tuple[Any, np.ndarray]:
    """``x`` and ``y`` with the dtypes Keras's array adapter gives ``fit``: floats other than floatx
    (float64 from pandas or Parquet doubles) cast to floatx, everything else as it is."""
    floatx = np.dtype(keras.config.floatx())

    def cast(values: Any) -> Any:
        if not on_device(values):  # arrays a warm slot keeps on its accelerator stay there
            values = np.asarray(values)
        return values.astype(floatx) if np.issubdtype(values.dtype, np.floating) and values.dtype != floatx else values

    inputs = {name: cast(values) for name, values in x.items()} if isinstance(x, dict) else cast(x)
    return inputs, cast(y)


def on_device(values: Any) -> bool:
    """Whether ``values`` is a JAX array (held in a device's memory), not a host array."""
    jax = sys.modules.get("jax")  # never imported for this: a host array needs no JAX
    return jax is not None and isinstance(values, jax.Array)


def jax_accelerator() -> bool:
    """Whether Keras runs on JAX with an accelerator (not the CPU) as its default device."""
    if keras.config.backend() != "jax":
        return False
    import jax  # noqa: PLC0415

    return jax.default_backend() != "cpu"


def train_pass(model: keras.Model, x: Any, y: np.ndarray, *, batch_size: int) -> dict[str, float]:
    """One pass over ``x``/``y`` in their row order, in batches of ``batch_size`` (the last one partial).

    Returns what ``model.fit(..., epochs=1, shuffle=False)`` records as the epoch's logs: the loss
    and compiled metrics as Keras's running means over the pass (weighted by batch size). Stops after
    the first batch whose running mean loss is not finite, as ``TerminateOnNaN`` does; the returned
    loss is then that non-finite mean.
    """
    return train_batches(model, _batches(x, y, batch_size))


def train_batches(model: keras.Model, batches: Iterable[tuple[Any, np.ndarray]]) -> dict[str, float]:
    """:func:`train_pass` over batches already cut (a streamed shard's): what ``fit`` on them records."""
    if keras.backend.backend() == "jax":
        return _jax_pass(model, batches, "train")
    model.reset_metrics()
    logs: Any = {}
    for batch in batches:
        tick()  # a shard slot's watchdog and its peers judge it by this moving
        batch = as_keras_arrays(*batch)
        logs = _step_function(model, "train", batch)(batch)
        loss = logs.get("loss") if isinstance(logs, dict) else None
        if loss is not None and not math.isfinite(float(loss)):
            break
    # fit ends every call with this, stopped early or not (it swaps in the moving averages of an
    # optimizer with use_ema=True)
    model.optimizer.finalize_variable_values(model.trainable_weights)
    return epoch_logs(model, logs)


def evaluate_arrays(model: keras.Model, x: Any, y: np.ndarray, *, batch_size: int) -> dict[str, float]:
    """What ``model.evaluate(x, y, batch_size=batch_size, return_dict=True)`` returns, batch by batch."""
    return evaluate_batches(model, _batches(x, y, batch_size))


def evaluate_batches(model: keras.Model, batches: Iterable[tuple[Any, np.ndarray]]) -> dict[str, float]:
    """:func:`evaluate_arrays` over batches already cut."""
    if keras.backend.backend() == "jax":
        return _jax_pass(model, batches, "test")
    model.reset_metrics()
    logs: Any = {}
    for batch in batches:
        tick()
        batch = as_keras_arrays(*batch)
        logs = _step_function(model, "test", batch)(batch)
    return epoch_logs(model, logs)


def _jax_pass(model: keras.Model, batches: Iterable[tuple[Any, np.ndarray]], kind: str) -> dict[str, float]:
    """One pass of ``model``'s jitted train (or test) function over ``batches`` on the JAX backend:
    what ``fit`` (``evaluate``) does around it, its epoch iterator and callbacks left out."""
    train = kind == "train"
    names = ("trainable_variables", "non_trainable_variables", *(("optimizer_variables",) if train else ()),
             "metrics_variables")
    batches = iter(batches)
    first = next(batches, None)
    model.reset_metrics()
    if first is None:
        return epoch_logs(model, {})
    first = as_keras_arrays(*first)
    model._symbolic_build(data_batch=first)  # the compiled metrics and loss, once per model (what fit does)
    if train:
        model.make_train_function()
    else:
        model.make_test_function()
    step = model.train_function if train else model.test_function
    state = model._get_jax_state(purge_model_variables=True, **dict.fromkeys(names, True))
    model._jax_state_synced = False
    logs: Any = {}
    try:
        for batch in itertools.chain([first], batches):
            tick()
            logs, state = step(state, iter([as_keras_arrays(*batch)]))
    finally:  # the variables get their values back whatever happened, as fit's own finally does
        model._jax_state = dict(zip(names, state))
        model.jax_state_sync()
        model._jax_state = None
    if train:
        model.optimizer.finalize_variable_values(model.trainable_weights)
    return epoch_logs(model, logs)


# A model's traced steps, kept as long as the model (a slot reuses a compiled model across configurations):
# the tf.function per kind, and its concrete function per batch signature.
_STEPS: "weakref.WeakKeyDictionary[keras.Model, dict[str, Callable[[Any], Any]]]" = weakref.WeakKeyDictionary()
_CONCRETE: "weakref.WeakKeyDictionary[keras.Model, dict[tuple, Callable[[Any], Any]]]" = weakref.WeakKeyDictionary()


def _step_function(model: keras.Model, kind: str, batch: tuple[Any, np.ndarray]) -> Callable[[Any], Any]:
    """``model.train_step`` or ``test_step`` for ``batch``: the concrete function traced for batches
    of any size with its structure and dtypes.

    Calling the concrete function, not the ``tf.function``, skips the ``tf.function``'s per-call
    work of matching its arguments to a trace: 0.2-0.3 ms a step, a quarter of a small MLP's step
    on a CPU (benchmarks/task_parallel.py). It runs the same graph, so the results are the same to
    the bit; a batch of other dtypes or trailing shapes gets a concrete function of its own.
    """
    if model.run_eagerly:
        return model.train_step if kind == "train" else model.test_step
    key = (kind, _signature(batch))
    concretes = _CONCRETE.setdefault(model, {})
    concrete = concretes.get(key)
    if concrete is None:
        import tensorflow as tf  # noqa: PLC0415

        any_rows = tf.nest.map_structure(
            lambda rows: tf.TensorSpec((None, *np.shape(rows)[1:]), tf.as_dtype(np.asarray(rows).dtype)), batch)
        concrete = concretes[key] = _traced_step(model, kind, batch).get_concrete_function(any_rows)
    return concrete


def _signature(batch: tuple[Any, np.ndarray]) -> tuple:
    """What a trace depends on besides the batch size: the inputs' names, dtypes and trailing shapes."""
    x, y = batch
    inputs = sorted(x.items()) if isinstance(x, dict) else [(None, x)]
    return tuple((name, values.dtype.str, values.shape[1:]) for name, values in inputs) + ((y.dtype.str, y.shape[1:]),)


def _traced_step(model: keras.Model, kind: str, batch: tuple[Any, np.ndarray]) -> Any:
    """``model.train_step`` or ``test_step`` as a ``tf.function``, made once per model and kind.

    It is what Keras's ``train_function`` runs for one batch without a distribution strategy
    (``strategy.run`` of the default strategy calls the step as it is, without AutoGraph). The
    compiled metrics are built first, on one row, so the trace creates no variable (a trace that
    creates one is traced again), then reset; the model's own state is left as it was.
    """
    steps = _STEPS.setdefault(model, {})
    if kind in steps:
        return steps[kind]
    import tensorflow as tf  # noqa: PLC0415

    step = model.train_step if kind == "train" else model.test_step
    first = _rows(batch[0], 0, 1), batch[1][:1]
    # a forward pass on one row; any state it moves (a stateful RNN, a seed generator) is put back
    state = list(model.non_trainable_variables)
    values = [v.numpy() for v in state]
    model.compute_metrics(first[0], first[1], model(first[0], training=False))
    model.reset_metrics()  # called at a pass's first batch: the pass counts from zero
    for variable, value in zip(state, values):
        variable.assign(value)
    steps[kind] = tf.function(step, reduce_retracing=True, jit_compile=bool(model.jit_compile), autograph=False)
    return steps[kind]


def _rows(x: Any, start: int, end: int) -> Any:
    return {name: values[start:end] for name, values in x.items()} if isinstance(x, dict) else x[start:end]


def _batches(x: Any, y: np.ndarray, batch_size: int) -> Iterator[tuple[Any, np.ndarray]]:
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1. Fix: set the configuration's batch_size to 1 or more")
    if on_device(y) and len(y) <= MAX_SPLIT * batch_size:
        yield from _device_batches(x, y, batch_size)
        return
    for start in range(0, len(y), batch_size):
        yield _rows(x, start, start + batch_size), y[start:start + batch_size]


def _device_batches(x: Any, y: Any, batch_size: int) -> Iterator[tuple[Any, Any]]:
    """Arrays held on the device, cut into the same batches by one compiled call: a slice per batch
    would be an op dispatched per batch and input, about as long as the host copies it saves."""
    bounds = tuple(range(batch_size, len(y), batch_size))
    xs, ys = _split_on_device()(x, y, bounds)
    if isinstance(x, dict):
        xs = [dict(zip(xs, parts)) for parts in zip(*xs.values())]
    yield from zip(xs, ys)


# Batches a pass cuts in one compiled call at most: a program with more outputs takes long to compile,
# so a pass of more batches slices them one by one.
MAX_SPLIT = 1024


@functools.cache
def _split_on_device() -> Callable[..., Any]:
    """``(x, y, bounds) -> (x's batches, y's batches)``, compiled once per shape and bounds."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    def split(x: Any, y: Any, bounds: tuple[int, ...]) -> tuple[Any, Any]:
        cut = lambda values: jnp.split(values, bounds)  # noqa: E731
        return ({name: cut(values) for name, values in x.items()} if isinstance(x, dict) else cut(x)), cut(y)

    return jax.jit(split, static_argnums=2)


def epoch_logs(model: keras.Model, logs: Any) -> dict[str, float]:
    """What fit and evaluate report at the end: the model's metrics, or the last step's logs when a
    custom train/test step returns other names; flattened, sorted by name, Python floats."""
    metrics = model.get_metrics_result()
    chosen = metrics if not isinstance(logs, dict) or set(logs) == set(metrics) else logs
    return _flat_floats(chosen)


def _flat_floats(logs: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, value in sorted(logs.items()):
        if isinstance(value, dict):
            out.update(_flat_floats(value))
        else:
            out[name] = float(np.asarray(value))
    return out
