"""A block's hops on one shard slot, in one task: the MOP training operator.

A block (a plain search's run, or the hops to the next decision of an adaptive search) renders one
such task per shard slot, on the shard's pool and queue. Each reads what the block trains from the
store as it starts (the plan's offset classes, or the block's decision, with every configuration's
starting point: :mod:`mop_airflow.planning.resume`), then trains, in one process that stays warm,
every hop the block puts on its shard slot (:func:`mop_airflow.slots.driver.run_slot`).
This operator maps Airflow's context onto it and its outcome onto task states.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from mop_airflow.errors import fails_for_good
from mop_airflow.planning.schedule import DEFAULT_PRIORITY
from mop_airflow.records import Manifest, Plan
from mop_airflow.records.layout import block_name
from mop_airflow.store import fails_the_try

from mop_airflow.operators.base import MopBaseOperator


YIELD_DELAY = 10.0  # a slot that gave its pool slot back is tried again 10-20 s later


class MopTrainShardOperator(MopBaseOperator):
    ui_color = "#fbe3e0"

    def __init__(self, *, shard: int, slot: int, end: int, shards: int, slots: int = 1, rung_end: bool = False,
                 relative: bool = False, block: int | None = None, asha: bool = False,
                 priority: str = DEFAULT_PRIORITY, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard = shard
        self.slot = slot
        self.end = end  # the block's hops: a plain search's run (an adaptive block's decision says its own)
        self.shards = shards
        self.slots = slots
        self.rung_end = rung_end  # the block ends a rung: its last hop always evaluates
        # a block of a search decided between blocks: each configuration trains its own next hops
        self.relative = relative
        self.block = block  # which block of the run (an adaptive search's): its decision says how far it trains
        self.asha = asha  # ASHA decided inside the slots: the block's hops come as the slots decide them
        self.priority = priority
        # a slot that dies with its worker ends its block's never-started tasks through this callback, which
        # runs after the user's own (default_args) and never replaces them
        theirs = self.on_failure_callback
        self.on_failure_callback = [*(theirs if isinstance(theirs, list) else [theirs] if theirs else []),
                                    end_block_after_final_failure]

    def on_kill(self) -> None:
        """Airflow stopping the task gracefully (SIGTERM): end after the hop in progress and its commits."""
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    def work(self, context: Any) -> dict[str, Any]:
        from mop_airflow.operators.preflight import running_in_dag_test  # noqa: PLC0415
        from mop_airflow.planning.placement import block_hops, slot_rules  # noqa: PLC0415

        layout = self.layout(context)
        if self.asha:  # the one block of an ASHA search: its hops come as the slots decide them
            alone = running_in_dag_test()
            return self._train(context, layout, [], [], alone)
        continuing = self.continuation(context)
        # a continuing run renders the same tasks for a later block: its hops are the search's start + t
        shift = 0 if self.relative or continuing is None else continuing.start
        end, ends = self.end, None
        if self.block is not None:  # every configuration trains to the next decision point, as its decision says
            from mop_airflow.planning.blocks import decision_or_end  # noqa: PLC0415
            from mop_airflow.planning.resume import decision_classes  # noqa: PLC0415

            decision = decision_or_end(layout, (continuing.block if continuing else 0) + self.block)
            if decision is None or decision.finished:
                raise AirflowSkipException("the search ended before this block: nothing is left to train")
            end = decision.length(self.shards)
            ends = set(decision.ends) if decision.hops else None  # one-iteration blocks of older decisions: every one
            classes = decision_classes(layout, decision)
        else:  # a plain search: the plan's classes, from where the block starts
            from mop_airflow.planning.resume import plain_classes  # noqa: PLC0415

            classes = plain_classes(layout, Plan.read(layout.store, layout.plan_uri), shift, self._stopped)
        # a model key's configurations on one slot (its compiled model serves them all), and a group that
        # may train fused whole on one
        hops = block_hops(classes, shards=self.shards, slots=self.slots, start=0, end=end,
                          relative=self.relative, rung_end=self.rung_end, priority=self.priority,
                          shift=shift, ends=ends, **slot_rules(self.run_record(layout)))
        alone = running_in_dag_test()  # tasks run one at a time: this one trains the whole block
        mine = hops if alone else [h for h in hops if (h.shard, h.slot) == (self.shard, self.slot)]
        if not mine:
            raise AirflowSkipException(f"the block has no hop on shard {self.shard} slot {self.slot}")
        return self._train(context, layout, hops, mine, alone)

    def _end_never_started(self, context: Any, absent: Sequence[tuple[int, int]], finished: bool = False) -> None:
        """Fail the train tasks of the slots this one waited for that never started: their tasks wait in
        Airflow for a worker or a pool slot, and nothing else would end them (the run stayed running for
        ever). This try failed for good, so the block cannot succeed."""
        from mop_airflow.hooks.pools import fail_tasks_never_started  # noqa: PLC0415

        ids, where = _block_tasks(self, absent)
        note = (f"never started while {self.task_id} waited for its hops: no worker serves its queue, or its pool has "
                f"no free slot ({where}); failed by {self.task_id} so the run ends. Fix the worker or the pool, then "
                "clear the failed train tasks of this run")
        if finished:  # the block is over without them: nothing of theirs is missing, the run need not fail
            note = (f"never started ({where}: no worker serves its queue, or its pool had no free slot), and its "
                    f"block finished without it (nothing of its was needed: the search finished, or every hop it "
                    f"had was of a configuration that failed): marked a success by {self.task_id} so the run ends")
        dag_id = getattr(context.get("dag"), "dag_id", None) or context["ti"].dag_id
        try:
            failed = fail_tasks_never_started(dag_id, context["run_id"], ids, note,
                                              state="success" if finished else "failed")
        except Exception as exc:  # noqa: BLE001 - this task's own failure is the one to report
            self.log.error("could not fail %s, which never started (%s): mark it failed by hand, or the run waits "
                           "for it for ever", ", ".join(ids), exc)
            return
        if failed:
            self.log.error("%s never started (%s): %s now, so the run ends", ", ".join(failed), where,
                           "marked a success" if finished else "failed")

    def _stopped(self, config_id: str, hop: int) -> None:
        self.log.info("%s did not finish hop %d (it failed earlier): it trains no further", config_id, hop)

    def _train(self, context: Any, layout: Any, hops: Sequence[Any], mine: Sequence[Any], alone: bool) -> dict:
        # This slot's GPU, before the backend starts its devices in this task process (a CPU worker,
        # without MOP_GPUS or CUDA_VISIBLE_DEVICES, is left exactly as it is).
        from mop_airflow.training.devices import place_this_process  # noqa: PLC0415
        from mop_airflow.training.model_hop import Where  # noqa: PLC0415
        from mop_airflow.errors import BlockIncompleteError  # noqa: PLC0415
        from mop_airflow.slots.driver import SlotYielded, run_slot  # noqa: PLC0415
        from mop_airflow.slots.watchdog import stall_seconds  # noqa: PLC0415

        placement = place_this_process()
        if placement is not None and placement.gpu is not None:
            self.log.info("shard slot %d on GPU %s (%d slot(s) share it%s)", placement.slot, placement.gpu,
                          placement.slots_sharing, ", memory grows on demand" if placement.memory_growth else "")
        run = self.run_record(layout)
        ti = context["ti"]
        try_number, max_tries = getattr(ti, "try_number", 1), getattr(ti, "max_tries", 0)
        where = Where(task_id=self.task_id, host=getattr(ti, "hostname", None), queue=self.queue, pool=self.pool,
                      map_index=getattr(ti, "map_index", -1), try_number=try_number)
        self.log.info("%s %d hop(s) of %d configuration(s) on shard %d slot %d",
                      "training every shard's" if alone else "training", len(mine), len({h.config_id for h in mine}),
                      self.shard, self.slot)

        def committed(record: Any) -> None:
            self.log.info("%s hop t=%d (iteration %d, hop %d) on shard %d: loss %.4f%s; %.2f s training, %.2f s in all, "
                          "model %s", record.config_id, record.t, record.iteration, record.hop, record.shard,
                          record.train_metrics["loss"], f", {record.val_metrics}" if record.val_metrics else "",
                          record.timings["train"], (record.saved_at or 0) - (record.started_at or 0),
                          "reused" if record.model_reused else "built")

        more = None
        if self.asha:
            from mop_airflow.slots.asha_source import AshaSource  # noqa: PLC0415

            more = AshaSource(layout, run, shard=self.shard, slot=self.slot, shards=self.shards, slots=self.slots,
                              alone=alone)
        self._stop = threading.Event()
        try:
            result = run_slot(
                layout, run, Manifest.read(layout.store, layout.manifest_pointer_uri), hops,
                mine=mine if alone else None, block=block_name(context["run_id"], self.task_id.rpartition(".")[0]), shard=self.shard, slot=self.slot,
                cache_dir=self.store_spec(context).local_cache, where=where, on_hop=committed,
                # the store or Airflow itself, search.fail_fast, or a worker going away: the task fails and retries
                fatal=lambda exc: fails_the_try(exc, fail_fast=run.fail_fast, also=(AirflowException,)),
                # no retry follows: the slots that wait for this one's hops stop waiting
                final=lambda exc: fails_for_good(exc, last_try=try_number > max_tries, fail_fast=run.fail_fast),
                stop=self._stop, stall_seconds=None if alone else stall_seconds(), more=more,
                last_try=try_number > max_tries, tries_left=max(1, max_tries - try_number + 2))
        except BlockIncompleteError as exc:
            if getattr(exc, "absent", None) and fails_for_good(exc, last_try=try_number > max_tries,
                                                               fail_fast=run.fail_fast):
                self._end_never_started(context, exc.absent)  # this try's failure is final: theirs too
            if not _may_come(exc) or run.fail_fast:
                raise
            # the slots it waited for are late or hung, not gone: a retry waits again (a TrainingError would not be)
            raise AirflowException(str(exc)) from exc
        except SlotYielded as exc:
            # another block may hold the shard pools this block needs first: free this one's slot
            # for a while (a reschedule takes no try), at a random moment so two blocks do not meet again
            import datetime as dt  # noqa: PLC0415
            import random  # noqa: PLC0415

            from airflow.sdk.exceptions import AirflowRescheduleException  # noqa: PLC0415

            later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=YIELD_DELAY * (1 + random.random()))
            self.log.info("%s; rescheduled for %s", exc, later.isoformat(timespec="seconds"))
            raise AirflowRescheduleException(later) from exc
        except Exception as exc:  # fatal to the try; on a try that ends for good, run_slot ended its block's
            if getattr(exc, "absent", None):  # slots not started: their tasks are ended too
                self._end_never_started(context, exc.absent)
            raise
        if result.absent:
            self._end_never_started(context, result.absent, finished=True)
        self.log.info("shard %d slot %d: %d hop(s) trained, %d already committed, %d configuration(s) failed here, "
                      "%d hop(s) dropped after a failure elsewhere; %.1f s waiting for hops of other slots",
                      self.shard, self.slot, len(result.trained), len(result.committed), len(result.failed),
                      len(result.dropped), result.waited)
        return {"trained": len(result.trained), "committed": len(result.committed),
                "failed": sorted(r.config_id for r in result.failed), "dropped": len(result.dropped)}


def _block_tasks(task: MopTrainShardOperator, slots: Sequence[tuple[int, int]]) -> tuple[list[str], str]:
    """The ids of the train tasks of ``task``'s block on these (shard, slot)s, and their queues and pools in words."""
    from mop_airflow.planning.task_plan import shard_pool, train_task_id  # noqa: PLC0415

    group = task.task_id.rpartition(".")[0]
    ids = [train_task_id(f"{group}." if group else "", s, k, task.slots) for s, k in slots]
    return ids, ", ".join(f"queue and pool {shard_pool(s)}" for s in sorted({s for s, _ in slots}))


def _may_come(exc: BaseException) -> bool:
    """A block left incomplete only by slots that may still come (late or hung, not ended for good)."""
    return bool(getattr(exc, "retryable", False))


def end_block_after_final_failure(context: Any) -> None:
    """A train task's ``on_failure_callback`` (its failure for good): fail its block's train tasks that never
    started, unless a slot of the block lives on to end them.

    A slot that fails for good in its own process ends them itself (:meth:`MopTrainShardOperator.
    _end_never_started`). A slot that dies with its worker (a lost host, its Celery worker or its
    supervisor killed) never gets to: Airflow fails it when its heartbeat stops, then runs this callback in
    the dag-processor, and without it the run waited for ever for a task no worker or pool slot would start
    (issue 70's known gap). Airflow runs no callback for a task process killed while its supervisor lives
    (apache/airflow#60858): that case stays open, and the docs say so."""
    from mop_airflow.hooks.pools import fail_waiting_unless_one_lives  # noqa: PLC0415

    task, ti = context["task"], context["ti"]
    others, where = _block_tasks(task, [(s, k) for s in range(task.shards) for k in range(task.slots)
                                        if (s, k) != (task.shard, task.slot)])
    note = (f"never started (no worker serves its queue, or its pool has no free slot: {where}) while "
            f"{task.task_id} failed for good and no other slot of the block was left to wait for it; failed "
            "so the run ends. Fix the worker or the pool, then clear the failed train tasks of this run")
    run_id = context.get("run_id") or ti.run_id
    try:
        failed = fail_waiting_unless_one_lives(ti.dag_id, run_id, others, note)
    except Exception as exc:  # noqa: BLE001 - a callback's failure must not hide the task's
        task.log.error("could not end the train tasks of %s's block that never started (%s): mark them failed by "
                       "hand, or the run waits for them", task.task_id, exc)
        return
    if failed:
        task.log.error("%s never started: failed now, as %s failed for good and no slot was left to wait for "
                       "them, so the run ends", ", ".join(failed), task.task_id)
