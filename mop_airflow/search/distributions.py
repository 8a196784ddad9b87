"""Sampling distributions for random search: pure, seeded through the ``random.Random`` passed in.

Written as ``{"distribution": NAME, ...}`` in a search space:
``uniform`` (low, high), ``log_uniform`` (low, high > 0), ``int_uniform`` (low, high inclusive),
``choice`` (values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from mop_airflow.errors import SpecError


@dataclass(frozen=True)
class Distribution:
    name: str
    low: float | None = None
    high: float | None = None
    choices: Sequence[Any] | None = None

    def sample(self, rng: Any) -> Any:
        if self.name == "choice":
            return self.choices[rng.randrange(len(self.choices))]  # type: ignore[index]
        if self.name == "uniform":
            return rng.uniform(self.low, self.high)
        if self.name == "log_uniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))  # type: ignore[arg-type]
        if self.name == "int_uniform":
            return rng.randint(int(self.low), int(self.high))  # type: ignore[arg-type]
        raise AssertionError(self.name)  # parse_distribution admits no other name


_NAMES = ("uniform", "log_uniform", "int_uniform", "choice")


def parse_distribution(field_name: str, spec: Mapping[str, Any]) -> Distribution:
    """Validate ``spec`` and return a :class:`Distribution`; errors name the field and the rule."""
    name = spec.get("distribution")
    if name not in _NAMES:
        raise SpecError(f"{field_name}.distribution", name, f"must be one of {list(_NAMES)}",
                        "e.g. {'distribution': 'log_uniform', 'low': 1e-4, 'high': 1e-2}")
    if name == "choice":
        values = spec.get("values")
        if not isinstance(values, (list, tuple)) or not values:
            raise SpecError(f"{field_name}.values", values, "a choice needs a non-empty list of values",
                            "e.g. {'distribution': 'choice', 'values': [32, 64]}")
        return Distribution("choice", choices=list(values))
    low, high = spec.get("low"), spec.get("high")
    for bound, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SpecError(f"{field_name}.{bound}", value, "must be a finite number",
                            f"give {bound} as a number")
    if low >= high:  # type: ignore[operator]
        raise SpecError(f"{field_name}.low", low, f"must be below high={high}", "swap or widen the range")
    if name == "log_uniform" and low <= 0:  # type: ignore[operator]
        raise SpecError(f"{field_name}.low", low, "a log range needs low > 0",
                        "use a positive lower bound such as 1e-5, or a 'uniform' distribution")
    if name == "int_uniform" and (int(low) != low or int(high) != high):  # type: ignore[arg-type]
        raise SpecError(f"{field_name}.low", (low, high), "int_uniform bounds must be whole numbers",
                        "use integer low and high")
    return Distribution(name, low=float(low), high=float(high))  # type: ignore[arg-type]
