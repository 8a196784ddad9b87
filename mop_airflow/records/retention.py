"""Which checkpoints a configuration keeps: the last ``store.keep_checkpoints`` and its best.

Apart, and below the training and the slot protocol, because the hop's commit
(:meth:`~mop_airflow.training.model_hop.TrainedHop.commit`) and the slot simulation both keep
checkpoints by this one rule.
"""

from __future__ import annotations


def stale_checkpoints(t: int, keep: int | None, best_t: int | None, previous_best_t: int | None) -> list[int]:
    """The hops whose checkpoints go once hop ``t`` is saved: the one falling out of the last ``keep``,
    and the former best once it is beaten (unless still among the last ``keep``); never the best. A commit
    deletes them only once its record is written, so a retry of its hop still finds the state it started
    from; the slot simulation keeps its checkpoints by this rule too."""
    if keep is None:
        return []
    stale = {t - keep} if t - keep >= 0 else set()
    if previous_best_t is not None and previous_best_t != best_t and previous_best_t <= t - keep:
        stale.add(previous_best_t)
    stale.discard(best_t)
    return sorted(stale)
