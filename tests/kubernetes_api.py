"""Strict checks of Kubernetes objects against the Kubernetes API, through the official client's
models (the API of the client's version: client 36 = Kubernetes 1.36).

The client's own deserialization drops unknown fields without a word and accepts any type in a
string field; here every key must be a field of its model (in the API's camelCase), every value of
its declared type, and every required field present (the models' own check, on construction).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from kubernetes import client

PRIMITIVES = {"str": str, "int": int, "float": (int, float), "bool": bool}


def api_errors(data: Any, kind: str, path: str = "") -> list[str]:
    """What in ``data`` is not a valid ``kind`` (a model name such as ``"V1Pod"``, or the client's
    ``list[...]`` and ``dict`` type strings); empty when it is valid."""
    if data is None:
        return []
    if kind.startswith("list["):
        if not isinstance(data, list):
            return [f"{path}: a list expected, got {data!r}"]
        inner = kind[5:-1]
        return [e for i, item in enumerate(data) for e in api_errors(item, inner, f"{path}[{i}]")]
    if kind.startswith(("dict(", "dict[")):  # the client writes dict(str, X) up to 35, dict[str, X] from 36
        if not isinstance(data, dict):
            return [f"{path}: a mapping expected, got {data!r}"]
        inner = re.match(r"dict[(\[]([^,]*), (.*)[)\]]$", kind).group(2)
        return [e for key, value in data.items() for e in api_errors(value, inner, f"{path}.{key}")]
    if kind in PRIMITIVES:
        ok = isinstance(data, PRIMITIVES[kind]) and not (kind != "bool" and isinstance(data, bool))
        return [] if ok else [f"{path}: {kind} expected, got {data!r}"]
    if kind == "object":
        return []
    if kind == "datetime":
        return [] if isinstance(data, (str, dt.datetime)) else [f"{path}: a timestamp expected, got {data!r}"]
    model = getattr(client.models, kind)
    if not isinstance(data, dict):
        return [f"{path}: {kind} (a mapping) expected, got {data!r}"]
    fields = {json_name: attr for attr, json_name in model.attribute_map.items()}
    errors = [f"{path}.{key}: not a field of {kind} (fields: {sorted(fields)})" for key in data if key not in fields]
    for key, value in data.items():
        if key in fields:
            errors += api_errors(value, model.openapi_types[fields[key]], f"{path}.{key}")
    if not errors:
        try:  # required fields: the model refuses None for them
            client.ApiClient()._ApiClient__deserialize(data, kind)  # noqa: SLF001
        except ValueError as exc:
            errors.append(f"{path}: {kind}: {exc}")
    return errors


def assert_valid(data: Any, kind: str, what: str = "") -> None:
    errors = api_errors(data, kind, what or kind)
    assert not errors, "\n".join(errors)
