"""The end of a block of an adaptive search: decide what the next block trains (every configuration
to the next decision point), then go on to it in this run, or start the DAG's run for it, or, when
nothing is left, let this run report.

The decision is :func:`mop_airflow.planning.blocks.decide_next_block`: the block's completions in the
order their hops were saved, the method's jobs for the capacity they freed, and the next block's
offset classes and their lineup, written to the store before the next run exists (a retried task decides
the same: the records it reads do not change).
"""

from __future__ import annotations

from typing import Any

from mop_airflow.records import Continuation, Plan

from mop_airflow.operators.base import MopBaseOperator
from mop_airflow.operators.next_run import start_next_block


class MopDecideOperator(MopBaseOperator):
    """``block``: in a run of several blocks, the block this step ends, counted from the run's first
    (the next block's train tasks read its decision as they start); the ``last`` one starts the DAG's next run unless
    the run holds the ``whole`` search. None: the run holds one block and this step starts the next run."""

    ui_color = "#f6e7c1"

    def __init__(self, *, block: int | None = None, last: bool = False, whole: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.block = block
        self.last = last
        self.whole = whole

    def work(self, context: Any) -> dict[str, Any] | None:
        from mop_airflow.planning.blocks import decide_next_block, decision_or_end  # noqa: PLC0415

        continuing = self.continuation(context)
        here = continuing or Continuation(first_run=context["run_id"], block=0, start=0)
        layout = self.layout(context)
        plan = Plan.read(layout.store, layout.plan_uri)
        if self.block is not None:
            current = decision_or_end(layout, here.block + self.block)
            if current is None or current.finished:  # the search ended in this run: nothing to decide or train
                self.log.info("the search ended before block %d", here.block + self.block + 1)
                return {"next_block": None, "block": here.block + self.block}
            here = Continuation(first_run=here.first_run, block=here.block + self.block, start=current.start)
        decision = decide_next_block(layout, self.run_record(layout), plan, here.block)
        for job in decision.jobs:
            self.log.info("%s %s to rung %d (%d iterations)%s", job["kind"], job["config_id"], job["rung"],
                          job["iterations"], "" if job["kind"] == "start" else
                          f": {job['metric']}, ranked {job['rank']} of {job['of']} at rung {job['rung'] - 1}")
        if decision.finished:
            self.log.info("block %d was the search's last: nothing is left to train, this run reports", here.block + 1)
            return {"next_block": None, "block": here.block}
        nxt = Continuation(first_run=here.first_run, block=here.block + 1, start=decision.start)
        self.log.info("block %d done; block %d trains %d configuration(s) %d hop(s) each, to iteration %s", here.block + 1,
                      nxt.block + 1, len(decision.training), decision.length(plan.shards),
                      f"{(decision.start + decision.length(plan.shards)) / plan.shards:g}")
        if self.block is not None and not self.last:  # the next block is this run's: its train tasks read the decision
            return {"next_block": nxt.block, "block": here.block}
        start_next_block(context, layout, here, nxt,
                         note=f"block {nxt.block + 1} of the search started by run {here.first_run}")
        return None
