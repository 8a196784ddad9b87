"""One hop (sub-epoch) of one configuration on one shard: the MOP training operator.

Each configuration's hops are a chain of mapped task instances in its offset class's task group:
a hop waits only for the same configuration's previous hop and a slot of its shard's pool. The
work is :func:`mop_airflow.training.model_hop.run_hop`; this operator maps Airflow's context onto
it and its outcome onto task states.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from mop_airflow.errors import StoreError
from mop_airflow.store import transient
from mop_airflow.records import Assignment, Manifest

from mop_airflow.operators.base import MopBaseOperator


# Failures of the infrastructure, not of the configuration: they fail the task, which retries.
RETRIED = (StoreError, AirflowException)


class MopTrainHopOperator(MopBaseOperator):
    template_fields = ("assignment",)
    ui_color = "#fbe3e0"

    def __init__(self, *, assignment: Mapping[str, Any], t: int, shard: int, rung_end: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.assignment = assignment
        self.t = t
        self.shard = shard
        self.rung_end = rung_end  # an adaptive rung ends here: always evaluate, promotion needs the metric

    def work(self, context: Any) -> dict[str, Any]:
        from mop_airflow.training.model_hop import Where, record_failure, run_hop  # noqa: PLC0415

        layout = self.layout(context)
        run = self.run_record(layout)
        assignment = Assignment.from_dict(self.assignment)
        ti = context["ti"]
        where = Where(task_id=self.task_id, host=getattr(ti, "hostname", None), queue=self.queue, pool=self.pool,
                      map_index=getattr(ti, "map_index", -1), try_number=getattr(ti, "try_number", 1),
                      started_at=ti.start_date.timestamp() if getattr(ti, "start_date", None) else None)
        try:
            record, out = run_hop(layout, run, Manifest.read(layout.store, layout.manifest_pointer_uri), assignment,
                                  t=self.t, shard=self.shard, rung_end=self.rung_end,
                                  cache_dir=self.store_spec(context).local_cache, where=where)
        except RETRIED:
            raise  # the store or Airflow itself, not the configuration: worth a retry
        except Exception as exc:
            if run.fail_fast or transient(exc):
                raise
            # The configuration failed (its builder raised, its loss diverged, it ran out of memory):
            # record why, and skip the rest of its own chain; the other configurations go on.
            failure = record_failure(layout, assignment, t=self.t, shard=self.shard, shards=run.schedule.shards,
                                     error=exc, where=where)
            self.log.exception("%s %s at hop %d; its remaining hops are skipped", assignment.config_id,
                               failure.status, self.t)
            raise AirflowSkipException(f"{assignment.config_id} {failure.status}: {exc}") from exc
        self.log.info("%s hop t=%d (iteration %d, hop %d) on shard %d: loss %.4f%s; %.2fs training of %.2fs",
                      record.config_id, record.t, record.iteration, record.hop, record.shard,
                      record.train_metrics["loss"], f", val {record.val_metrics}" if record.val_metrics else "",
                      record.train_metrics["train_seconds"], record.saved_at - record.started_at)
        return out.to_dict()
