"""Sampling distributions for random search: pure, seeded through the ``random.Random`` passed in.

Written as ``{"distribution": NAME, ...}`` in a search space:

- ``uniform`` (low, high) and ``log_uniform`` (low, high > 0): a float in [low, high].
- ``int_uniform`` (low, high whole numbers): an int in [low, high], both included.
- ``quantized_uniform`` (low, high, q > 0): ``round(uniform(low, high) / q) * q``, clipped into
  [low, high] onto the nearest multiple of q inside it, so every value is a multiple of q.
  An int when low, high and q are all ints (e.g. batch sizes 16..256 by 16).
- ``quantized_log_uniform`` (low > 0, high, q > 0): the same with a log-uniform draw
  (``round(exp(uniform(log low, log high)) / q) * q``, as hyperopt's ``qloguniform``).
- ``log_near_one`` (0 <= low < high < 1): Apache MADlib's sampler for values close to 1 such as
  momentum or Adam's beta_2: ``1 - 10**u`` with ``u`` uniform in
  [log10(1 - high), log10(1 - low)] (``generate_model_configs``, ``sample_val``), so 0.9, 0.99
  and 0.999 are equally likely orders of magnitude.
- ``choice`` (values).

Each draw takes one number from the stream it is given; the search space gives each
hyperparameter its own stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Mapping, Sequence

from mop_airflow.errors import SpecError, unknown_key

_NAMES = ("uniform", "log_uniform", "int_uniform", "quantized_uniform", "quantized_log_uniform", "log_near_one",
          "choice")
_QUANTIZED = ("quantized_uniform", "quantized_log_uniform")
# What each distribution takes besides its name: any other key is a typo, refused rather than ignored.
_OPTIONS = {name: ("low", "high") for name in _NAMES}
_OPTIONS.update({"choice": ("values",), **{name: ("low", "high", "q") for name in _QUANTIZED}})


@dataclass(frozen=True)
class Distribution:
    name: str
    low: float | None = None
    high: float | None = None
    choices: Sequence[Any] | None = None
    q: float | None = None
    integer: bool = False  # quantized with int low, high and q: values are ints

    def sample(self, rng: Any) -> Any:
        if self.name == "choice":
            return self.choices[rng.randrange(len(self.choices))]  # type: ignore[index]
        if self.name == "uniform":
            return rng.uniform(self.low, self.high)
        if self.name == "log_uniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))  # type: ignore[arg-type]
        if self.name == "int_uniform":
            return rng.randint(int(self.low), int(self.high))  # type: ignore[arg-type]
        if self.name == "quantized_uniform":
            return self._on_grid(rng.uniform(self.low, self.high))
        if self.name == "quantized_log_uniform":
            log_low, log_high = math.log(self.low), math.log(self.high)  # type: ignore[arg-type]
            return self._on_grid(math.exp(rng.uniform(log_low, log_high)))
        if self.name == "log_near_one":
            u = rng.uniform(math.log10(1.0 - self.high), math.log10(1.0 - self.low))  # type: ignore[operator]
            return 1.0 - 10.0 ** u
        raise AssertionError(self.name)  # parse_distribution admits no other name

    def _on_grid(self, value: float) -> int | float:
        first, last = _grid(self.low, self.high, self.q)  # type: ignore[arg-type]
        k = min(max(round(value / self.q), first), last)  # type: ignore[operator]
        if self.integer:
            return k * int(self.q)  # type: ignore[arg-type]
        return float(k * _decimal(self.q))  # type: ignore[arg-type]  # 3 * 0.1 -> 0.3, not 0.30000000000000004


def _decimal(x: float) -> Decimal:
    return Decimal(repr(float(x)))


def _grid(low: float, high: float, q: float) -> tuple[int, int]:
    """The first and last multiple of q (as k in k*q) inside [low, high], exact for decimal input."""
    step = _decimal(q)
    return math.ceil(_decimal(low) / step), math.floor(_decimal(high) / step)


def _number(field_name: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"{field_name}.{key}", value, "must be a finite number", f"give {key} as a number")


def parse_distribution(field_name: str, spec: Mapping[str, Any]) -> Distribution:
    """Validate ``spec`` and return a :class:`Distribution`; errors name the field and the rule."""
    name = spec.get("distribution")
    if name not in _NAMES:
        raise SpecError(f"{field_name}.distribution", name, f"must be one of {list(_NAMES)}",
                        "e.g. {'distribution': 'log_uniform', 'low': 1e-4, 'high': 1e-2}")
    if "q" in spec and name not in _QUANTIZED:  # before the unknown-key check: this one has a better fix
        raise SpecError(f"{field_name}.q", spec["q"], f"only applies to {list(_QUANTIZED)}",
                        f"remove q, or use 'quantized_{'log_uniform' if name == 'log_uniform' else 'uniform'}'")
    unknown_key(field_name, spec, ("distribution", *_OPTIONS[name]), what=f"an option of {name}")
    if name == "choice":
        values = spec.get("values")
        if not isinstance(values, (list, tuple)) or not values:
            raise SpecError(f"{field_name}.values", values, "a choice needs a non-empty list of values",
                            "e.g. {'distribution': 'choice', 'values': [32, 64]}")
        return Distribution("choice", choices=list(values))
    low, high = spec.get("low"), spec.get("high")
    _number(field_name, "low", low)
    _number(field_name, "high", high)
    if low >= high:  # type: ignore[operator]
        raise SpecError(f"{field_name}.low", low, f"must be below high={high}", "swap or widen the range")
    if name in ("log_uniform", "quantized_log_uniform") and low <= 0:  # type: ignore[operator]
        raise SpecError(f"{field_name}.low", low, "a log range needs low > 0",
                        "use a positive lower bound such as 1e-5, or a 'uniform' distribution")
    if name == "int_uniform" and (int(low) != low or int(high) != high):  # type: ignore[arg-type]
        raise SpecError(f"{field_name}.low", (low, high), "int_uniform bounds must be whole numbers",
                        "use integer low and high")
    if name == "log_near_one":
        if low < 0:  # type: ignore[operator]
            raise SpecError(f"{field_name}.low", low, "log_near_one needs 0 <= low < high < 1",
                            "use e.g. low=0.9, high=0.999 for a momentum")
        if high >= 1:  # type: ignore[operator]
            raise SpecError(f"{field_name}.high", high, "log_near_one needs high < 1 (it samples 1 - 10**u)",
                            "use e.g. high=0.999; for values at or above 1 use 'uniform' or 'log_uniform'")
    if name in _QUANTIZED:
        return _quantized(field_name, name, low, high, spec.get("q"))  # type: ignore[arg-type]
    return Distribution(name, low=float(low), high=float(high))  # type: ignore[arg-type]


def _quantized(field_name: str, name: str, low: float, high: float, q: Any) -> Distribution:
    if q is None:
        raise SpecError(f"{field_name}.q", q, f"{name} needs a step q", "e.g. q=16 for batch sizes, q=0.05 for dropout")
    _number(field_name, "q", q)
    if q <= 0:
        raise SpecError(f"{field_name}.q", q, "must be > 0", "use the step between neighbouring values, e.g. 0.05")
    first, last = _grid(low, high, q)
    if first >= last:
        raise SpecError(f"{field_name}.q", q, f"leaves fewer than two multiples of q in [low={low}, high={high}]",
                        "use a smaller q or a wider range")
    integer = all(isinstance(v, int) for v in (low, high, q))
    return Distribution(name, low=float(low), high=float(high), q=float(q), integer=integer)
