"""The step between two rungs of a bracket: promote the best, prune the rest.

The decision is :func:`mop_airflow.planning.rungs.decide_rung` (ranked on the validation metric at the end
of the rung, direction-aware, ties by configuration id). The next rung's ``deal_<o>`` tasks read
it; when nothing is promoted their lists are empty and the next rung's hops are skipped.
"""

from __future__ import annotations

from typing import Any

from mop_airflow.records import Plan

from mop_airflow.operators.base import MopBaseOperator


class MopPromoteOperator(MopBaseOperator):
    ui_color = "#f6e7c1"

    def __init__(self, *, bracket: int, rung: int, start: int, end: int, keep: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bracket = bracket
        self.rung = rung
        self.start = start
        self.end = end
        self.keep = keep

    def work(self, context: Any) -> dict[str, Any]:
        from mop_airflow.planning.rungs import decide_rung  # noqa: PLC0415

        layout = self.layout(context)
        decision = decide_rung(layout, self.run_record(layout), Plan.read(layout.store, layout.plan_uri),
                               bracket=self.bracket, rung=self.rung, start=self.start, end=self.end, keep=self.keep)
        for entry in decision.pruned:
            self.log.info("pruned %s at bracket %d rung %d (%s=%s): %s", entry["config_id"], self.bracket, self.rung,
                          decision.metric, entry.get("metric"), entry["reason"])
        self.log.info("promoted to rung %d: %s", self.rung + 1, ", ".join(decision.promoted) or "(none)")
        return {"promoted": decision.promoted, "pruned": [e["config_id"] for e in decision.pruned]}
