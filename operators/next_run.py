"""The end of a block of a search split over several DAG runs: start the DAG's run for the next block.

A plain search longer than one run holds (``schedule.iterations_per_run``) renders the hops of one
block of iterations; this task, after every chain's last hop, triggers the next run of the same
DAG with a conf naming the search's first run and the hop the block starts at
(:mod:`mop_airflow.planning.run_chain`). It first leaves a pointer in the new run's folder and adds the run
to the search's chain record, so the CLI, the results page and a champion find the search from any
of its runs. The run of the last block has nothing to start: its report task then reports.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from mop_airflow.records.layout import RunLayout
from mop_airflow.planning.run_chain import CONF_KEY, next_run_id
from mop_airflow.records import Continuation, RunChain

from mop_airflow.operators.base import MopBaseOperator


class MopNextRunOperator(MopBaseOperator):
    ui_color = "#e3f4e1"

    def __init__(self, *, hops_per_run: int, hops: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hops_per_run = hops_per_run  # global hops one run trains
        self.hops = hops  # the whole search's

    def work(self, context: Any) -> dict[str, Any] | None:
        continuing = self.continuation(context)
        here = continuing or Continuation(first_run=context["run_id"], block=0, start=0)
        blocks = self.hops // self.hops_per_run
        nxt = Continuation(first_run=here.first_run, block=here.block + 1, start=here.start + self.hops_per_run)
        if nxt.start >= self.hops:
            self.log.info("block %d of %d was the search's last: this run reports", here.block + 1, blocks)
            return {"next_run": None, "block": here.block, "blocks": blocks}
        self.log.info("block %d of %d done (hops %d-%d); the next run trains block %d from hop %d", here.block + 1,
                      blocks, here.start, nxt.start - 1, nxt.block + 1, nxt.start)
        start_next_block(context, self.layout(context), here, nxt,
                         note=f"block {nxt.block + 1} of {blocks} of the search started by run {here.first_run}")
        return None


def start_next_block(context: Any, layout: RunLayout, here: Continuation, nxt: Continuation, *, note: str) -> None:
    """Trigger the DAG's run for block ``nxt``: leave the pointer in its folder, add it to the
    search's chain record, then raise Airflow's trigger (the task succeeds once the run exists)."""
    from airflow.sdk.exceptions import DagRunTriggerException  # noqa: PLC0415

    run_id = next_run_id(here.first_run, nxt.block)
    store = layout.store
    nxt.write(store, RunLayout(store, layout.dag_id, run_id).continues_uri)
    chain = RunChain.read(store, layout.chain_uri) if store.exists(layout.chain_uri) else RunChain([here.first_run])
    chain.with_run(context["run_id"]).with_run(run_id).write(store, layout.chain_uri)
    conf = {k: v for k, v in (getattr(context.get("dag_run"), "conf", None) or {}).items() if k != CONF_KEY}
    now = dt.datetime.now(dt.timezone.utc)
    raise DagRunTriggerException(
        trigger_dag_id=context["dag"].dag_id, dag_run_id=run_id, conf={**conf, CONF_KEY: nxt.to_dict()},
        logical_date=now, run_after=now, reset_dag_run=False, skip_when_already_exists=True,
        wait_for_completion=False, allowed_states=["success"], failed_states=["failed"], poke_interval=60,
        deferrable=False, note=note)
