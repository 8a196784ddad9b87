"""Configurations fused on one accelerator: which may train as one compiled program, and their hop.

Configurations that share the model builder and its hparams, the optimizer class and every optimizer
setting but a few numbers, the loss and metrics, the batch size and the passes per hop differ only
in values a compiled train step takes as data: their weights and seed-generator states (their seeds),
their optimizer's step, moments and learning rate (a variable of Keras's optimizers), and
``weight_decay`` (a float the step reads when it is traced, set per member by
:mod:`~mop_airflow.training.fused_step`). On Keras's JAX backend such a group trains as one program
over their stacked variables. Anything else changes the program itself and never fuses: another
architecture or hparam (other shapes), another batch size (other batch shapes), an optimizer setting
its code branches on or folds into Python floats (SGD's ``momentum`` decides whether momentum
variables exist; Adam's ``1 - beta_1`` is computed in double precision from a float but in single
precision from a traced value, so it would not be the same step), an optimizer averaging its weights
(``use_ema``), and every backend but JAX.

:func:`train_fused_hop` is :func:`~mop_airflow.training.model_hop.train_hop` for such a group on one
shard: each member's input state is restored exactly as for its hop alone, the group trains in one
program, and each member is evaluated and handed back as its own
:class:`~mop_airflow.training.model_hop.TrainedHop`, to be committed one by one as today.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from mop_airflow.planning.fusing import FUSABLE_SCALARS, fuse_key, fuse_limit


def fuses_here(run: Any, manifest: Any, shards: Iterable[int]) -> bool:
    """Whether this process trains fused groups on ``shards``: ``schedule.fuse`` above 1, Keras on JAX,
    and every one of the shards read whole (one that streams trains its configurations alone)."""
    if fuse_limit(run.schedule.fuse) == 1:
        return False
    import keras  # noqa: PLC0415 - this process trains with it next

    from mop_airflow.training.model_hop import streams  # noqa: PLC0415

    return keras.config.backend() == "jax" and not any(streams(manifest.shards[s], run) for s in shards)


def varied_scalars(configs: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The optimizer floats a group's members set differently (not the learning rate, a variable)."""
    out = {}
    for name in FUSABLE_SCALARS[1:]:
        values = [(c.get("optimizer_params") or {}).get(name) for c in configs]
        if values[0] is not None and len(set(values)) > 1:
            out[name] = [float(v) for v in values]
    return out


def train_fused_hop(layout: Any, run: Any, manifest: Any, assignments: Sequence[Any], *, t: int, shard: int,
                    rung_end: bool = False, cache_dir: str, where: Any = None, session: Any = None,
                    read_checkpoint: Callable[[str], tuple[bytes, Callable[[], str]]] | None = None) -> list[Any]:
    """:func:`~mop_airflow.training.model_hop.train_hop` for a fused group (one :func:`fuse_key`, on the JAX
    backend) at global hop ``t`` on ``shard``: one result per assignment, in order, a
    :class:`~mop_airflow.training.model_hop.TrainedHop` to commit or the exception that ended that
    member's hop (its input would not restore, or it diverged), to record as a failure while the others go
    on. The shard must be held in memory (one that streams trains its configurations alone)."""
    from mop_airflow.planning.schedule import config_seed  # noqa: PLC0415
    from mop_airflow.training import model_hop  # noqa: PLC0415
    from mop_airflow.training.session import TaskSession  # noqa: PLC0415

    where = where or model_hop.Where()
    clock = {"entered": time.time()}
    clock["started"] = where.started_at or clock["entered"]
    session = session or TaskSession(run, manifest, cache_dir)
    configs = [run.config(a.config_id) for a in assignments]
    if len({fuse_key(c) for c in configs}) != 1 or fuse_key(configs[0]) is None:
        raise ValueError(f"{[a.config_id for a in assignments]} do not fuse: group them with fuse_groups")
    for assignment in assignments:
        model_hop.check_arrival(assignment, t)
    data = model_hop.read_shard(layout, run, manifest, shard, cache_dir, session)
    if data.streamed:
        raise ValueError(f"shard {shard} streams through its hops: train its configurations alone")
    clock["shard_read"] = time.time()
    threads = session.start_backend()
    clock["imported"] = time.time()

    from mop_airflow.training.fused_step import member_state  # noqa: PLC0415

    results: list[Any] = [None] * len(assignments)
    live: list[int] = []  # members whose input restored
    states, seeds, reused, bytes_in, clocks, model = [], [], [], [], [], None
    for index, (assignment, config) in enumerate(zip(assignments, configs)):
        # exactly a hop alone's start: its compiled model (shared by every member with its model key),
        # fresh at a first hop, then its checkpoint or warm start
        own = dict(clock)
        seed = config_seed(run.schedule.seed, assignment.config_id)
        try:
            member_model, was_reused = session.model(config, seed=seed, fresh=not assignment.checkpoint)
            own["built"] = time.time()
            checkpoint_bytes = model_hop.restore_input(member_model, layout.store, run, assignment, read_checkpoint)
        except Exception as exc:  # noqa: BLE001 - this member's failure, recorded by the caller
            session.forget(config)
            results[index] = exc
            continue
        own["loaded"] = time.time()
        model = model or member_model
        live.append(index)
        states.append(member_state(member_model))
        seeds.append(seed)
        reused.append(was_reused)
        bytes_in.append(checkpoint_bytes)
        clocks.append(own)
    if not live:
        return results
    config = configs[live[0]]
    began = time.time()
    trained, train_metrics = train_group(model, states, data.x, data.y, seeds=seeds, config=config,
                                         scalars=varied_scalars([configs[i] for i in live]),
                                         iteration=t // run.schedule.shards, shard=shard)
    ended = time.time()
    from mop_airflow.training.fused_step import assign_member  # noqa: PLC0415

    for slot, index in enumerate(live):
        if isinstance(train_metrics[slot], Exception):
            results[index] = train_metrics[slot]
            continue
        own = clocks[slot]
        # the group trained from the last member's load to its end: each member's hop spans it
        own["loaded"], own["trained"] = began, ended
        assign_member(model, trained[slot])
        val, val_bytes = model_hop.validate_when_due(model, layout.store, manifest, run, cache_dir, t=t,
                                                     rung_end=rung_end, batch_size=config["batch_size"],
                                                     session=session)
        own["evaluated"] = time.time()
        results[index] = model_hop.trained_hop(
            layout, run, assignments[index], model, t=t, shard=shard, where=where, clock=own,
            train=train_metrics[slot], val=val, threads=threads, reused=reused[slot],
            bytes_read={"metadata": data.metadata_bytes, "data": data.data_bytes + val_bytes,
                        "checkpoint": bytes_in[slot]})
        results[index].record["fused"] = len(live)
    return results


def train_group(model: Any, states: list[Any], x: Any, y: Any, *, seeds: Sequence[int], config: Mapping[str, Any],
                scalars: Mapping[str, Sequence[float]], iteration: int, shard: int) -> tuple[list[Any], list[Any]]:
    """Train the members (``states`` from :func:`~mop_airflow.training.fused_step.member_state`, one seed
    each) for the configuration's passes per hop on ``x``/``y``, each pass in each member's own
    :func:`~mop_airflow.training.hop.batch_order`. Returns their new states and, per member, what
    :func:`~mop_airflow.training.hop.train_on_shard` returns for it alone, or the error that ended it
    (it diverged: it trains on with the group, its result dropped)."""
    from mop_airflow.training.fused_step import train_fused_pass  # noqa: PLC0415
    from mop_airflow.training.hop import batch_order, check_hop, divergence, hop_summary  # noqa: PLC0415

    epochs, batch_size, rows = config["epochs_per_hop"], config["batch_size"], len(y)
    check_hop(rows, epochs, iteration=iteration, shard=shard)
    step_index = [v is model.optimizer.iterations for v in model.optimizer.variables].index(True)
    steps_before = [int(s[2][step_index]) for s in states]
    per_epoch: list[list[dict[str, float]]] = [[] for _ in states]
    errors: list[Exception | None] = [None] * len(states)
    started = time.perf_counter()
    for epoch in range(epochs):
        orders = [batch_order(rows, seed=seed, iteration=iteration, shard=shard, epoch=epoch) for seed in seeds]
        states, logs = train_fused_pass(model, states, x, y, orders, batch_size=batch_size, scalars=scalars)
        for member, member_logs in enumerate(logs):
            errors[member] = errors[member] or divergence(member_logs, iteration=iteration, shard=shard,
                                                          epoch=epoch, epochs=epochs)
            per_epoch[member].append(member_logs)
    seconds = time.perf_counter() - started
    return states, [error or hop_summary(per_epoch[m], steps=int(states[m][2][step_index]) - steps_before[m],
                                         samples=rows * epochs, train_seconds=seconds)
                    for m, error in enumerate(errors)]
