"""Where each configuration of a block starts: from scratch, or from its state after a hop.

A block's train tasks read the configurations every offset class of the block holds, each with its
starting point: a plain search's from the plan (a block of a split search resumes each from the
checkpoint, checksum, best hop and best metric its hop record holds), a search decided between
blocks from the block's decision. Pure: reads records.
"""

from __future__ import annotations

from typing import Any, Callable

from mop_airflow.records import Assignment, HopRecord


def plain_classes(layout: Any, plan: Any, start: int = 0,
                  stopped: Callable[[str, int], None] | None = None) -> list[list[Assignment]]:
    """A plain search's block that begins at the search's hop ``start``: entry ``o`` lists the
    configurations on shard ``o`` at the block's first hop (offset class ``(o - start) mod shards``),
    in the plan's lineup, each from its state after hop ``start - 1``. A configuration that did not
    finish that hop (it failed earlier) trains no further: ``stopped(config_id, hop)`` hears of it."""
    lineup, shards = plan.class_lineup(), plan.shards
    classes = []
    for o in range(shards):
        starts = []
        for cid in lineup[(o - start) % shards]:
            state = resume_at(layout, cid, -1) if start == 0 else resume_after(layout, cid, start - 1)
            if state is not None:
                starts.append(state)
            elif stopped is not None:
                stopped(cid, start - 1)
        classes.append(starts)
    return classes


def resume_at(layout: Any, cid: str, last: int, record: HopRecord | None = None) -> Assignment:
    """From the configuration's state after hop ``last``, with the checksum its hop recorded
    (``record``, that hop's record, when already read)."""
    if last < 0:
        return Assignment(config_id=cid, t=last, checkpoint=None)
    record = record or HopRecord.read(layout.store, layout.hop_record_uri(cid, last))
    # the checkpoint its record names (a copy of the hop that found another's checkpoint took its own name)
    return Assignment(config_id=cid, t=last, checkpoint=record.checkpoint or layout.checkpoint_uri(cid, last),
                      checkpoint_sha256=record.checkpoint_sha256, best_t=record.best_t,
                      best_metric=record.best_metric)


def resume_after(layout: Any, cid: str, t: int) -> Assignment | None:
    """``cid`` from its state after hop ``t``; None when it did not finish that hop (it failed
    earlier, or its hop there failed): it trains no further."""
    uri = layout.hop_record_uri(cid, t)
    record = HopRecord.read(layout.store, uri) if layout.store.exists(uri) else None
    if record is not None and record.status == "ok":
        return resume_at(layout, cid, t, record)
    return None


def resume_in_block(layout: Any, decision: Any, cid: str) -> Assignment:
    """Where ``cid`` starts block ``decision.block`` of a search decided between blocks: from scratch,
    from its own state, or, for a population-based training copy made at this decision, from the
    copy of its parent's checkpoint that the decision wrote."""
    copy = next((c for c in decision.copies if c["config_id"] == cid), None)
    if copy is not None:
        return Assignment(config_id=cid, t=copy["t"], checkpoint=copy["checkpoint"],
                          checkpoint_sha256=copy["checkpoint_sha256"])
    return resume_at(layout, cid, decision.training[cid] - 1)


def decision_classes(layout: Any, decision: Any) -> list[list[Assignment]]:
    """Every offset class of the block ``decision`` says trains (a search decided between blocks), in
    its lineup, each configuration resuming where it stands (:func:`resume_in_block`)."""
    return [[resume_in_block(layout, decision, cid) for cid in members] for members in decision.lineup]
