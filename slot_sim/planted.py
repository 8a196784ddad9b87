"""Bugs planted on purpose in the slot protocol, switched in by name, to show the simulation catches each.

Mutation testing, as the design notes ask: a planted bug that no schedule catches names a missing
invariant or fault. Each bug is the production code with one rule broken: a :class:`~mop_airflow.slots.
messages.Rules` switch the machine already has, or a production function replaced for the length of a
``with`` (:func:`planted`), so that production's code stays as it ships. ``python -m slot_sim --planted``
runs every bug over a range of seeds and prints the table the docs show; the CI test
(``tests/training/test_slot_sim.py``) fails if any bug survives its seeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator
from unittest import mock

from mop_airflow.planning import asha_slots
from mop_airflow.search import asha as search_asha
from mop_airflow.search import promotion
from mop_airflow.slots import asha_rules, block_end, endings, machine, peers
from mop_airflow.slots.messages import NEVER, Rules


@dataclass(frozen=True)
class Bug:
    """A planted bug: what it breaks, in words; the rules it runs with; the production functions it
    replaces (``(owner, attribute, replacement(original))``); ``needs``: a fault the simulated world does
    not have yet, without which no schedule can catch it (then it is listed, not required); ``hunt_from``:
    where the hunt for it starts, for a bug found only far into the seeds (said in the docs' table);
    ``caught_at``: the first seed found to catch it (the docs' table), where CI's hunt starts, so that CI
    replays one schedule a bug instead of the hundreds before it (and hunts on from there if a change of
    the protocol or the world moved it)."""

    what: str
    rules: Rules = Rules()
    patches: tuple = ()
    needs: str | None = None
    hunt_from: int = 0  # the first seed hunted: past 0 only for a bug the first seeds never reach
    caught_at: int | None = None


def _gone_without_wait_bound(original: Callable) -> Callable:
    def gone(self: Any, now: float, wait: float) -> Any:
        why = original(self, now, wait)
        return None if why is not None and not why[1] and "made no progress" in why[0] else why
    return gone


def _read_ignoring_same_try(original: Callable) -> Callable:
    def read(self: Any, status: Any, at: float) -> None:
        if status is not None and self.latest is not None and status.try_number <= self.latest.try_number:
            return  # `<` made `<=`: a later word of the same try is dropped as if it were older
        original(self, status, at)
    return read


def _promoting_again(original: Callable) -> Callable:
    def next_jobs(plan: Any, completions: Any, promoted: Any, *args: Any, **kwargs: Any) -> Any:
        return original(plan, completions, [], *args, **kwargs)
    return next_jobs


def _over_budget(original: Callable) -> Callable:
    def next_jobs(plan: Any, *args: Any, **kwargs: Any) -> Any:
        return original(dataclasses.replace(plan, budget=None), *args, **kwargs)
    return next_jobs


def _reversed(original: Callable) -> Callable:
    def rank_rung(results: Any, *, direction: str) -> Any:
        return original(results, direction="max" if direction == "min" else "min")
    return rank_rung


def _any_record_ends_leg(original: Callable) -> Callable:
    return lambda record, job, shards: True


def _completed_at_latest(original: Callable) -> Callable:
    def completions(records: Any, jobs: Any, *, shards: int, metric: str) -> Any:
        # each job completes at its configuration's latest record, whatever hop of its leg that is
        done = {r.config_id: r for r in records}
        out = []
        for job in jobs:
            r = done.get(job.config_id)
            if r is not None:
                out.append(original([dataclasses.replace(r, t=job.iterations * shards - 1)
                                     if dataclasses.is_dataclass(r) else _At(r, job.iterations * shards - 1)],
                                    [job], shards=shards, metric=metric)[0])
        return out
    return completions


class _At:
    def __init__(self, record: Any, t: int) -> None:
        self.__dict__.update(vars(record))
        self.t = t


def _dies_on_any_try(original: Callable) -> Callable:
    def died_on_last_try(status: Any, now: float, wait: float) -> bool:
        return status is not None and status.state == "running" and now - status.heartbeat > wait
    return died_on_last_try


def _failure_not_written(original: Callable) -> Callable:
    def trained_failed(self: Any, hop: Any, state: Any, status: str, error: str) -> None:
        original(self, hop, state, status, error)
        self.outbox.pop()  # learnt here, never written: the slots after it wait for a record that never comes
    return trained_failed


def _never_taken_back(original: Callable) -> Callable:
    return lambda self, now: None


def _others_taken_for_ended(original: Callable) -> Callable:
    return lambda statuses, now, wait: True


def _dead_taken_for_running(original: Callable) -> Callable:
    def ended_or_never_started(statuses: Any, now: float, wait: float) -> bool:
        return original(statuses, now, NEVER)  # a slot dead on its last try is never judged dead
    return ended_or_never_started


def _gone_compared_whole(original: Callable) -> Callable:
    def judge_gone(self: Any, now: float) -> None:
        gone = frozenset(o for o in self.watched if (g := self.peers[o].gone(now, self.wait)) is not None and g[1])
        if gone != self.gone_seen:  # the rule before: the slots watched change from one call to the next
            self.gone_seen, self.decide_due = gone, True
    return judge_gone


def _world() -> Any:
    """The simulation's world, which carries the driver's end out (imported late: it imports this module's
    neighbours)."""
    import slot_sim.world as world  # noqa: PLC0415

    return world


def _never_earlier(original: Callable) -> Callable:
    return lambda self, hop, state, facts: None


BUGS: dict[str, Bug] = {
    "failed configuration not settled forward": Bug(
        "a slot that drops a failed configuration's hops writes no record where the next one was due",
        Rules(settle_forward=False), caught_at=63),
    "retry does not check commits": Bug(
        "a retry takes no hop as committed by its earlier try, and trains it again",
        patches=((machine.SlotMachine, "_earlier", _never_earlier),), caught_at=0),
    "no bound on waiting for a silent peer": Bug(
        "a slot waits for ever for a peer whose progress stopped (no wait bound)",
        patches=((peers.PeerView, "gone", _gone_without_wait_bound),),
        needs="a peer that hangs past its watchdog: since slots that never start and bounded yields came in, a "
              "hung peer is always killed and retried or ended, and seeds 0 to 7,999 no longer catch it (2026-12-06)"),
    "PeerView.read `<` made `<=`": Bug(
        "a peer's later status from the same try is ignored",
        patches=((peers.PeerView, "read", _read_ignoring_same_try),), caught_at=283),
    "ASHA promotes twice": Bug(
        "ASHA forgets which configurations it promoted",
        patches=((asha_slots, "next_jobs", _promoting_again),), caught_at=1),
    "production ranking reversed": Bug(
        "every rung, leaderboard and promotion ranks worst first",
        patches=((promotion, "rank_rung", _reversed), (search_asha, "rank_rung", _reversed)), caught_at=0),
    "ASHA over its budget": Bug(
        "ASHA hands out legs past its budget's last block",
        patches=((asha_slots, "next_jobs", _over_budget),), caught_at=13),
    "promotion without its rung complete": Bug(
        "an ASHA job counts as complete at its configuration's latest record, mid-leg",
        patches=((asha_slots, "ends_leg", _any_record_ends_leg), (asha_slots, "completions", _completed_at_latest)),
        caught_at=1),
    # a found commit's marker and the look-up of a hop waited for a minute cover each other: either
    # alone survives the first 600 seeds, both together do not
    "found commit neither marked nor looked up": Bug(
        "a retry that finds its hop committed does not mark it, and a slot waiting for it never looks it up",
        Rules(mark_found=False, look_after=None), caught_at=5),
    "given-up hop never looked up": Bug(
        "a hop given up never has its input's record looked up again", Rules(look_given_up=False),
        hunt_from=136_000,
        needs="a schedule that reaches it again: seeds 136,000 to 143,998 no longer do since ASHA decides when a "
              "peer is newly judged ended for good (2026-12-06)"),
    "a peer dead on its last try waited for": Bug(
        "a slot silent on its last try is not taken as ended for good", Rules(last_try_dies=False), caught_at=539),
    "ASHA dead legs kept": Bug(
        "ASHA never fails a leg whose next hop is on a slot ended for good", Rules(asha_dead_legs=False), caught_at=196),
    "silent peer dead on any try": Bug(
        "a peer silent for the wait bound is taken as ended for good though a retry follows",
        patches=((peers, "died_on_last_try", _dies_on_any_try),),
        needs="a retry that starts past the wait bound after its try died: seed 984 caught it only through ASHA's "
              "slots deciding at every chance (fixed), and seeds 0 to 29,999 no longer do (2026-12-06)"),
    "failure not recorded": Bug(
        "a configuration that fails is not recorded failed (the slot only learns it)",
        patches=((machine.SlotMachine, "trained_failed", _failure_not_written),), caught_at=1),
    "fence removed": Bug(
        "two copies of one slot write over each other's records and checkpoints", Rules(fence=False), caught_at=30),
    "yields unbounded": Bug(
        "a slot gives its pool slot back for ever to a slot ranked before it that never starts",
        Rules(yield_bound=False), caught_at=25),
    "give-up never taken back": Bug(
        "a hop given up stays given up when its input comes after all",
        patches=((machine.SlotMachine, "_take_back", _never_taken_back),), caught_at=17),
    "lost slot ends nothing": Bug(
        "a slot lost with its worker on its last try leaves its block's never-started tasks waiting (no failure "
        "callback)", Rules(lost_ends_block=False), caught_at=4390),
    "never-started slots ended before the last": Bug(
        "a slot that ends done marks its block's never-started slots with nothing left to do done while another "
        "slot still runs, which may wait for the failure they would have settled",
        patches=((endings, "ended_or_never_started", _others_taken_for_ended),
                 (_world(), "ended_or_never_started", _others_taken_for_ended)),
        hunt_from=28_485, caught_at=28_485),
    "dead on its last try taken for running": Bug(
        "a slot ending with never-started slots to mark done counts a slot dead on its last try as running, and "
        "does not wait for a silent one to be judged: nothing marks them",
        patches=((endings, "ended_or_never_started", _dead_taken_for_running),
                 (_world(), "ended_or_never_started", _dead_taken_for_running),
                 (block_end.BlockEnd, "_silent_at_end", lambda original: lambda self, now: None)),
        hunt_from=372_655, caught_at=372_655),
    "ASHA gone compared whole": Bug(
        "an ASHA slot decides again whenever the set of watched slots ended for good differs from the last, "
        "which the watched slots changing flips",
        patches=((asha_rules.AshaRules, "_judge_gone", _gone_compared_whole),), hunt_from=344_101, caught_at=344_101),
    "retry waits out a lost marker again": Bug(
        "a retry waits look_after again for an input whose marker a listing lost, as its earlier try did",
        Rules(retry_looks=False), hunt_from=403_972, caught_at=403_972),
    "run after a yield trusts its markers": Bug(
        "a slot started again after a yield takes a hop whose marker it did not list for not committed, and "
        "trains it again from a checkpoint that may be deleted", Rules(yield_checks=False), hunt_from=16_628,
        caught_at=16_628),
}
# Named for the protocol's fixes still to land, plantable once they do (none now).
PENDING: dict = {}


@contextlib.contextmanager
def planted(name: str | None) -> Iterator[Rules]:
    """Run the ``with`` body with bug ``name`` planted (None: none); yields the rules to run with."""
    if name is None:
        yield Rules()
        return
    bug = BUGS[name]
    with contextlib.ExitStack() as stack:
        for owner, attribute, replace in bug.patches:
            stack.enter_context(mock.patch.object(owner, attribute, replace(getattr(owner, attribute))))
        yield bug.rules
