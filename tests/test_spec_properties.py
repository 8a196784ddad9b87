"""Property tests: whatever a DAG file or a trigger conf holds, the spec answers with its own error.

Valid specs are mutated at one to three places (any section, field, search-space key or
hyperparameter) into arbitrary JSON values; building the spec, applying a trigger conf and
expanding the configurations must either work or raise :class:`~mop_airflow.errors.SpecError`,
which names the field, value, rule and fix. A TypeError or KeyError would reach the user as a
traceback instead.
"""

from __future__ import annotations

import copy
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mop_airflow.errors import MopError
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.config import MopSpec

MODEL = "mop_airflow.examples.mnist1d_models:mlp"
BASE = {
    "data": {"source": "/data/train.parquet", "label": "y", "features": "x*", "classes": [0, 1]},
    "search": {"space": {"method": "grid", "params": {"model": [MODEL], "learning_rate": [1e-3, 1e-2],
                                                      "batch_size": [32], "hparams": {"units": [16, 32]}}},
               "metric": "val_accuracy"},
    "schedule": {"shards": 2, "iterations": 2},
    "store": {"root": "file:///tmp/mop-store"},
}
PATHS = [
    ("data",), ("search",), ("schedule",), ("store",), ("extra",),
    *[("data", k) for k in ("source", "label", "features", "classes", "validation", "task", "shuffle", "batch_mb",
                            "slice_mb", "storage_options", "conn_id", "unknown")],
    *[("search", k) for k in ("space", "metric", "direction", "adaptive", "fail_fast", "max_configurations", "x")],
    *[("schedule", k) for k in ("shards", "iterations", "epochs_per_hop", "slots_per_shard", "metrics_every", "seed",
                                "x")],
    *[("store", k) for k in ("root", "conn_id", "storage_options", "cache_dir", "retry_seconds", "x")],
    *[("search", "space", k) for k in ("method", "params", "num_samples", "seed", "x")],
    *[("search", "space", "params", k) for k in ("model", "optimizer", "learning_rate", "optimizer_params",
                                                  "batch_size", "epochs_per_hop", "loss", "metrics", "hparams", "x")],
    ("search", "space", "params", "hparams", "units"),
    ("search", "adaptive", "method"), ("search", "adaptive", "R"), ("search", "adaptive", "eta"),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.sampled_from(["grid", "random", "hyperband", "sgd", MODEL, "x*", "val_loss", "mse"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8,
)
mutations = st.lists(st.tuples(st.sampled_from(PATHS), json_values), min_size=1, max_size=3)


def mutate(base: dict, changes) -> dict:
    out = copy.deepcopy(base)
    for path, value in changes:
        node = out
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = value
    return out


def resolve(spec_dict, conf=None):
    """What the DAG file and then the run's first task do with the spec and the trigger conf."""
    spec = MopSpec.from_dict(spec_dict)
    spec.to_dict()
    run = resolve_run(spec, conf, dag_id="d", run_id="r")
    MopSpec.from_dict(run.spec)  # the resolved spec, as later tasks read it back


@settings(max_examples=int(os.environ.get("MOP_HYPOTHESIS_EXAMPLES", 400)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations)
def test_any_spec_either_builds_or_raises_a_spec_error(changes):
    try:
        resolve(mutate(BASE, changes))
    except MopError as exc:
        assert "Fix:" in str(exc)


@settings(max_examples=int(os.environ.get("MOP_HYPOTHESIS_EXAMPLES", 400)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutations.map(lambda changes: mutate({}, changes)), json_values))
def test_any_trigger_conf_either_applies_or_raises_a_spec_error(conf):
    try:
        resolve(BASE, conf)
    except MopError as exc:
        assert "Fix:" in str(exc)
