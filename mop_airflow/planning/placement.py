"""Which shard slot trains each hop of a block: the one placement rule, production's and the simulator's.

A block's train task on shard ``s``, slot ``k`` (:mod:`mop_airflow.operators.train`, through
:func:`mop_airflow.slots.driver.run_slot`) trains the hops :func:`block_hops` puts on ``(s, k)``, and
:func:`mop_airflow.planning.simulation.simulate` replays the same hops on the same slots by calling it
with the same rules (:func:`slot_rules`: how a run's configurations are dealt to the slots, by model key,
fused groups whole), so a simulated slot's hops are the hops a real one trains. Pure: no Airflow, no
Keras, no store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

from mop_airflow.planning.fusing import grouping
from mop_airflow.planning.lineup import model_key
from mop_airflow.planning.schedule import DEFAULT_PRIORITY, priority_weight, shard_at
from mop_airflow.records import Assignment


@dataclass(frozen=True)
class BlockHop:
    """One hop of a block: configuration ``config_id`` of offset class ``offset`` at the plan's step
    ``step`` (a global hop, or a block-relative one in a search decided between blocks), on ``shard``
    and its slot ``slot``. ``start`` is where the configuration enters the block, on its first hop."""

    config_id: str
    offset: int
    step: int
    shard: int
    slot: int
    hop: int      # the configuration's own global hop
    rung_end: bool = False
    start: Assignment | None = None
    weight: int = 1
    order: int = 0

    @property
    def label(self) -> str:
        return f"{self.config_id} t={self.hop}"


def block_hops(classes: Sequence[Sequence[Assignment]], *, shards: int, slots: int, start: int, end: int,
               relative: bool = False, rung_end: bool = False, priority: str = DEFAULT_PRIORITY,
               shift: int = 0, ends: Collection[str] | None = None,
               key: Callable[[str], str] | None = None,
               fuse: Callable[[Sequence[str]], list[list[str]]] | None = None) -> list[BlockHop]:
    """Every hop of a block, on every shard slot, in the plan's order.

    ``classes[o]`` lists offset class ``o``'s configurations in the order the slots take them, each with the state it
    enters the block in. Its hop at step ``t`` (``start <= t < end``) is on shard ``(o + t) mod shards``;
    with ``relative`` the steps count within the block and the configuration's own hop follows its
    state (a search decided between blocks); else its global hop is ``shift + t`` (a run continuing a
    search renders its block's steps from 0). Configuration ``i`` of the block (counted over the
    classes in order) trains on slot ``i mod slots`` of every shard. ``rung_end``: the block's last
    hop ends a rung and evaluates. The priority rule ranks a slot's ready hops as Airflow ranked hop
    tasks (:func:`~mop_airflow.planning.schedule.priority_weight`, counted to the block's end). ``key(config_id)``: the configuration's model key; then the
    configurations that share one go to the same slot where the slots stay balanced
    (:func:`deal_slots`), so a slot's compiled models serve more of its hops. ``fuse(config_ids)``: a
    class's configurations in the groups that may train fused (``schedule.fuse``); then each group goes
    whole to one slot (:func:`deal_fused_slots`), whatever ``key`` says. ``ends``: with
    ``rung_end``, the configurations whose rung ends at the block's end (the others go on past it, in
    the next block); None: every one.
    """
    hops: list[BlockHop] = []
    index = 0
    ids = [[a.config_id for a in members] for members in classes]
    dealt = (deal_fused_slots(ids, slots, fuse) if fuse is not None and slots > 1
             else None if key is None else deal_slots(ids, slots, key))
    for offset, members in enumerate(classes):
        for assignment in members:
            slot = index % max(1, slots) if dealt is None else dealt[assignment.config_id]
            index += 1
            for step in range(start, end):
                hops.append(BlockHop(
                    config_id=assignment.config_id, offset=offset, step=step,
                    shard=shard_at(offset, step, shards), slot=slot,
                    hop=assignment.t + 1 + (step - start) if relative else shift + step,
                    rung_end=rung_end and step == end - 1 and (ends is None or assignment.config_id in ends),
                    start=assignment if step == start else None,
                    weight=priority_weight(priority, step, end), order=len(hops)))
    return hops


def deal_slots(classes: Sequence[Sequence[str]], slots: int, key: Callable[[str], str]) -> dict[str, int]:
    """The slot of each configuration (``classes[o]`` lists offset class ``o``'s), keeping those that
    share a model key together. Each class puts on each slot what configuration ``i mod slots`` would
    (the same count, so the slots stay as balanced as before, class by class); within that, a
    configuration goes to the slot its model key first went to while it has room, else to the slot
    with the most room left (the lowest first). Deterministic: every slot of the block deals the same."""
    slots = max(1, slots)
    home: dict[str, int] = {}
    dealt: dict[str, int] = {}
    index = 0
    for members in classes:
        room = [0] * slots
        for i in range(index, index + len(members)):
            room[i % slots] += 1
        index += len(members)
        order: dict[str, list[str]] = {}
        for cid in members:
            order.setdefault(key(cid), []).append(cid)
        # the keys already at home first, so a newcomer never takes a place another key's configurations need
        for model in sorted(order, key=lambda k: k not in home):
            for cid in order[model]:
                slot = home.get(model)
                if slot is None or room[slot] == 0:
                    slot = max(range(slots), key=lambda s: (room[s], -s))
                home.setdefault(model, slot)
                room[slot] -= 1
                dealt[cid] = slot
    return dealt


def deal_fused_slots(classes: Sequence[Sequence[str]], slots: int,
                     fuse: Callable[[Sequence[str]], list[list[str]]]) -> dict[str, int]:
    """The slot of each configuration (``classes[o]`` lists offset class ``o``'s), each fused group of a
    class whole on one: the group to the slot with the fewest configurations of the block so far, the
    lowest first, so configurations alone deal as ``i mod slots`` does. Deterministic."""
    load = [0] * slots
    dealt: dict[str, int] = {}
    for members in classes:
        for group in fuse(members):
            slot = min(range(slots), key=lambda k: (load[k], k))
            load[slot] += len(group)
            dealt.update((cid, slot) for cid in group)
    return dealt


def fused_partners(hops: Sequence[BlockHop], groups: Callable[[list[str]], list[list[str]]]) -> dict[tuple[str, int], frozenset[str]]:
    """Which hops train fused: the hops of one place (hop, shard, slot and rung end: what must be the same
    for hops to train as one program besides their configurations), cut by ``groups`` (for a run,
    :func:`~mop_airflow.planning.fusing.groups_of`) in their order; each hop of a group of two or more ->
    its group's configurations. From the plan alone, so the same spec trains the same groups every run;
    the shard loop and the slot simulation both take it from here."""
    by_place: dict[tuple, list[str]] = {}
    for h in hops:
        by_place.setdefault((h.hop, h.shard, h.slot, h.rung_end), []).append(h.config_id)
    partners: dict[tuple[str, int], frozenset[str]] = {}
    for (hop, *_), cids in by_place.items():
        for group in groups(cids):
            if len(group) > 1:
                partners.update(((cid, hop), frozenset(group)) for cid in group)
    return partners


def slot_rules(run: Any) -> dict[str, Any]:
    """The ``key`` and ``fuse`` :func:`block_hops` deals ``run``'s configurations (a
    :class:`~mop_airflow.records.RunRecord`) to the slots with: a model key's configurations on one
    slot, so its compiled model serves them all, and a group that may train fused whole on one."""
    return {"key": lambda cid: model_key(run.config(cid)), "fuse": grouping(run)}
