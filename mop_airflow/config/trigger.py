"""How a run's conf becomes the run's spec.

:func:`apply_conf` reads a run's conf the same way whether the trigger form sent it (every field),
the REST API or ``airflow dags trigger --conf`` (only the keys named):

1. a typed field (:mod:`mop_airflow.config.form`) whose value differs from its default edits the DAG's
   spec, so an untouched form runs the DAG file's spec exactly;
2. spec sections (``{"search": {...}}`` at the top level, or inside the form's ``overrides``) then
   merge field by field, as trigger confs always did. A changed field whose part of the spec the JSON
   sets too is an error, never a silent choice; so is any other key (a misspelt one is named).

Imports no Airflow.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Mapping

from mop_airflow.errors import SpecError
from mop_airflow.config import SPEC_SECTIONS as SECTIONS
from mop_airflow.config import MopSpec, section_overrides
from mop_airflow.config.form import ANY_FIELD_NAMES, OVERRIDES, FormField, grid_size, is_choice, form_fields


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
    run_spec = spec.with_overrides(sections)
    _refuse_shape_changes(spec, run_spec)
    return run_spec


def _refuse_shape_changes(spec: MopSpec, run_spec: MopSpec) -> None:
    """Refuse a conf that changes what the DAG's tasks were rendered from when the DAG file was parsed.
    ``MopSpec.with_overrides`` refuses shards, iterations, iterations_per_run and the adaptive plan; a
    train task per shard slot is rendered too, so a run with other slots would train on tasks that
    are not there (or leave some idle) instead of failing with the fix."""
    rendered, asked = spec.schedule.slots_per_shard, run_spec.schedule.slots_per_shard
    if asked != rendered:
        raise SpecError("conf.schedule.slots_per_shard", asked,
                        f"shapes the DAG: its train tasks, one per shard slot ({rendered} a shard here), are "
                        "rendered when the DAG file is parsed, so a run cannot change them",
                        f"change schedule.slots_per_shard in the DAG file (and the pools to match: "
                        f"mop-airflow pools sync --slots {asked}), or leave it out of the conf")


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
            params[key] = {**params[key], "values": value} if is_choice(params.get(key)) else value
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
                            "when the DAG file is parsed", f"change search.adaptive in the DAG file ({where[0]}="
                            f"{fields[name].default} there), or leave {name} out of the conf")
    if "num_samples" in fields:
        method = edits.get("method", space["method"])
        samples = edits.get("num_samples", fields["num_samples"].default)
        if method == "random" and samples is None:
            raise SpecError("conf.num_samples", None, "random search needs a number of configurations to draw",
                            f"set num_samples, e.g. {grid_size(params)} (the grid's size)")
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


def _unwrap_choices(value: Any) -> Any:
    if is_choice(value):
        return list(value["values"])
    if isinstance(value, Mapping):
        return {k: _unwrap_choices(v) for k, v in value.items()}
    return value


def _unknown(key: Any, value: Any, fields: Mapping[str, FormField]) -> SpecError:
    names = list(fields)
    close = difflib.get_close_matches(str(key), names, n=1)
    if key in ANY_FIELD_NAMES or (close and not difflib.get_close_matches(str(key), SECTIONS, n=1)):
        hint = f"did you mean {close[0]!r}? U" if close else "U"
        return SpecError(f"conf.{key}", value, "is not a field of this DAG's trigger form",
                         f"{hint}se one of its fields {names} (a field that could not take effect on this DAG is "
                         "left out) or a spec section")
    return SpecError(f"conf.{key}", value, "is not a spec section",
                     f"override only data, search, schedule or store, or set a field of this DAG's trigger form {names}")
