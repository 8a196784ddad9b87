"""What every adaptive search method reads and answers, in the same words.

Each method answers one question, as Optuna's pruners and samplers do: given the records so far
(which configurations completed which rung, with which metric, in which order, and which were
promoted or started) and the capacity that is free, what trains next? The answer is a list of
:class:`Job`: a configuration and how far it trains. Pure: no Airflow, no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Completion:
    """A configuration finished rung ``rung`` with ``metric`` (None when it has none) and ``status``
    ("ok", "failed", "diverged"); ``error`` says why a failed one failed."""

    config_id: str
    rung: int
    metric: float | None
    status: str = "ok"
    error: str | None = None
    bracket: int | None = None

    def result(self) -> dict[str, Any]:
        out = {"config_id": self.config_id, "metric": self.metric, "status": self.status}
        return {**out, "error": self.error} if self.error else out


@dataclass(frozen=True)
class Job:
    """Train ``config_id`` to the end of rung ``rung``, ``iterations`` iterations in all: a new
    configuration (``kind="start"``, rung 0) or a promoted one resuming from its checkpoint
    (``kind="promote"``, with the ``metric`` it was promoted on and its place among the rung's
    completions). ``bracket``: Hyperband's bracket (None for one rung ladder, as in ASHA)."""

    config_id: str
    rung: int
    kind: str
    iterations: int
    bracket: int | None = None
    metric: float | None = None
    rank: int | None = None
    of: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"config_id": self.config_id, "rung": self.rung, "kind": self.kind, "iterations": self.iterations,
                "bracket": self.bracket, "metric": self.metric, "rank": self.rank, "of": self.of}
