"""Model-based proposals: Optuna's TPE sampler (Bergstra et al. 2011, the algorithm of Hyperopt)
through its ask-and-tell interface, rebuilt from our records at each decision.

    "space": {"method": "random", "sampler": "tpe", "startup": 10, "num_samples": 32, "params": {...}}

The search's records stay the one truth: at every decision an in-memory Optuna study is built from
the configurations so far. One that completed its last rung is a complete trial with its metric; one
stopped at a lower rung (ASHA, Hyperband) a pruned trial with its metric at that rung's iterations as
an intermediate value, which TPE ranks below the complete ones by how far they got, as Optuna's own
pruners leave them; one still training is a running trial (TPE's ``constant_liar`` counts it as bad,
so two proposals of one decision spread out); a failed one is a failed trial. The sampler is seeded by
the space's seed and the block, so the same records always give the same proposals.

Our distributions map onto Optuna's: ``log_uniform`` and ``uniform`` to a float (log or not),
``int_uniform`` to an int, ``quantized_uniform`` to a float or int with a step, a list or ``choice``
to a categorical. ``quantized_log_uniform`` (Optuna has no log scale with a step) is proposed on the
log scale and put on its grid, ``log_near_one`` on the scale of ``log10(1 - value)``.
No Airflow, no TensorFlow.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from mop_airflow.search.distributions import Distribution
from mop_airflow.search.jobs import Completion
from mop_airflow.search.space import SearchSpace, config_field


def proposer(space: SearchSpace, configs: Sequence[Mapping[str, Any]], completions: Sequence[Completion],
             running: Sequence[str], *, top_rung: int, direction: str, block: int, default_epochs_per_hop: int,
             new_id: Callable[[Mapping[str, Any]], str]) -> Callable[[], dict[str, Any]]:
    """A function that proposes the next configuration (with its ``config_id``) from the records:
    ``configs`` so far, their ``completions`` (rung ``top_rung`` is the last), the ``running`` ones.
    Each call asks the same study again, so proposals of one decision differ."""
    import optuna  # noqa: PLC0415 - only a model-based search needs it

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dims = {k: v for k, v in space.dimensions().items() if _searched(v)}
    distributions = {k: _optuna(v) for k, v in dims.items()}
    sampler = optuna.samplers.TPESampler(n_startup_trials=0, seed=space.seed * 100_003 + block, constant_liar=True,
                                         multivariate=True)
    study = optuna.create_study(direction="minimize" if direction == "min" else "maximize", sampler=sampler)
    last: dict[str, Completion] = {}
    for done in completions:
        if done.config_id not in last or done.rung >= last[done.config_id].rung:
            last[done.config_id] = done
    busy = set(running)
    for config in configs:
        params = {k: _param(dims[k], config_field(config, k)) for k in dims}
        if any(not distributions[k]._contains(distributions[k].to_internal_repr(v)) for k, v in params.items()):
            continue  # a configuration from outside this space (an edited spec): the model cannot place it
        study.add_trial(_trial(optuna, params, distributions, last.get(config["config_id"]),
                               config["config_id"] in busy, top_rung))

    def propose() -> dict[str, Any]:
        trial = study.ask(distributions)
        combo = {k: _value(dims[k], trial.params[k]) for k in dims}
        combo.update({k: v[0] for k, v in space.dimensions().items() if k not in dims})
        config = space.assemble(combo, default_epochs_per_hop)
        return {"config_id": new_id(config), **config}

    return propose


def _trial(optuna: Any, params: dict[str, Any], distributions: dict[str, Any], done: Completion | None,
           busy: bool, top_rung: int) -> Any:
    state = optuna.trial.TrialState
    ok = done is not None and done.status == "ok" and done.metric is not None and math.isfinite(done.metric)
    if busy or done is None:
        return optuna.trial.create_trial(params=params, distributions=distributions, state=state.RUNNING)
    if not ok:
        return optuna.trial.create_trial(params=params, distributions=distributions, state=state.FAIL)
    if done.rung >= top_rung:
        return optuna.trial.create_trial(params=params, distributions=distributions, value=done.metric)
    return optuna.trial.create_trial(params=params, distributions=distributions, state=state.PRUNED,
                                     intermediate_values={done.rung: done.metric})


def _searched(dim: Any) -> bool:
    """A field TPE chooses: a distribution, or a list of more than one value."""
    return isinstance(dim, Distribution) or len(dim) > 1


def _optuna(dim: Any) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: PLC0415

    if isinstance(dim, list):
        return CategoricalDistribution(dim)
    if dim.name == "choice":
        return CategoricalDistribution(list(dim.choices))
    if dim.name in ("uniform", "log_uniform", "quantized_log_uniform"):
        return FloatDistribution(dim.low, dim.high, log=dim.name != "uniform")
    if dim.name == "int_uniform":
        return IntDistribution(int(dim.low), int(dim.high))
    if dim.name == "quantized_uniform":
        low, high = dim._on_grid(dim.low), dim._on_grid(dim.high)
        if dim.integer:
            return IntDistribution(int(low), int(high), step=int(dim.q))
        return FloatDistribution(low, high, step=dim.q)
    if dim.name == "log_near_one":
        return FloatDistribution(math.log10(1.0 - dim.high), math.log10(1.0 - dim.low))
    raise AssertionError(dim.name)  # parse_distribution admits no other name


def _param(dim: Any, value: Any) -> Any:
    """Our value as the study's parameter."""
    if isinstance(dim, Distribution) and dim.name == "log_near_one":
        return math.log10(1.0 - value)
    return value


def _value(dim: Any, param: Any) -> Any:
    """The study's parameter as our value."""
    if not isinstance(dim, Distribution):
        return param
    if dim.name == "log_near_one":
        return 1.0 - 10.0 ** param
    if dim.name == "quantized_log_uniform":
        return dim._on_grid(param)
    if dim.name == "quantized_uniform" and not dim.integer:
        return dim._on_grid(param)  # 0.30000000000000004 -> 0.3, as the random draw gives
    return param
