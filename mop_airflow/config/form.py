"""A DAG's trigger form as plain data.

:func:`form_fields` derives typed fields from the DAG's spec: search method, architectures (the
DAG's own builders), optimizers, learning rates (a list, or a low/high range where the spec draws
from a distribution), batch sizes, epochs per hop, ranking metric, the adaptive plan's fixed R and
eta, and one JSON escape hatch. :mod:`mop_airflow.airflow.render` turns them into Airflow Params, and
:func:`mop_airflow.config.trigger.apply_conf` reads a run's conf against them.

Imports no Airflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from mop_airflow.errors import SpecError
from mop_airflow.search.space import _DEFAULTS, OPTIMIZERS
from mop_airflow.config import MopSpec, metric_direction

OVERRIDES = "overrides"
TRAINING = "Training and ranking"
ADVANCED = "Advanced: spec overrides (JSON)"
# The form's multi-selects offer these (and the DAG's own values); a conf may name any other.
LEARNING_RATES = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
BATCH_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
# Every field some DAG's form may have: a conf naming one this DAG leaves out is told so.
ANY_FIELD_NAMES = {"method", "num_samples", "architectures", "optimizer", "learning_rate", "learning_rate_low",
              "learning_rate_high", "batch_size", "batch_size_low", "batch_size_high", "epochs_per_hop", "metric",
              "R", "n", "r", "eta", "budget", OVERRIDES}
_OPTIMIZER_NAMES = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "rmsprop": "RMSprop", "adagrad": "Adagrad",
                    "adadelta": "Adadelta", "adamax": "Adamax", "nadam": "Nadam", "ftrl": "FTRL", "lion": "Lion",
                    "lamb": "LAMB", "adafactor": "Adafactor"}
_HOW = {"log_uniform": "log-uniformly", "uniform": "uniformly", "int_uniform": "uniformly (whole numbers)",
        "quantized_uniform": "uniformly on multiples of q", "quantized_log_uniform": "log-uniformly on multiples of q",
        "log_near_one": "close to 1 (1 - 10**u, u uniform)"}


@dataclass(frozen=True)
class FormField:
    """One trigger-form field: its conf key, default, JSON schema (with Airflow's form keys ``title``,
    ``section``, ``description_md``, ``values_display``, ``examples``) and the part of the spec it edits."""

    name: str
    default: Any
    schema: Mapping[str, Any]
    target: tuple[str, ...]


def form_fields(spec: MopSpec | Mapping[str, Any]) -> dict[str, FormField]:
    """The fields of ``spec``'s trigger form, in form order; a field that could not take effect is left out."""
    spec = spec if isinstance(spec, MopSpec) else MopSpec.from_dict(spec)
    space, adaptive = spec.search.space, spec.search.adaptive
    params = space.to_dict()["params"]
    out: list[FormField] = []
    if adaptive is None:
        out += _method_fields(spec, params)
    builders = _listed(params["model"])
    if builders is not None and len(builders) > 1:
        draw = "grid search trains each one with every combination below; random search draws one per configuration"
        out.append(FormField("architectures", builders, {
            "type": "array", "title": "Architectures", "minItems": 1,
            "items": {"type": "string", "enum": builders}, "examples": builders,
            "values_display": {b: f"{b.rsplit(':', 1)[1]} ({b.rsplit(':', 1)[0]})" for b in builders},
            "description_md": "The DAG's model builders (`build(hparams) -> keras.Model`, by import path): "
                              + (draw if adaptive is None else "each configuration draws one") + "."},
            ("param", "model", "str")))
    optimizers = _listed(params.get("optimizer", _DEFAULTS["optimizer"]))
    if optimizers is not None:
        optimizers = [str(o).lower() for o in optimizers]
        out.append(FormField("optimizer", optimizers, {
            "type": "array", "title": "Optimizers", "minItems": 1,
            "items": {"type": "string", "enum": list(OPTIMIZERS)}, "examples": list(OPTIMIZERS),
            "values_display": _OPTIMIZER_NAMES,
            "description_md": "Keras optimizers; each model is compiled with one of them and a learning rate below."},
            ("param", "optimizer", "str")))
    out += _number_fields(params, "learning_rate", "Learning rates", float, LEARNING_RATES, 0.0005)
    out += _number_fields(params, "batch_size", "Batch sizes", int, BATCH_SIZES, 96)
    if "epochs_per_hop" not in params:
        out.append(_epochs_field(spec))
    metrics = [m for m in ["val_loss", *(f"val_{m}" for m in space.metric_names() if m != "loss")]
               if m == spec.search.metric or _direction(m)]
    if len(metrics) > 1:
        out.append(FormField("metric", spec.search.metric, {
            "type": "string", "title": "Ranking metric", "section": TRAINING, "enum": metrics,
            "values_display": {m: f"{m} ({'lower' if _direction(m, spec) == 'min' else 'higher'} is better)"
                               for m in metrics},
            "description_md": "The validation metric the leaderboard ranks on"
                              + (" and each rung promotes on" if adaptive else "")
                              + "; whether lower or higher is better follows its name."}, ("metric",)))
    if adaptive is not None:
        out += _fixed_fields(spec)
    out.append(FormField(OVERRIDES, {}, {
        "type": ["object", "null"], "title": "Spec overrides", "section": ADVANCED,
        "description_md": "JSON applied after the fields above, section by section and field by field: e.g. "
                          "`{\"search\": {\"fail_fast\": true}}`, `{\"schedule\": {\"seed\": 7}}` or "
                          "`{\"data\": {\"source\": \"s3://bucket/train/\"}}`. `search` takes `space`, `metric`, "
                          "`direction` (`min`/`max`), `fail_fast` and `max_configurations`. `schedule.shards`, "
                          "`schedule.iterations`, `schedule.iterations_per_run`, `schedule.slots_per_shard` and "
                          "`search.adaptive` shape the DAG and are fixed when the DAG file is parsed; a part of the spec set here and in a "
                          "changed field above is an error."}, ("overrides",)))
    return {f.name: f for f in out}


def _method_fields(spec: MopSpec, params: Mapping[str, Any]) -> list[FormField]:
    space = spec.search.space
    nullable = all(_listed(v) is not None for v in _dimensions(params))
    samples: dict[str, Any] = {"title": "Configurations to draw", "minimum": 1,
                               "maximum": max(spec.search.max_configurations, space.num_samples or 1)}
    if not nullable:  # a distribution cannot be crossed in a grid: this DAG's search is random
        return [FormField("num_samples", space.num_samples, {
            "type": "integer", **samples, "description_md": "How many configurations random search draws."},
            ("num_samples",))]
    size = grid_size(params)
    return [
        FormField("method", space.method, {
            "type": "string", "title": "Search method", "enum": ["grid", "random"],
            "values_display": {"grid": "Grid: every combination", "random": "Random: draw some combinations"},
            "description_md": f"**Grid** trains every combination of the values below ({size} with this form's "
                              "defaults); **random** draws *Configurations to draw* of them, each hyperparameter "
                              "from its own seeded stream."}, ("method",)),
        FormField("num_samples", space.num_samples, {
            "type": ["integer", "null"], **samples,
            "description_md": "Random search only: how many configurations to draw. Leave empty for grid search."},
            ("num_samples",)),
    ]


def _number_fields(params: Mapping[str, Any], key: str, title: str, kind: type, examples: tuple,
                   other: float) -> list[FormField]:
    value = params.get(key, _DEFAULTS[key])
    listed = _listed(value)
    # Strings too: the form's multi-select sends the values it offers as strings.
    items = {"type": ["integer", "string"] if kind is int else ["number", "string"],
             **({"minimum": 1} if kind is int else {"exclusiveMinimum": 0})}
    if listed is not None:
        return [FormField(key, listed, {
            "type": "array", "title": title, "minItems": 1, "items": items,
            "examples": sorted(set(examples) | set(listed)),
            "description_md": f"Pick one or more; each configuration takes one. A value not offered here goes into "
                              f"the trigger conf, e.g. `{{\"{key}\": {[other]}}}`."},
            ("param", key, "int" if kind is int else "float"))]
    how = _HOW[value["distribution"]]  # every distribution but a choice is a range
    bound = {"type": "integer", "minimum": 1} if kind is int else {"type": "number", "exclusiveMinimum": 0}
    word = title.lower()[:-1]
    return [FormField(f"{key}_{end}", value[end], {
        **bound, "title": f"{title[:-1]}: {'lowest' if end == 'low' else 'highest'}",
        "maximum": max(value[end], 10 if kind is float else 65536),
        "description_md": f"Each configuration draws its {word} {how} between the lowest and the highest."},
        ("range", key, end)) for end in ("low", "high")]


def _epochs_field(spec: MopSpec) -> FormField:
    plan = spec.adaptive_plan()
    if plan is None:
        total = (f"a model trains iterations x epochs per hop epochs in all ({spec.schedule.iterations} x "
                 f"{spec.schedule.epochs_per_hop} with the defaults)")
    else:
        iters = rung_iterations(plan)
        total = f"a configuration trains {iters[0]} to {iters[-1]} iterations, each of that many epochs per shard"
    return FormField("epochs_per_hop", spec.schedule.epochs_per_hop, {
        "type": "integer", "title": "Epochs per hop", "section": TRAINING, "minimum": 1,
        "maximum": max(100, spec.schedule.epochs_per_hop),
        "description_md": f"Passes over a shard each time a model visits it; one iteration visits every shard once, so "
                          f"{total}. 1 is logically sequential SGD over all the data; more hop less often but "
                          "converge worse."}, ("epochs_per_hop",))


NAMES = {"asha": "ASHA", "pbt": "Population-based training"}


def _fixed_fields(spec: MopSpec) -> list[FormField]:
    """The adaptive plan shapes the DAG: shown for reference, with the only value a run can take."""
    from mop_airflow.search.adaptive import brackets_of  # noqa: PLC0415

    adaptive = dict(spec.search.adaptive or {})
    method = adaptive["method"]
    plan = spec.adaptive_plan()
    brackets = brackets_of(plan)
    keys = {"hyperband": (("R", None, "R: most iterations a configuration trains"),
                          ("eta", 3, "η (eta): each rung keeps the best 1/η")),
            "successive_halving": (("n", None, "n: configurations the bracket starts with"),
                                   ("r", 1, "r: iterations of the first rung"),
                                   ("eta", 3, "η (eta): each rung keeps the best 1/η")),
            "asha": (("n", None, "n: configurations started in all"), ("r", 1, "r: iterations of the first rung"),
                     ("R", None, "R: most iterations a configuration trains"),
                     ("eta", 3, "η (eta): a rung promotes its best 1/η"),
                     *((("budget", None, "budget: iterations the whole search may train"),)
                       if "budget" in adaptive else ())),
            "pbt": (("population", None, "population: members training side by side"),
                    ("iterations", None, "iterations: how long every member trains"),
                    ("interval", 1, "interval: iterations between two rankings"))}[method]
    section = f"{NAMES.get(method) or method.replace('_', ' ').capitalize()} (set in the DAG file)"
    shape = (f"{len(brackets)} bracket(s), " if brackets else
             "decided inside the shard slots, " if method == "asha" else "one block per interval, ")
    ends = "rankings after" if method == "pbt" else "rungs of"
    note = (f"These decide the search's rungs, so they are set in the DAG file (`search.adaptive`), not per run. "
            f"This DAG: {shape}{plan.total_configurations} configurations, {ends} "
            f"{', '.join(rung_iterations(plan))} iteration(s).")
    out = []
    for k, (key, default, title) in enumerate(keys):
        value = adaptive.get(key, default)
        # PBT's options are named pbt_<option> in the form: its "iterations" is not schedule.iterations
        out.append(FormField(f"pbt_{key}" if method == "pbt" else key, value, {
            "type": "integer", "title": title, "section": section, "enum": [value],
            "values_display": {str(value): f"{value} (set in the DAG file)"},
            **({"description_md": note} if k == 0 else {})}, ("fixed", key)))
    return out


def rung_iterations(plan: Any) -> list[str]:
    """The distinct iteration counts an adaptive plan's rungs train to, smallest first ("1", "3", "9")."""
    from mop_airflow.search.adaptive import brackets_of  # noqa: PLC0415
    from mop_airflow.search.asha import AshaPlan  # noqa: PLC0415
    from mop_airflow.search.pbt import PbtPlan  # noqa: PLC0415

    if isinstance(plan, AshaPlan):
        return [str(r) for r in plan.rungs]
    if isinstance(plan, PbtPlan):
        return [str(b) for b in [*plan.boundaries, plan.iterations]]
    return [str(r) for r in sorted({rung.r_i for b in brackets_of(plan) for rung in b.rungs})]


def _listed(value: Any) -> list[Any] | None:
    """The values a list, a scalar or a choice distribution names; None for any other distribution."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, Mapping):
        return list(value["values"]) if is_choice(value) else None
    return [value]


def is_choice(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("distribution") == "choice"


def _dimensions(params: Mapping[str, Any]) -> list[Any]:
    return [v for k, v in params.items() if k not in ("hparams", "optimizer_params", "metrics")] + [
        v for k in ("hparams", "optimizer_params") for v in dict(params.get(k) or {}).values()]


def grid_size(params: Mapping[str, Any]) -> int:
    return math.prod(len(_listed(v) or []) for v in _dimensions(params))


def _direction(metric: str, spec: MopSpec | None = None) -> str | None:
    if spec is not None and metric == spec.search.metric:
        return spec.search.direction
    try:
        return metric_direction(metric)
    except SpecError:
        return None


