"""The shard loop is a driver of the slot's state machine: production takes exactly the decisions the
slot protocol's simulation checks. A machine fed again the events the loop fed it, in the same order,
decides the same, action for action: nothing but those events (markers listed, records read, commits,
failures, what earlier tries committed) steers what the loop trains, writes, drops and waits for."""

from __future__ import annotations

from mop_airflow.records import HopRecord
from mop_airflow.slots import driver as shard_loop
from mop_airflow.planning.placement import block_hops
from mop_airflow.slots.driver import run_slot
from mop_airflow.slots.messages import Check, End, Train, Write
from mop_airflow.slots.machine import SlotMachine

from .test_shard_loop import HOPS, SHARDS, _classes, _setup
from .toys import TOY_MODEL

EVENTS = ("decide", "markers", "read", "committed", "commit_failed", "commit_lost", "lost", "later_try", "recorded",
          "trained_ok", "trained_failed", "peer_status", "looked", "checked", "asha_hops", "store_changed", "flush")


class _Recording(SlotMachine):
    """The machine, keeping what it was made with and every call the loop made, with what it answered."""

    made: list = []

    def __init__(self, hops, **kwargs):
        hops = list(hops)
        self.calls, self.inside = [], False
        super().__init__(hops, **kwargs)
        _Recording.made.append(self)
        self.args = (hops, kwargs)


def _recorded(name):
    def call(self, *args):
        if self.inside:  # the machine calling itself (decide() going on past hops committed before)
            return getattr(SlotMachine, name)(self, *args)
        self.inside = True
        try:
            out = getattr(SlotMachine, name)(self, *args)
        finally:
            self.inside = False
        self.calls.append((name, args, out))
        return out
    return call


for _name in EVENTS:
    setattr(_Recording, _name, _recorded(_name))


def _replays(machine):
    """Feed a fresh machine the same events; every answer must be the same."""
    hops, kwargs = machine.args
    fresh = SlotMachine(hops, **kwargs)
    for name, args, out in machine.calls:
        assert getattr(fresh, name)(*args) == out, f"{name}{args}: the machine decides otherwise"
    return [out for name, _, out in machine.calls if name == "decide"]


def test_the_loop_runs_the_machines_decisions_and_nothing_else(toy_data, tmp_path, monkeypatch):
    monkeypatch.setattr(shard_loop, "SlotMachine", _Recording)
    _Recording.made = []
    run, layout, manifest = _setup(tmp_path, toy_data, "store", models=(TOY_MODEL, "tests.training.toys:raises"))
    hops = block_hops(_classes(run), shards=SHARDS, slots=1, start=0, end=HOPS)
    result = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops,
                      cache_dir=run.store.local_cache)
    (first,) = _Recording.made
    actions = _replays(first)
    trained = [(h.config_id, h.hop) for act in actions if isinstance(act, Train) for h, _ in act.members]
    assert sorted(trained) == sorted([(r.config_id, r.t) for r in result.trained]
                                     + [(r.config_id, r.t) for r in result.failed])
    written = [(r.config_id, r.t, how) for act in actions if isinstance(act, Write) for r, how in act.records]
    assert sorted((cid, t) for cid, t, how in written if how == "write") == sorted(
        (r.config_id, r.t) for r in result.failed)
    settled = [(cid, t) for cid, t, how in written if how == "settle"]
    assert settled and all(HopRecord.read(layout.store, layout.hop_record_uri(cid, t)).dropped_after == t - 1
                           for cid, t in settled)
    assert isinstance(actions[-1], End) and actions[-1].done

    # a retry: the machine asks what the earlier try committed, and trains nothing again
    again = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops,
                     cache_dir=run.store.local_cache)
    retry = _Recording.made[1]
    actions = _replays(retry)
    assert not again.trained and not any(isinstance(act, Train) for act in actions)
    assert any(isinstance(act, Check) for act in actions)
    assert sorted(again.committed) == sorted(f"{r.config_id} t={r.t}" for r in result.trained + result.failed)
