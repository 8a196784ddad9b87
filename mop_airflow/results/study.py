"""A search as an Optuna study: for ``mop-airflow export-study`` (a storage file that
``optuna-dashboard`` and Optuna's plots open) and for which hyperparameters mattered.

Each configuration is a trial with its searched values as parameters: complete when it trained to
its end with a finite metric, pruned when an adaptive search stopped it (or PBT replaced it), failed
otherwise; its validation metric after every evaluated iteration is an intermediate value, and its
id, model and outcome are user attributes. A parameter's distribution spans the values the
configurations took (log-scaled where the search space's distribution is), so values a PBT
exploration or a proposal reached are all inside it. Reads the report's records only: no Airflow,
no TensorFlow.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from mop_airflow.records import RunRecord
from mop_airflow.search.distributions import Distribution
from mop_airflow.search.space import SearchSpace, config_field

LOG_SCALED = ("log_uniform", "quantized_log_uniform")


def searched_fields(run: RunRecord) -> dict[str, bool]:
    """The fields the search varied, each with whether its scale is logarithmic: the space's lists of
    several values and distributions, and PBT's mutated fields."""
    space = SearchSpace.from_dict(run.spec["search"]["space"])
    out = {k: isinstance(v, Distribution) and v.name in LOG_SCALED
           for k, v in space.dimensions().items() if isinstance(v, Distribution) or len(v) > 1}
    for key, spec in dict((run.adaptive or {}).get("mutations") or {}).items():
        out.setdefault(key, isinstance(spec, Mapping) and spec.get("distribution") in LOG_SCALED)
    return out


def build_study(run: RunRecord, board: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], *,
                storage: Any = None, study_name: str | None = None) -> Any:
    """The study of ``run`` from its leaderboard rows (``board``) and metrics table (``rows``), in
    ``storage`` (an Optuna storage or URL; None: in memory)."""
    import optuna  # noqa: PLC0415

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metric = run.metric
    configs = {c["config_id"]: c for c in run.configs}
    fields = searched_fields(run)
    values = {k: [config_field(configs[r["config_id"]], k) for r in board if r["config_id"] in configs] for k in fields}
    distributions = {k: d for k, d in ((k, _distribution(v, fields[k])) for k, v in values.items()) if d is not None}
    curves: dict[str, dict[int, float]] = {}
    for row in rows:
        value = row.get(metric)
        if row.get("complete") and _finite(value):
            curves.setdefault(row["config_id"], {})[int(row["iteration"])] = float(value)
    study = optuna.create_study(storage=storage, study_name=study_name or f"{run.dag_id}/{run.run_id}",
                                direction="minimize" if run.direction == "min" else "maximize")
    study.set_user_attr("metric", metric)
    study.set_user_attr("dag_id", run.dag_id)
    study.set_user_attr("run_id", run.run_id)
    for row in board:
        config = configs.get(row["config_id"])
        if config is None:
            continue
        value, status = row.get(metric), row.get("status")
        state = (optuna.trial.TrialState.COMPLETE if status == "finished" and _finite(value) else
                 optuna.trial.TrialState.PRUNED if status == "pruned" else optuna.trial.TrialState.FAIL)
        study.add_trial(optuna.trial.create_trial(
            params={k: config_field(config, k) for k in distributions}, distributions=distributions,
            value=float(value) if state == optuna.trial.TrialState.COMPLETE else None, state=state,
            intermediate_values=curves.get(row["config_id"], {}),
            user_attrs={"config_id": row["config_id"], "model": config["model"],
                        "outcome": row.get("outcome") or status or ""}))
    return study


def importance(run: RunRecord, board: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
               ) -> dict[str, Any] | None:
    """Which hyperparameters mattered for the metric: Optuna's fANOVA importances over the configurations
    that finished (PED-ANOVA where scikit-learn, which fANOVA's forest needs, is missing); None when
    fewer than three finished or nothing varied."""
    import optuna  # noqa: PLC0415

    study = build_study(run, board, rows)
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    varied = {k for k, d in (complete[0].distributions.items() if complete else ()) if not d.single()}
    if len(complete) < 3 or not varied:
        return None
    try:
        evaluator, name = optuna.importance.FanovaImportanceEvaluator(seed=0), "fANOVA"
        found = optuna.importance.get_param_importances(study, evaluator=evaluator, params=sorted(varied))
    except ImportError:
        evaluator, name = optuna.importance.PedAnovaImportanceEvaluator(), "PED-ANOVA"
        found = optuna.importance.get_param_importances(study, evaluator=evaluator, params=sorted(varied))
    return {"metric": run.metric, "evaluator": name, "trials": len(complete),
            "importances": [{"field": k, "importance": float(v)} for k, v in found.items()]}


def _distribution(values: Sequence[Any], log: bool) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: PLC0415

    if not values:
        return None
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numbers and all(isinstance(v, int) for v in values):
        return IntDistribution(min(values), max(values), log=log and min(values) > 0)
    if numbers:
        low, high = float(min(values)), float(max(values))
        return FloatDistribution(low, high, log=log and low > 0)
    if not all(v is None or isinstance(v, (str, int, float, bool)) for v in values):
        return None  # a list-valued field (units per layer, say): not a parameter Optuna can hold
    return CategoricalDistribution(sorted(set(values), key=repr))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def export_study(layout: Any, out: str) -> Any:
    """Write the reported run of ``layout`` as an Optuna study in the SQLite file ``out``."""
    import os  # noqa: PLC0415

    from mop_airflow.errors import SpecError, StoreError  # noqa: PLC0415
    from mop_airflow.records.layout import read_run  # noqa: PLC0415

    if os.path.exists(out):
        raise SpecError("--out", out, "already exists", "name a new file, or remove the old one first")
    store = layout.store
    board_uri, rows_uri = layout.report_uri("leaderboard.json"), layout.report_uri("metrics.json")
    if not store.exists(board_uri):
        raise StoreError(f"run {layout.run_id} of {layout.dag_id} has no report yet ({board_uri}). Fix: wait for "
                         "its report task, or write one with `mop-airflow report`")
    run = read_run(layout)
    board = store.read_json(board_uri)["leaderboard"]
    rows = store.read_json(rows_uri) if store.exists(rows_uri) else []
    return build_study(run, board, rows, storage=f"sqlite:///{os.path.abspath(out)}")
