"""What a slot takes as a hop's outcome: its commit, its failure, another copy's record, an earlier try's.

Part of :class:`~mop_airflow.slots.machine.SlotMachine` (a mixin on its state): the writer's commits and
failed commits, a hop that failed, a fenced create that found another copy's record standing
(Rules.fence), what a retry finds its earlier try committed (:class:`~mop_airflow.slots.messages.Facts`),
and the record a dropped hop settles forward. Apart from the rest of the machine because each decides
what the slot learns and writes of a hop it trained or was due to, never what it trains next.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mop_airflow.slots.messages import Facts, Record


class Outcomes:
    """How :class:`~mop_airflow.slots.machine.SlotMachine` takes in what became of its hops (the state it
    sets up: ``commits``, ``outbox``, ``taking``, ``failed``)."""

    def committed(self, record: Any) -> None:
        """The writer committed this slot's oldest hop in its hands (checkpoint, record, marker)."""
        self.commits.pop(0)
        self._learn(record)

    def commit_lost(self, standing: Any) -> None:
        """The writer's create of this slot's oldest hop's record found ``standing`` there (Rules.fence):
        another copy of the hop committed first (an earlier try that was taken for dead and resumed, a
        later try of this slot running at once). The record there stands: learnt as this hop's, its
        checkpoint untouched, and marked for the slots waiting for it (its writer may not have yet)."""
        self.commits.pop(0)
        self._stands(standing)

    def lost(self, record: Any, standing: Any) -> None:
        """A fenced create of ``record`` (a failure, a drop settled, Write) found ``standing`` there. A settle
        leaves an earlier record as it is; a failure learnt when it was written is taken back for what
        stands (another copy of the hop committed it: the configuration is healthy, and not recorded failed)."""
        if record.dropped_after is not None:
            return
        if self.failed.get(record.config_id) is record:
            del self.failed[record.config_id]
        self._stands(standing)

    def _stands(self, standing: Any) -> None:
        self._learn(standing)
        if self.rules.mark_found:
            self.outbox.append((standing, "mark"))

    def commit_failed(self, hop: Any, state: Any, status: str, error: str) -> None:
        """The writer could not commit this slot's oldest hop: its configuration fails, as if it failed."""
        self.commits.pop(0)
        self.trained_failed(hop, state, status, error)

    def recorded(self, record: Any) -> None:
        """A record the driver wrote of its own accord (ASHA: a leg whose next hop is on a dead slot)."""
        self._learn(record)

    def trained_ok(self, hop: Any) -> None:
        """A hop trained: its commit goes to the writer."""
        self.commits.append(hop)

    def trained_failed(self, hop: Any, state: Any, status: str, error: str) -> None:
        """A hop failed (its builder raised, it diverged): record_failure, its marker; the others go on."""
        failure = Record(hop.config_id, hop.hop, hop.shard, status, state.checkpoint_sha256, error=error,
                         try_number=self.try_number)
        self.outbox.append((failure, "write"))
        self._learn(failure)

    def checked(self, facts: Mapping[tuple, Facts]) -> list:
        """The answer to :class:`Check`; returns ``(hop, record)`` of each hop an earlier try committed
        (then learnt here, and not trained again)."""
        members, _ = self.taking
        todo, found = [], []
        for hop, state in members:
            earlier = self._earlier(hop, state, facts.get((hop.config_id, hop.hop)))
            if earlier is None:
                todo.append((hop, state))
                continue
            found.append((hop, earlier))
            self._learn(earlier)
            if self.rules.mark_found:
                # the earlier try may have died between the record and its marker: the slot waiting for this
                # hop lists markers, and would wait for ever (seed 164). Marked again even when this slot
                # listed its marker: one PUT a hop found on a retry, and a marker seen here may be one that
                # landed after a name the waiting slot's poller had listed past
                self.outbox.append((earlier, "mark"))
        self.taking = [todo, True]
        return found

    def _earlier(self, hop: Any, state: Any, facts: Facts | None) -> Any:
        """Hop ``hop`` as an earlier try left it, when that try started from ``state``: a failure, or a
        commit (its record written, and its checkpoint there, or already taken on by the next hop).

        The hop after it is trained on the next shard, by a slot whose markers this one does not list:
        whether it took the state on is asked of the store, never of the markers known. A retry that
        took an unlisted next hop for "not committed" trained a committed hop again from a checkpoint
        already cleaned up, and overwrote its record. A first try knows its earlier tries' hops from the
        markers (a retry asks the store: its earlier try may have died between a record and its marker; so
        does a run after a yield, :attr:`rerun`)."""
        record = None if facts is None else facts.record
        if record is None or record.input_sha256 != state.checkpoint_sha256:
            return None
        if record.status != "ok" or facts.checkpoint_there:
            return record
        if not self.rerun and (hop.config_id, hop.hop + 1) in self.known:
            return record
        return record if facts.next_there else None

    def _settle_dropped(self, hop: Any, failure: Any) -> None:
        """Write down, where ``hop`` was due, that it will never train: the slot of the next shard waits for
        this hop's record (its marker in this slot's folder), and learns from it that the configuration
        failed. Without it that slot, and every one after it along the chain, waited for a hop that never
        came. The configuration's later hops on this slot need no record: its next hop's slot drops them
        (and settles its own) as this one did. An earlier try's record of the hop is left as it is
        ("settle": the driver writes it only where no record is)."""
        first = failure.t if failure.dropped_after is None else failure.dropped_after
        self.outbox.append((Record(hop.config_id, hop.hop, hop.shard, failure.status, error=failure.error,
                                   dropped_after=first, try_number=self.try_number), "settle"))


def ask_facts(state: Any, *, first_try: bool, next_known: bool, record: Callable[[], Any],
              checkpoint_there: Callable[[Any], bool], next_there: Callable[[], bool]) -> Facts:
    """What a check needs to know of hop ``t`` (started from ``state``), asked in the order
    :meth:`Outcomes._earlier` reads it and no further: its record (``record()``, None when there is none),
    whether that record's checkpoint is there, whether hop ``t + 1``'s record is (not asked of a first try
    that listed that hop's marker: ``next_known``). The shard loop asks its store, the slot simulation its
    virtual one: one rule of what a retry asks, so the simulation answers the questions production puts."""
    found = record()
    if found is None:
        return Facts()
    if found.input_sha256 != state.checkpoint_sha256 or found.status != "ok":
        return Facts(found)
    if checkpoint_there(found):
        return Facts(found, checkpoint_there=True)
    if first_try and next_known:
        return Facts(found)
    return Facts(found, next_there=next_there())
