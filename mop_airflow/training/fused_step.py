"""Several configurations of one architecture trained as one compiled program on Keras's JAX backend.

Keras on JAX trains statelessly: a model's ``train_step(state, batch)`` maps its variables (trainable,
non-trainable, optimizer, metrics) and a batch to new ones, and the learning rate is one of the
optimizer's variables. So ``jax.vmap`` over that step, with every variable stacked along a leading
member axis, trains several configurations of one model and batch size at once, each with its own
weights, dropout seed states, step, learning rate and moments: one program per batch for the whole
group, with larger operations than each configuration's alone, instead of a program per batch and
configuration. Each member gathers its batch by its own row indices (its own order,
:func:`~mop_airflow.training.hop.batch_order`) from the one shard.

A pass calls the fused step once per batch, as the single path calls Keras's step (a ``lax.scan`` over a
pass's batches saved 10-20 % of a dense model's pass on a 2-core CPU, but made the demo's CNN 8x
slower there: XLA's CPU backend runs a convolution inside a loop far slower). The steps are Keras's
own, so what a member learns equals what it learns alone up to the float rounding of batched
operations (a batched matrix product or reduction may sum in another order):
tests/training/test_fused.py measures it.

Numeric optimizer settings other than the learning rate that a group may vary (``weight_decay``) are
plain Python attributes of the optimizer, read while the step is traced: here they are set to the
member's traced value for that trace, so each member's step uses its own.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Mapping, Sequence

import numpy as np

from mop_airflow.training import progress

# A member's state as it enters and leaves a fused pass: Keras's training state but the metrics (reset
# every pass), as lists of arrays in the model's variable order.
Member = tuple[list[Any], list[Any], list[Any]]  # trainable, non-trainable, optimizer


def member_state(model: Any) -> Member:
    """``model``'s trainable, non-trainable and optimizer variables' values as they are now."""
    return ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
            [v.value for v in model.optimizer.variables])


def assign_member(model: Any, member: Member) -> None:
    """Give ``model``'s variables a member's values (to evaluate it, or take its state out)."""
    targets = [*model.trainable_variables, *model.non_trainable_variables, *model.optimizer.variables]
    for variable, value in zip(targets, [*member[0], *member[1], *member[2]]):
        variable.assign(value)


def train_fused_pass(model: Any, members: Sequence[Member], x: Any, y: Any, orders: Sequence[np.ndarray], *,
                     batch_size: int, scalars: Mapping[str, Sequence[float]] | None = None,
                     ) -> tuple[list[Member], list[dict[str, float]]]:
    """One pass of every member over ``x``/``y``, member ``i`` in row order ``orders[i]``, in batches of
    ``batch_size`` (the last one partial), on ``model``'s train step (``model`` is any of the members'
    compiled models: they share the architecture). ``scalars`` maps an optimizer attribute to each
    member's value. Returns the members' new states and what ``fit`` would log for each pass
    (:func:`~mop_airflow.training.steps.epoch_logs`): its loss and metrics as running means."""
    import jax.numpy as jnp  # noqa: PLC0415
    import keras  # noqa: PLC0415

    from mop_airflow.training.steps import as_keras_arrays, epoch_logs  # noqa: PLC0415

    x, y = as_keras_arrays(x, y)
    rows = len(y)
    order = np.stack([np.asarray(o) for o in orders])  # members x rows
    if order.shape != (len(members), rows):
        raise ValueError(f"orders of shape {order.shape}: one permutation of the {rows} rows per member "
                         f"({len(members)}) is needed")
    first = order[0, :batch_size]
    model.reset_metrics()  # a pass counts from zero, as fit's does
    # the compiled metrics and loss exist before a trace reads them (what fit does on its first batch)
    model._symbolic_build(data_batch=(_gather(x, first), y[first]))
    zeros = [v.value for v in model.metrics_variables]
    state = _stack([(*m, zeros) for m in members])
    wanted = {name: np.asarray(values, dtype=keras.config.floatx()) for name, values in (scalars or {}).items()}
    step = _program(model, tuple(sorted(wanted)))
    data = (jnp.asarray(x) if not isinstance(x, dict) else {k: jnp.asarray(v) for k, v in x.items()}, jnp.asarray(y))
    logs: Any = {}
    for start in range(0, rows, batch_size):
        progress.tick()  # a fused hop's batches are steps as a lone hop's are: the watchdog learns them
        logs, state = step(state, order[:, start:start + batch_size], *data, wanted)
    trained = _unstack(len(members))(state)
    out_logs = []
    for index, member in enumerate(trained):
        for variable, value in zip(model.metrics_variables, member[3]):
            variable.assign(value)
        out_logs.append(epoch_logs(model, {name: value[index] for name, value in logs.items()}))
    model.reset_metrics()
    return [(t, n, o) for t, n, o, _ in trained], out_logs


def _gather(x: Any, rows: Any) -> Any:
    return {name: values[rows] for name, values in x.items()} if isinstance(x, dict) else x[rows]


def _stack(members: Sequence[Any]) -> Any:
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    return jax.tree.map(lambda *values: jnp.stack(values), *members)


@functools.cache
def _unstack(count: int) -> Any:
    """``stacked -> [member 0's, member 1's, ...]`` in one compiled call, not a slice per variable and member."""
    import jax  # noqa: PLC0415

    return jax.jit(lambda state: [jax.tree.map(lambda values: values[i], state) for i in range(count)])


# The compiled step per model and set of varied scalars: a group's model keeps it for its next hops.
_PROGRAMS: "weakref.WeakKeyDictionary[Any, dict[tuple, Any]]" = weakref.WeakKeyDictionary()


def _program(model: Any, scalar_names: tuple[str, ...]) -> Any:
    """``model``'s jitted fused step: ``(stacked state, rows [members, batch], x, y, scalars) -> (logs,
    state)``, compiled per batch shape on first use (a pass's full and partial last batches)."""
    cached = _PROGRAMS.setdefault(model, {})
    if scalar_names in cached:
        return cached[scalar_names]
    import jax  # noqa: PLC0415

    optimizer = model.optimizer

    def one(state: Any, rows: Any, x: Any, y: Any, scalars: dict[str, Any]) -> Any:
        # read at trace time: this member's traced values stand in for the optimizer's floats
        saved = {name: getattr(optimizer, name) for name in scalars}
        try:
            for name, value in scalars.items():
                setattr(optimizer, name, value)
            return model.train_step(state, (_gather(x, rows), y[rows]))
        finally:
            for name, value in saved.items():
                setattr(optimizer, name, value)

    def step(state: Any, rows: Any, x: Any, y: Any, scalars: dict[str, Any]) -> Any:
        return jax.vmap(one, in_axes=(0, 0, None, None, 0))(state, rows, x, y, scalars)

    cached[scalar_names] = jax.jit(step, donate_argnums=0)
    return cached[scalar_names]
