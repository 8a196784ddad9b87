"""Where each configuration of a bundle resumes: from scratch, or from its state after a hop.

The stage and deal tasks hand each chain its bundle with every configuration's starting point; a
block of a split search, or a rung of an adaptive one, resumes from the checkpoint (and the
checksum, best hop and best metric) that the configuration's hop record holds. Pure: reads records.
"""

from __future__ import annotations

from typing import Any, Callable

from mop_airflow.records import Assignment, BundleAssignment, HopRecord


def bundle_items(bundles: list[list[str]], first: int, resume: Callable[[str], Assignment]) -> list[dict[str, Any]]:
    """What a class's chains take: one item per bundle (``first`` is its first global index), each
    configuration's assignment from ``resume(config_id)``."""
    return [BundleAssignment.start(first + j, [resume(cid) for cid in members]).to_dict()
            for j, members in enumerate(bundles)]


def resume_at(layout: Any, cid: str, last: int, record: HopRecord | None = None) -> Assignment:
    """From the configuration's state after hop ``last``, with the checksum its hop recorded
    (``record``, that hop's record, when already read)."""
    if last < 0:
        return Assignment(config_id=cid, t=last, checkpoint=None)
    record = record or HopRecord.read(layout.store, layout.hop_record_uri(cid, last))
    return Assignment(config_id=cid, t=last, checkpoint=layout.checkpoint_uri(cid, last),
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


def decision_classes(layout: Any, decision: Any) -> list[list[dict[str, Any]]]:
    """Every offset class's bundles of the block ``decision`` says trains (a search decided between
    blocks), each configuration resuming where it stands (:func:`resume_in_block`)."""
    per_class = decision.bundles
    return [bundle_items(bundles, sum(len(b) for b in per_class[:offset]),
                         lambda cid: resume_in_block(layout, decision, cid))
            for offset, bundles in enumerate(per_class)]
