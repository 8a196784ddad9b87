"""One hop of a bundle: each of its configurations trains in turn on the shard, in one process.

Runs and is tested without Airflow; the hop operator maps Airflow's context onto it. Every
configuration keeps what it had as a task of its own: its checkpoint, hop record, metrics and
outcome. A configuration that fails (its builder raised, its loss diverged, it ran out of memory)
is recorded and leaves the bundle; the others go on in the same task. A retried bundle hop skips
the configurations whose hop is already committed (its record and checkpoint are in the store), so
a task killed half-way trains only the rest, with the same results.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from mop_airflow.errors import StoreError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import Assignment, BundleAssignment, HopRecord, Manifest, RunRecord
from mop_airflow.training.model_hop import Where, record_failure, run_hop
from mop_airflow.training.session import TaskSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BundleHop:
    """What a bundle's hop did: per configuration its record (trained now or committed by an earlier
    try), the bundle for its next hop, and which configurations failed here."""

    records: list[HopRecord]
    skipped: list[str]   # committed by an earlier try of this task: not trained again
    failed: list[HopRecord]
    out: BundleAssignment


def committed(layout: RunLayout, assignment: Assignment, t: int) -> HopRecord | None:
    """The configuration's hop ``t`` as an earlier try left it: its record, when that hop started from the
    state ``assignment`` names and its checkpoint is there too (or when it records a failure)."""
    try:
        record = HopRecord.read(layout.store, layout.hop_record_uri(assignment.config_id, t))
    except StoreError:
        return None
    if record.input_sha256 != assignment.checkpoint_sha256:
        return None  # it started from another state (a run cleared after its data or code changed)
    if record.status != "ok":
        return record
    return record if record.checkpoint and layout.store.exists(record.checkpoint) else None


def run_bundle_hop(layout: RunLayout, run: RunRecord, manifest: Manifest, bundle: BundleAssignment, *, t: int | None,
                   shard: int, rung_end: bool = False, cache_dir: str, where: Where = Where(),
                   fatal: Callable[[BaseException], bool] = lambda exc: False,
                   section: Callable[[str], object] | None = None) -> BundleHop:
    """Train hop ``t`` of every configuration of ``bundle`` on ``shard`` (``t=None``: each
    configuration's next hop, in a search decided between blocks where they differ).

    ``fatal(exc)`` says which errors end the task instead of failing one configuration (the store
    going away, ``search.fail_fast``); ``section(config_id)`` opens the log's section for one
    configuration.
    """
    session = TaskSession(run, manifest, cache_dir)
    records: list[HopRecord] = []
    failed: list[HopRecord] = []
    skipped: list[str] = []
    carried: list[Assignment] = []
    for assignment in bundle.assignments:
        cid = assignment.config_id
        hop = assignment.t + 1 if t is None else t  # this configuration's hop
        if section is not None:
            section(cid)
        earlier = committed(layout, assignment, hop)
        if earlier is not None:
            skipped.append(cid)
            if earlier.status != "ok":
                failed.append(earlier)
                log.info("%s: hop %d already recorded as %s by an earlier try", cid, hop, earlier.status)
                continue
            records.append(earlier)
            carried.append(Assignment(config_id=cid, t=hop, checkpoint=earlier.checkpoint,
                                      checkpoint_sha256=earlier.checkpoint_sha256, best_t=earlier.best_t,
                                      best_metric=earlier.best_metric))
            log.info("%s: hop %d already committed by try %d; not trained again", cid, hop, earlier.try_number)
            continue
        try:
            record, out = run_hop(layout, run, manifest, assignment, t=hop, shard=shard, rung_end=rung_end,
                                  cache_dir=cache_dir, where=where, session=session, bundle=bundle.bundle)
        except Exception as exc:
            if fatal(exc):
                raise
            session.forget(run.config(cid))
            failure = record_failure(layout, assignment, t=hop, shard=shard, shards=run.schedule.shards, error=exc,
                                     where=where)
            failed.append(failure)
            log.exception("%s %s at hop %d; its remaining hops are skipped, the rest of the bundle goes on",
                          cid, failure.status, hop)
            continue
        records.append(record)
        carried.append(out)
        log.info("%s hop t=%d (iteration %d, hop %d) on shard %d: loss %.4f%s; %.2fs training, model %s",
                 cid, record.t, record.iteration, record.hop, record.shard, record.train_metrics["loss"],
                 f", val {record.val_metrics}" if record.val_metrics else "", record.train_metrics["train_seconds"],
                 "reused" if record.model_reused else "built")
    # renamed for the configurations still in it: a failed one leaves the bundle's next hops
    return BundleHop(records=records, skipped=skipped, failed=failed,
                     out=BundleAssignment.start(bundle.bundle, carried))
