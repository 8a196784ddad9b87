"""Which configurations may train fused, as one compiled program, and in which groups.

The rules are :mod:`mop_airflow.training.fused`'s (why these and not others: that module and
docs/concepts/fused-configurations.md); they live here because the plan deals each group into one
offset class, so its members reach the same shard at the same hop. Pure: no Keras.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from mop_airflow.config.spec import check_fuse

# Optimizer settings a fused group may vary: the learning rate is an optimizer variable; weight decay a
# float read once per trace and multiplied in as it is cast (so the same step either way).
FUSABLE_SCALARS = ("learning_rate", "weight_decay")
# schedule.fuse "auto": the best group of benchmarks/fused_cpu.py on a loaded 2-core machine (2026-11-27); on a
# quiet one no group paid on the CPU (docs/performance.md#fused-cpu), and the GPU is not measured yet.
AUTO_LIMIT = 8


def fuse_limit(setting: int | str | bool) -> int:
    """How many configurations a fused group may hold under ``schedule.fuse`` (1: none fuse)."""
    check_fuse(setting)
    return 1 if setting in ("off", False) else AUTO_LIMIT if setting == "auto" else int(setting)


def fuse_key(config: Mapping[str, Any]) -> str | None:
    """What must be equal for configurations to fuse, as a string; None for one that trains alone."""
    params = dict(config.get("optimizer_params") or {})
    if params.get("use_ema"):
        return None  # fit swaps the averaged weights in at the end of every pass: not a step's work
    for name in FUSABLE_SCALARS:
        value = params.pop(name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return None  # a schedule or another object: its own program
        if name != "learning_rate":
            params[f"{name} is set"] = value is not None  # None turns the decay off: another program
    rest = {k: v for k, v in config.items() if k not in ("config_id", "optimizer_params")}
    return json.dumps([rest, params], sort_keys=True, default=str)


def fuse_groups(configs: Iterable[Mapping[str, Any]], limit: int | str | bool, backend: str) -> list[list[str]]:
    """The configurations' ids in fused groups of at most ``limit`` (``schedule.fuse``), each group one
    :func:`fuse_key`, in the order of their first member; a configuration that cannot fuse is a group of
    its own. Groups of one key are cut into sizes that differ by at most one (10 with a limit of 8: 5
    and 5, not 8 and 2: the same program's work, half the slowest group's). Nothing fuses on a backend
    but ``"jax"``. Deterministic: the configurations' order decides."""
    size = fuse_limit(limit)
    configs = list(configs)
    keys = {c["config_id"]: (fuse_key(c) if backend == "jax" and size > 1 else None) for c in configs}
    by_key: dict[str, list[str]] = {}
    leaders: list[tuple[str, str | None]] = []  # (first member, key) in order
    for config in configs:
        cid, key = config["config_id"], keys[config["config_id"]]
        if key is None:
            leaders.append((cid, None))
        elif key not in by_key:
            by_key[key] = [cid]
            leaders.append((cid, key))
        else:
            by_key[key].append(cid)
    groups: list[list[str]] = []
    for cid, key in leaders:
        if key is None:
            groups.append([cid])
            continue
        members = by_key[key]
        count = math.ceil(len(members) / size)
        bounds = [len(members) * i // count for i in range(count + 1)]
        groups.extend(members[a:b] for a, b in zip(bounds, bounds[1:]))
    return groups


def groups_of(run: Any, config_ids: Sequence[str]) -> list[list[str]]:
    """``config_ids`` of ``run`` (a :class:`~mop_airflow.records.RunRecord`) in the groups its
    ``schedule.fuse`` allows, in their order. Cut as on JAX whatever the workers' backend: the plan deals
    them together either way, and a worker on another backend trains each alone."""
    configs = {c["config_id"]: c for c in run.configs}
    return fuse_groups([configs[c] for c in config_ids], run.schedule.fuse, "jax")


def grouping(run: Any) -> Callable[[Sequence[str]], list[list[str]]] | None:
    """:func:`groups_of` for ``run``, as the shard loop's ``block_hops(fuse=...)`` takes it; None when
    ``schedule.fuse`` is off."""
    return functools.partial(groups_of, run) if fuse_limit(run.schedule.fuse) > 1 else None
