"""The search space, and its expansion into configurations with stable ids.

A configuration holds everything one model needs, as in MADlib's model selection table: the model
builder's import path and hyperparameters, compile parameters (optimizer and its parameters, loss,
metrics) and fit parameters (batch size, passes per hop). It is a plain JSON-able dict so it
travels through XCom and into reports unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from mop_airflow.errors import SpecError, unknown_key
from mop_airflow.search.distributions import Distribution, parse_distribution

OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop", "adagrad", "adadelta", "adamax", "nadam",
              "ftrl", "lion", "lamb", "adafactor")
METHODS = ("grid", "random")
SAMPLERS = ("random", "tpe")
# Optuna's TPESampler's own default: the configurations drawn at random before its model proposes.
STARTUP = 10
_KEYS = ("model", "optimizer", "learning_rate", "optimizer_params", "batch_size", "epochs_per_hop",
         "loss", "metrics", "hparams")
_DEFAULTS: dict[str, Any] = {"optimizer": "adam", "learning_rate": 1e-3, "batch_size": 32,
                             "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]}
SPACE_KEYS = ("method", "params", "num_samples", "seed", "sampler", "startup")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def config_id(index: int, config: Mapping[str, Any]) -> str:
    """Readable and stable: position in the expansion plus a hash of the content."""
    digest = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:6]
    return f"c{index:03d}-{digest}"


@dataclass(frozen=True)
class SearchSpace:
    """``method`` is 'grid' (lists are crossed) or 'random' (``num_samples`` seeded draws).

    ``sampler`` (random search only): 'random' draws every configuration up front; 'tpe' draws the
    first ``startup`` at random and proposes each later one from the results so far
    (:mod:`mop_airflow.search.tpe`), so the search is decided between blocks of hops.

    ``params`` keys: model (required), optimizer, learning_rate, optimizer_params, batch_size,
    epochs_per_hop, loss, metrics, hparams. A list means "one of these"; a dict such as
    ``{"distribution": "log_uniform", "low": 1e-4, "high": 1e-2}`` is a random-search distribution.
    ``hparams`` and ``optimizer_params`` map names to the same kinds of values.
    """

    params: Mapping[str, Any]
    method: str = "grid"
    num_samples: int | None = None
    seed: int = 0
    sampler: str = "random"
    startup: int = STARTUP
    _dims: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpecError("search.space.method", self.method, f"must be one of {list(METHODS)}",
                            "use 'grid' to cross every listed value or 'random' to sample num_samples")
        if not isinstance(self.params, Mapping):
            raise SpecError("search.space.params", self.params, "must be a mapping",
                            "pass e.g. {'model': ['my_models:cnn'], 'learning_rate': [1e-3, 1e-2]}")
        unknown_key("search.space.params", self.params, _KEYS, advice="put model hyperparameters under 'hparams' "
                    "and optimizer arguments under 'optimizer_params'")
        if "model" not in self.params:
            raise SpecError("search.space.params.model", None, "is required",
                            "name the model builder(s) by import path, e.g. 'my_models:cnn'")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise SpecError("search.space.seed", self.seed, "must be an integer >= 0", "use e.g. seed=0")
        if self.method == "random":
            # None: an adaptive search (Hyperband) decides how many configurations to draw.
            if self.num_samples is not None and (isinstance(self.num_samples, bool) or
                                                 not isinstance(self.num_samples, int) or self.num_samples < 1):
                raise SpecError("search.space.num_samples", self.num_samples,
                                "random search needs an integer number of samples >= 1", "set num_samples, e.g. 16")
        elif self.num_samples is not None:
            raise SpecError("search.space.num_samples", self.num_samples, "only applies to random search",
                            "remove num_samples or set method='random'")
        if self.sampler not in SAMPLERS:
            raise SpecError("search.space.sampler", self.sampler, f"must be one of {list(SAMPLERS)}",
                            "use 'random' (every configuration drawn up front) or 'tpe' (proposed from the results so far)")
        if self.sampler == "tpe" and self.method != "random":
            raise SpecError("search.space.sampler", self.sampler, "proposes configurations of a random search only",
                            "set search.space.method='random' with distributions, or leave sampler out for a grid")
        if isinstance(self.startup, bool) or not isinstance(self.startup, int) or self.startup < 1:
            raise SpecError("search.space.startup", self.startup, "must be a whole number >= 1",
                            f"the configurations drawn at random before TPE proposes: {STARTUP} is Optuna's default")
        params = {**_DEFAULTS, **dict(self.params)}
        metrics = params.pop("metrics")
        if isinstance(metrics, str):
            metrics = [metrics]
        if not isinstance(metrics, (list, tuple)) or not all(isinstance(m, str) and m for m in metrics):
            raise SpecError("search.space.params.metrics", metrics, "must be a list of metric names",
                            "use e.g. ['accuracy']")
        dims: dict[str, Any] = {"metrics": list(metrics)}
        for key, value in params.items():
            if key in ("hparams", "optimizer_params"):
                if not isinstance(value, Mapping):
                    raise SpecError(f"search.space.params.{key}", value, "must be a mapping of name to values",
                                    f"use e.g. {{'{key}': {{'units': [64, 128]}}}}")
                for name, sub in value.items():
                    dims[f"{key}.{name}"] = self._dimension(f"search.space.params.{key}.{name}", sub)
            else:
                dims[key] = self._dimension(f"search.space.params.{key}", value)
        self._check_values(dims)
        object.__setattr__(self, "_dims", dims)

    def _dimension(self, name: str, value: Any) -> list[Any] | Distribution:
        if isinstance(value, Mapping):
            if self.method == "grid":
                raise SpecError(name, dict(value), "a distribution cannot be crossed in a grid search",
                                "list the values to try, or use method='random'")
            return parse_distribution(name, value)
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if not values:
            raise SpecError(name, value, "must list at least one value", "give one or more values to try")
        return values

    @staticmethod
    def _check_values(dims: Mapping[str, Any]) -> None:
        def each(key: str) -> list[Any]:
            dim = dims.get(key)
            return dim if isinstance(dim, list) else list(getattr(dim, "choices", None) or [])

        for path in each("model"):
            if not isinstance(path, str) or not _IMPORT_PATH.match(path):
                raise SpecError("search.space.params.model", path, "must be an import path 'module:function'",
                                "name a function build(hparams) -> keras.Model, e.g. 'my_models:cnn'")
        for name in each("optimizer"):
            if not isinstance(name, str) or name.lower() not in OPTIMIZERS:
                raise SpecError("search.space.params.optimizer", name, f"is not a known optimizer {list(OPTIMIZERS)}",
                                "use one of the listed Keras optimizer names")
        for key, rule in (("learning_rate", "must be a number > 0"), ("batch_size", "must be an integer >= 1"),
                          ("epochs_per_hop", "must be an integer >= 1")):
            for value in each(key):
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
                if key != "learning_rate":
                    ok = ok and isinstance(value, int) and value >= 1
                if not ok:
                    raise SpecError(f"search.space.params.{key}", value, rule, f"fix the value of {key}")

    def builders(self) -> list[str]:
        """Every model builder import path the space can name (listed, or a choice distribution's)."""
        dim = self._dims["model"]
        return sorted(set(dim if isinstance(dim, list) else list(getattr(dim, "choices", None) or [])))

    def metric_names(self) -> list[str]:
        return list(self._dims["metrics"])

    def choices(self, name: str) -> list[Any]:
        """The listed values of dimension ``name`` ([] for a distribution or a missing dimension)."""
        values = self._dims.get(name)
        return list(values) if isinstance(values, list) else []

    def dimensions(self) -> dict[str, Any]:
        """Every searched field (``learning_rate``, ``hparams.units``...): its list or distribution."""
        return {k: v for k, v in self._dims.items() if k != "metrics"}

    def assemble(self, combo: Mapping[str, Any], default_epochs_per_hop: int = 1) -> dict[str, Any]:
        """The configuration (without its id) of one value per field of :meth:`dimensions`."""
        return _assemble(combo, self._dims["metrics"], default_epochs_per_hop)

    def to_dict(self) -> dict[str, Any]:
        out = {"method": self.method, "params": json.loads(json.dumps(dict(self.params))),
               "num_samples": self.num_samples, "seed": self.seed}
        return {**out, "sampler": self.sampler, "startup": self.startup} if self.sampler != "random" else out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SearchSpace":
        if not isinstance(data, Mapping) or "params" not in data:
            raise SpecError("search.space", data, "must be a mapping with 'params' (and optionally 'method')",
                            "pass {'method': 'grid', 'params': {'model': [...], ...}}")
        unknown_key("search.space", data, SPACE_KEYS)
        return cls(**{k: data[k] for k in SPACE_KEYS if k in data})

    def size(self, count: int | None = None) -> int:
        """How many configurations :meth:`expand` makes, without making them."""
        if self.method == "random":
            return int(count or self.num_samples or 0)
        return math.prod(len(dim) for key, dim in self._dims.items() if key != "metrics")

    def expand(self, default_epochs_per_hop: int = 1, *, count: int | None = None) -> list[dict[str, Any]]:
        """Every configuration of the space, in a deterministic order, each with its ``config_id``.

        ``count`` overrides ``num_samples`` of a random search (an adaptive plan decides it).
        """
        keys = sorted(k for k in self._dims if k != "metrics")
        if self.method == "grid":
            combos = [dict(zip(keys, values)) for values in itertools.product(*(self._dims[k] for k in keys))]
        else:
            samples = count or self.num_samples
            if not samples:
                raise SpecError("search.space.num_samples", self.num_samples,
                                "random search needs an integer number of samples >= 1", "set num_samples, e.g. 16")
            streams = {k: _stream(self.seed, k) for k in keys}
            combos = [{k: _draw(self._dims[k], streams[k]) for k in keys} for _ in range(samples)]
        configs = []
        for index, combo in enumerate(combos):
            config = _assemble(combo, self._dims["metrics"], default_epochs_per_hop)
            configs.append({"config_id": config_id(index, config), **config})
        return configs


def config_field(config: Mapping[str, Any], key: str) -> Any:
    """A configuration's value of search field ``key`` (``learning_rate``, ``batch_size``,
    ``hparams.units``...): the learning rate lives in its ``optimizer_params``."""
    if key == "learning_rate":
        return config["optimizer_params"]["learning_rate"]
    head, _, tail = key.partition(".")
    return config[head][tail] if tail else config[head]


def _stream(seed: int, name: str) -> Any:
    import random

    # One stream per hyperparameter: two with the same range never get the same draws.
    return random.Random(f"mop:{seed}:{name}")


def _draw(dim: Any, rng: Any) -> Any:
    if isinstance(dim, list):
        return dim[rng.randrange(len(dim))]
    return dim.sample(rng)


def _assemble(combo: Mapping[str, Any], metrics: list[str], default_epochs: int) -> dict[str, Any]:
    hparams = {k.split(".", 1)[1]: v for k, v in combo.items() if k.startswith("hparams.")}
    opt_params = {k.split(".", 1)[1]: v for k, v in combo.items() if k.startswith("optimizer_params.")}
    opt_params["learning_rate"] = float(combo["learning_rate"])
    return {
        "model": combo["model"],
        "hparams": hparams,
        "optimizer": str(combo["optimizer"]).lower(),
        "optimizer_params": dict(sorted(opt_params.items())),
        "loss": combo["loss"],
        "metrics": list(metrics),
        "batch_size": int(combo["batch_size"]),
        "epochs_per_hop": int(combo.get("epochs_per_hop") or default_epochs),
    }
