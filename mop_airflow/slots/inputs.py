"""Whether a hop's input is committed, as far as its slot knows: the state a hop starts from.

Part of :class:`~mop_airflow.slots.machine.SlotMachine` (a mixin on its state): the markers its poller
listed, the records read of them (or not readable yet), and the state each configuration's next hop
starts from, a failure record when it failed before. Apart from the rest of the machine because this
is the one decision every other rests on: a hop is ready when :meth:`Inputs._before` gives its state.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from mop_airflow.slots.messages import NEVER, READ_AGAIN, Read


class Inputs:
    """What :class:`~mop_airflow.slots.machine.SlotMachine` knows of its hops' inputs (the state it sets up:
    ``listed``, ``records``, ``unread_at``, ``known``, ``states``, ``failed``)."""

    def markers(self, listed: Iterable[Any]) -> None:
        """A poll listed markers: each a hop ``(config_id, t)``, its record read when a decision needs it
        (:class:`Read`: a listing costs one request, not a read per configuration), or the record itself."""
        for item in listed:
            key = item if isinstance(item, tuple) else (item.config_id, item.t)
            self.known.add(key)
            self.listed.add(key)
            if isinstance(item, tuple):
                self.records.pop(key, None)  # a hop marked again (trained again): its record is read again
            else:
                self.records[key] = item

    def read(self, found: Mapping[tuple, Any]) -> None:
        """The answer to :class:`Read`: the record each listed marker names."""
        self.records.update(found)
        for key in found:
            self.unread_at.pop(key, None)

    def unreadable(self, keys: Iterable[tuple]) -> None:
        """The answer to :class:`Read` for markers whose record this reader cannot read yet (a 404 though
        the marker was listed: a store whose readers disagree for a while). Read again :data:`READ_AGAIN`
        later; meanwhile the hop waits as if its marker had not been listed (its peer judged as ever)."""
        if not self.rules.read_again:
            raise LookupError(f"the records of {sorted(keys)} are listed but cannot be read")
        for key in keys:
            self.unread_at[key] = self.clock

    def _needs(self, cid: str, t: int) -> bool:
        """Whether :meth:`_before` of hop ``t`` takes the record of hop ``t - 1`` in."""
        failed = self.failed.get(cid)
        states = self.states.get(cid)
        return not (failed is not None and failed.t < t) and bool(states) and t - 1 not in states

    def _unread(self, hops: Iterable[Any]) -> Read | None:
        """Read the records of the listed markers that name these hops' inputs, unless read already."""
        due = self.clock - READ_AGAIN
        keys = sorted({(h.config_id, h.hop - 1) for h in hops if h.start is None
                       and (h.config_id, h.hop - 1) in self.listed and (h.config_id, h.hop - 1) not in self.records
                       and self.unread_at.get((h.config_id, h.hop - 1), -NEVER) <= due
                       and self._needs(h.config_id, h.hop)})
        return Read(tuple(keys)) if keys else None

    def _before(self, cid: str, t: int) -> Any:
        """The state hop ``t`` starts from, a failure record when the configuration failed before it, or
        None while the hop before it is not committed (as far as this slot knows).

        The hop before it was trained by the previous shard's slot, whose markers this slot lists; the
        hops between this slot's last knowledge of the configuration and that one were trained by slots
        it does not list. So the record a marker names is taken as it is (its slot checked its own input
        against the record before it), and checked here against the state before it when this slot
        knows that state: walking the records between would cost a read per shard and hop."""
        failed = self.failed.get(cid)
        if failed is not None and failed.t < t:
            return failed
        states = self.states.get(cid)
        if not states:
            return None
        if t - 1 in states:
            return states[t - 1]
        key = (cid, t - 1)
        if key not in self.listed or key not in self.records:
            return None  # not listed, or not read yet (its Read comes first)
        record = self.records[key]
        self.listed.discard(key)  # taken in: a later marker of it (trained again) brings it back
        known = states.get(t - 2)
        # a dropped hop's record started from nothing: it says the configuration failed before it
        if known is not None and record.dropped_after is None and record.input_sha256 != known.checkpoint_sha256:
            return None  # left by an earlier run from another state: its hop will be trained again
        if record.status != "ok":
            self.failed[cid] = record
            return record
        states[record.t] = self.state_after(record)
        return states[record.t]

    def _learn(self, record: Any) -> None:
        if record.status != "ok":
            self.failed[record.config_id] = record
        else:
            self.states.setdefault(record.config_id, {})[record.t] = self.state_after(record)
