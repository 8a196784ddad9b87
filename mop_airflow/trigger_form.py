"""A DAG's trigger form as plain data, and how a run's conf becomes the run's spec.

:func:`form_fields` derives typed fields from the DAG's spec: search method, architectures (the
DAG's own builders), optimizers, learning rates (a list, or a low/high range where the spec draws
from a distribution), batch sizes, epochs per hop, ranking metric, the adaptive plan's fixed R and
eta, and one JSON escape hatch. :mod:`mop_airflow.airflow.dag` turns them into Airflow Params.

:func:`apply_conf` reads a run's conf the same way whether the trigger form sent it (every field),
the REST API or ``airflow dags trigger --conf`` (only the keys named):

1. a typed field whose value differs from its default edits the DAG's spec, so an untouched form
   runs the DAG file's spec exactly;
2. spec sections (``{"search": {...}}`` at the top level, or inside the form's ``overrides``) then
   merge field by field, as trigger confs always did. A changed field whose part of the spec the JSON
   sets too is an error, never a silent choice; so is any other key (a misspelt one is named).

Imports no Airflow.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Mapping

from mop_airflow.errors import SpecError
from mop_airflow.search.space import _DEFAULTS, OPTIMIZERS
from mop_airflow.spec import SPEC_SECTIONS as SECTIONS
from mop_airflow.spec import MopSpec, metric_direction, section_overrides

OVERRIDES = "overrides"
TRAINING = "Training and ranking"
ADVANCED = "Advanced: spec overrides (JSON)"
# The form's multi-selects offer these (and the DAG's own values); a conf may name any other.
LEARNING_RATES = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
BATCH_SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
# Every field some DAG's form may have: a conf naming one this DAG leaves out is told so.
_ANY_FIELD = {"method", "num_samples", "architectures", "optimizer", "learning_rate", "learning_rate_low",
              "learning_rate_high", "batch_size", "batch_size_low", "batch_size_high", "epochs_per_hop", "metric",
              "R", "n", "r", "eta", OVERRIDES}
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
                          "`direction` (`min`/`max`), `fail_fast` and `max_configurations`. Shards, iterations and "
                          "the adaptive plan are fixed by the DAG file; a part of the spec set here and in a "
                          "changed field above is an error."}, ("overrides",)))
    return {f.name: f for f in out}


def apply_conf(spec: MopSpec | Mapping[str, Any], conf: Any) -> MopSpec:
    """The run's spec: ``spec`` (the DAG's) edited by the conf's typed fields, then its spec sections."""
    spec = spec if isinstance(spec, MopSpec) else MopSpec.from_dict(spec)
    if conf is None:
        return spec
    if not isinstance(conf, Mapping):
        raise SpecError("conf", conf, "must be a mapping of form fields or spec sections",
                        "trigger with e.g. {\"learning_rate\": [0.01]} or {\"search\": {\"metric\": \"val_loss\"}}")
    fields = form_fields(spec)
    for key in conf:
        if key not in fields and key not in SECTIONS:
            raise _unknown(key, conf[key], fields)
    sections = section_overrides({k: v for k, v in conf.items() if k in SECTIONS}, "conf")
    extra = conf.get(OVERRIDES)
    if extra is not None and not isinstance(extra, Mapping):
        raise SpecError(f"conf.{OVERRIDES}", extra, "must be a JSON object of spec sections",
                        "e.g. {\"search\": {\"fail_fast\": true}}, or leave it empty")
    for section, values in section_overrides(extra or {}, f"conf.{OVERRIDES}").items():
        if section == "store":  # every task reads a run's store from the conf's top level
            raise SpecError(f"conf.{OVERRIDES}.store", values, "the store of a run is chosen at the conf's top level",
                            "trigger with {\"store\": {...}} beside the form's fields instead")
        sections.setdefault(section, {}).update(values)
    edits = {}
    for name, value in conf.items():
        if name in fields and name != OVERRIDES:
            value = _normalize(fields[name], value)
            if value != fields[name].default:
                edits[name] = value
    for (section, key), value in _typed_edits(spec, fields, edits).items():
        if key in sections.get(section, {}) and (section, key) in _OWNERS:
            name = next(n for n in edits if fields[n].target[0] in _OWNERS[(section, key)])
            raise SpecError(f"conf.{name}", edits[name], f"is changed while the JSON also sets {section}.{key}",
                            "set it in one place: the form field, or the JSON overrides")
        sections.setdefault(section, {}).setdefault(key, value)
    return spec.with_overrides(sections)


# Which fields edit which part of the spec (the part a JSON section replaces as a whole).
_OWNERS = {("search", "space"): ("param", "range", "method", "num_samples"), ("search", "metric"): ("metric",),
           ("schedule", "epochs_per_hop"): ("epochs_per_hop",)}


def _typed_edits(spec: MopSpec, fields: Mapping[str, FormField], edits: Mapping[str, Any]) -> dict[tuple, Any]:
    """The changed fields as (section, key) -> the value that replaces it."""
    out: dict[tuple, Any] = {}
    space = spec.search.space.to_dict()
    params = space["params"]
    for name, value in edits.items():
        kind, *where = fields[name].target
        if kind == "param":
            key = where[0]
            params[key] = {**params[key], "values": value} if _is_choice(params.get(key)) else value
        elif kind == "range":
            key, end = where
            params[key] = {**params[key], end: value}
            low, high = params[key]["low"], params[key]["high"]
            if low >= high:
                other = f"{key}_{'high' if end == 'low' else 'low'}"
                raise SpecError(f"conf.{name}", value, f"must be {'below' if end == 'low' else 'above'} "
                                f"{other}={params[key]['high' if end == 'low' else 'low']}",
                                f"make {key}_low smaller than {key}_high")
        elif kind == "epochs_per_hop":
            out[("schedule", "epochs_per_hop")] = value
        elif kind == "metric":
            out[("search", "metric")] = value
            out[("search", "direction")] = spec.search.direction if value == spec.search.metric else None
        elif kind == "fixed":
            raise SpecError(f"conf.{name}", value, "decides the brackets and rungs of the DAG's graph, so it is fixed "
                            "when the DAG file is parsed", f"change search.adaptive in the DAG file ({name}="
                            f"{fields[name].default} there), or leave {name} out of the conf")
    if "num_samples" in fields:
        method = edits.get("method", space["method"])
        samples = edits.get("num_samples", fields["num_samples"].default)
        if method == "random" and samples is None:
            raise SpecError("conf.num_samples", None, "random search needs a number of configurations to draw",
                            f"set num_samples, e.g. {_grid_size(params)} (the grid's size)")
        if method == "grid" and edits.get("num_samples") is not None:
            raise SpecError("conf.num_samples", edits["num_samples"], "only applies to random search",
                            "set method to 'random', or leave num_samples empty")
        if method == "grid":
            params = {k: _unwrap_choices(v) for k, v in params.items()}
        space.update(method=method, num_samples=samples if method == "random" else None, params=params)
    if any(fields[n].target[0] in _OWNERS[("search", "space")] for n in edits):
        out[("search", "space")] = space
    return out


def _normalize(field: FormField, value: Any) -> Any:
    """A field's conf value as the spec takes it, or a SpecError naming the field, the rule and the fix."""
    name, schema, (kind, *where) = field.name, field.schema, field.target
    if kind == "param":
        if not isinstance(value, (list, tuple)) or not value:
            raise SpecError(f"conf.{name}", value, "must be a non-empty list", f"e.g. {field.default!r}")
        out: list[Any] = []
        for item in value:
            item = _item(field, item, where[1])
            if item not in out:  # the form's multi-select can pick a value twice
                out.append(item)
        return out
    if kind in ("method", "metric", "fixed"):
        if kind != "fixed" and value not in schema["enum"]:
            raise SpecError(f"conf.{name}", value, f"must be one of {schema['enum']}",
                            "use 'grid' for every combination or 'random' to draw num_samples of them"
                            if kind == "method" else "pick one of them, or add the metric to "
                            "search.space.params.metrics and set search.metric in the JSON overrides")
        return value
    if value is None and "null" in schema["type"]:
        return None
    return _bounded(f"conf.{name}", value, schema, field.default)


def _item(field: FormField, item: Any, convert: str) -> Any:
    items = field.schema["items"]
    if convert == "str":
        if item not in items["enum"]:
            fix = ("pick from the listed builders; a builder of another module of this DAG goes into the JSON "
                   "overrides (search.space)" if field.name == "architectures" else f"use one of {items['enum']}")
            raise SpecError(f"conf.{field.name}", item, f"is not one of this DAG's choices {items['enum']}", fix)
        return item
    return _bounded(f"conf.{field.name}", item, items, field.default)


def _bounded(name: str, value: Any, schema: Mapping[str, Any], example: Any) -> int | float:
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    number = _number(value, integer="integer" in types)
    low, above = schema.get("minimum"), schema.get("exclusiveMinimum")
    high = schema.get("maximum")
    if number is None or (low is not None and number < low) or (above is not None and number <= above) \
            or (high is not None and number > high):
        rule = ("must be a whole number" if "integer" in types else "must be a number") + \
            (f" >= {low}" if low is not None else "") + (f" > {above}" if above is not None else "") + \
            (f" and <= {high}" if high is not None else "")
        raise SpecError(name, value, rule, f"e.g. {example!r}")
    return number


def _number(value: Any, *, integer: bool) -> int | float | None:
    """A finite number from a number or a numeric string (the form's multi-select sends its picks as strings)."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if integer:
        return int(value) if float(value).is_integer() else None
    return float(value)


def _method_fields(spec: MopSpec, params: Mapping[str, Any]) -> list[FormField]:
    space = spec.search.space
    nullable = all(_listed(v) is not None for v in _dimensions(params))
    samples: dict[str, Any] = {"title": "Configurations to draw", "minimum": 1,
                               "maximum": max(spec.search.max_configurations, space.num_samples or 1)}
    if not nullable:  # a distribution cannot be crossed in a grid: this DAG's search is random
        return [FormField("num_samples", space.num_samples, {
            "type": "integer", **samples, "description_md": "How many configurations random search draws."},
            ("num_samples",))]
    size = _grid_size(params)
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
                                   ("eta", 3, "η (eta): each rung keeps the best 1/η"))}[method]
    section = f"{method.replace('_', ' ').capitalize()} (set in the DAG file)"
    note = (f"These decide the brackets and rungs drawn in the graph, so they are set in the DAG file "
            f"(`search.adaptive`), not per run. This DAG: {len(brackets)} bracket(s), "
            f"{plan.total_configurations} configurations, rungs of {', '.join(rung_iterations(plan))} iteration(s).")
    out = []
    for k, (key, default, title) in enumerate(keys):
        value = adaptive.get(key, default)
        out.append(FormField(key, value, {
            "type": "integer", "title": title, "section": section, "enum": [value],
            "values_display": {str(value): f"{value} (set in the DAG file)"},
            **({"description_md": note} if k == 0 else {})}, ("fixed", key)))
    return out


def rung_iterations(plan: Any) -> list[str]:
    """The distinct iteration counts an adaptive plan's rungs train to, smallest first ("1", "3", "9")."""
    from mop_airflow.search.adaptive import brackets_of  # noqa: PLC0415

    return [str(r) for r in sorted({rung.r_i for b in brackets_of(plan) for rung in b.rungs})]


def _listed(value: Any) -> list[Any] | None:
    """The values a list, a scalar or a choice distribution names; None for any other distribution."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, Mapping):
        return list(value["values"]) if _is_choice(value) else None
    return [value]


def _is_choice(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("distribution") == "choice"


def _dimensions(params: Mapping[str, Any]) -> list[Any]:
    return [v for k, v in params.items() if k not in ("hparams", "optimizer_params", "metrics")] + [
        v for k in ("hparams", "optimizer_params") for v in dict(params.get(k) or {}).values()]


def _grid_size(params: Mapping[str, Any]) -> int:
    return math.prod(len(_listed(v) or []) for v in _dimensions(params))


def _unwrap_choices(value: Any) -> Any:
    if _is_choice(value):
        return list(value["values"])
    if isinstance(value, Mapping):
        return {k: _unwrap_choices(v) for k, v in value.items()}
    return value


def _direction(metric: str, spec: MopSpec | None = None) -> str | None:
    if spec is not None and metric == spec.search.metric:
        return spec.search.direction
    try:
        return metric_direction(metric)
    except SpecError:
        return None


def _unknown(key: Any, value: Any, fields: Mapping[str, FormField]) -> SpecError:
    names = list(fields)
    close = difflib.get_close_matches(str(key), names, n=1)
    if key in _ANY_FIELD or (close and not difflib.get_close_matches(str(key), SECTIONS, n=1)):
        hint = f"did you mean {close[0]!r}? U" if close else "U"
        return SpecError(f"conf.{key}", value, "is not a field of this DAG's trigger form",
                         f"{hint}se one of its fields {names} (a field that could not take effect on this DAG is "
                         "left out) or a spec section")
    return SpecError(f"conf.{key}", value, "is not a spec section",
                     f"override only data, search, schedule or store, or set a field of this DAG's trigger form {names}")
