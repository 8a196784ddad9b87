"""A shard slot's watchdog learns its stall bound from the steps it has seen: long before the first
step and during a step announced long, then a multiple of the slowest step so far with a floor. No
test asserts how fast the machine is: a busy one only makes the steps, and so the bounds, longer."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from mop_airflow.training import progress
from mop_airflow.slots.watchdog import STALL_FLOOR_SECONDS, STALL_MULTIPLE, STALL_SECONDS, StallBound, Watchdog


def test_the_bound_is_long_before_the_first_step_then_follows_the_slowest_step_with_a_floor():
    bound = StallBound(300.0, floor=30.0, multiple=10.0)
    assert bound.see(7, 0.0)[0] == 300.0  # the slot starts: its shard, its first model
    assert bound.see(8, 40.0)[0] == 300.0  # the first tick, after a 40 s start (never learned)...
    assert bound.see(8, 50.0)[0] == 300.0  # ...then the first step traces and compiles, as long as it takes
    # the second tick: its first step took 12 s, and the bound is 10 x that (over the 30 s floor)
    assert bound.see(9, 52.0) == (120.0, "10 x its slowest step so far (12.0 s), at least "
                                         "MOP_SHARD_STALL_FLOOR_SECONDS=30")
    assert bound.see(30, 53.0)[0] == 120.0
    assert bound.see(31, 54.0)[0] == 120.0  # quick steps do not lower it: the slowest so far counts
    assert bound.see(32, 70.0)[0] == 160.0  # a slower one raises it
    assert bound.see(33, 110.0) == (300.0, "10 x its slowest step so far (40.0 s), at most MOP_SHARD_STALL_SECONDS")


def test_the_floor_holds_for_quick_steps_and_the_ceiling_caps_everything():
    quick = StallBound(300.0, floor=60.0, multiple=10.0)
    for second, count in enumerate(range(0, 50, 5)):  # a step or more between two reads
        bound, why = quick.see(count, float(second))
    assert bound == 60.0 and "at least MOP_SHARD_STALL_FLOOR_SECONDS=60" in why
    low = StallBound(20.0, floor=60.0)  # a bound set below the floor stays as it was: fixed
    assert {low.see(count, float(count))[0] for count in range(10)} == {20.0}


def test_a_long_step_announced_has_the_long_bound_until_the_count_moved_twice():
    bound = StallBound(300.0, floor=5.0, multiple=2.0)
    for second in range(5):
        bound.see(second, float(second))
    assert bound.see(5, 5.0)[0] == 5.0
    # a model to build at count 5: until 7 (its first step over) the bound is the long one (none seen yet)
    assert bound.see(5, 100.0, long_until=7) == (300.0, "the bound of a long step before one was seen to its end, "
                                                       "MOP_SHARD_STALL_SECONDS")
    assert bound.see(6, 150.0, long_until=7)[0] == 300.0
    # it was waited out, and counts as a step: 2 x 145 s
    assert bound.see(7, 151.0, long_until=7)[0] == 290.0


def test_a_long_step_is_bound_by_the_long_steps_seen_with_the_ceiling_only_before_the_first():
    bound = StallBound(300.0, floor=60.0, multiple=10.0)  # the defaults: a long step's floor is 2 x 60 s
    assert bound.see(0, 0.0)[0] == 300.0  # the slot starts (its shard, imports)
    # its first model is announced (count 0, ends at 2) after the read at 0 s, and seen at 1 s
    assert bound.see(0, 1.0, long_until=2)[0] == 300.0
    assert bound.see(1, 2.0, long_until=2)[0] == 300.0  # built and restored: its first step compiles
    # the first step over (the count moved twice): a long step of 9 - 0 = 9 s, and a step of 9 - 2 = 7 s
    assert bound.see(2, 9.0, long_until=2)[0] == 70.0  # steps: 10 x the slowest, as before
    assert bound.slowest_long == 9.0
    assert bound.see(3, 10.0, long_until=2)[0] == 70.0
    assert bound.see(4, 11.0, long_until=2)[0] == 70.0
    # another model to build (count 4, ends at 6), seen at 12 s: 5 x 9 s = 45 s, under the 120 s floor
    assert bound.see(4, 12.0, long_until=6) == (
        120.0, "5 x its slowest long step so far (a model built, a file fetched: 9.0 s), at least "
               "2 x MOP_SHARD_STALL_FLOOR_SECONDS=120")
    # hung there, it is killed after 120 s, not the 300 s ceiling. This build took 40 - 11 = 29 s (from the
    # read before it was seen), a step of 29 s too: the step bound is 290 s
    assert bound.see(6, 40.0, long_until=6)[0] == 290.0
    assert bound.slowest_long == 29.0
    assert bound.see(6, 41.0, long_until=8)[0] == 145.0  # the next build: 5 x 29 s
    assert bound.see(8, 42.0, long_until=8)[0] == 290.0  # over at once (42 - 40 = 2 s): the slowest stays 29 s
    assert bound.see(8, 43.0, long_until=10)[0] == 145.0
    assert bound.see(10, 113.0, long_until=10)[0] == 300.0  # 71 s: both bounds at the ceiling from now on
    assert bound.see(10, 114.0, long_until=12) == (300.0, "5 x its slowest long step so far (a model built, a file "
                                                          "fetched: 71.0 s), at most MOP_SHARD_STALL_SECONDS")


def test_a_long_step_announced_and_over_between_two_reads_counts_a_read_apart():
    bound = StallBound(300.0, floor=60.0)
    for second in range(4):
        bound.see(second, float(second))
    bound.see(6, 4.0, long_until=5)  # announced at count 3 after the read at 3 s, over by 4 s
    assert bound.slowest_long == 1.0 and bound.see(6, 5.0, long_until=8)[0] == 120.0


def test_progress_announces_a_long_step_until_two_ticks_more():
    progress.long_step()
    start = progress.count()
    assert progress.long_until() == start + 2
    progress.tick()
    progress.tick()
    assert progress.count() >= progress.long_until()


def test_the_defaults_are_a_long_start_and_a_minute_once_steps_are_quick():
    assert (STALL_SECONDS, STALL_FLOOR_SECONDS, STALL_MULTIPLE) == (300.0, 60.0, 10.0)


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _after(began, *steps):
    """A count read by the clock: ``steps`` are (until, count at ``until``, moves a second) in seconds since
    ``began``; after the last, the count stands still."""

    def count():
        elapsed, value = time.monotonic() - began, 0
        for until, at, rate in steps:
            if elapsed < until:
                return int(at - (until - elapsed) * rate)
            value = at
        return value

    return count


def test_the_watchdog_kills_a_stalled_process_within_the_learned_bound_and_spares_slow_and_long_steps(capfd):
    began = time.monotonic()
    targets = {name: _sleeper() for name in ("stalled", "slow", "long", "silent", "compiling")}
    moving = (4.0, 400, 100)  # a hundred batches a second for 4 s
    learn = dict(floor=0.5, multiple=3.0, long_until=lambda: 0)
    dogs = {
        # quick steps, then none: killed after 3 x ~1 s (the count is read once a second), not the 60 s ceiling
        "stalled": Watchdog(60.0, count=_after(began, moving), target=targets["stalled"].pid, **learn),
        # a step every 2.5 s: the bound is 3 x 2 s or more, and it never stands still that long
        "slow": Watchdog(60.0, count=lambda: int((time.monotonic() - began) / 2.5), target=targets["slow"].pid,
                         **learn),
        # quick steps, then a model built for 5 s (announced at count 400), then quick steps again: spared
        "long": Watchdog(60.0, count=_after(began, moving, (9.0, 400, 0), (60.0, 5500, 100)),
                         target=targets["long"].pid, floor=0.5, multiple=3.0,
                         long_until=lambda: 402 if time.monotonic() - began >= 4.0 else 0),
        # no step at all: killed only after the bound before the first step
        "silent": Watchdog(4.0, count=lambda: 5, target=targets["silent"].pid, **learn),
        # one tick at 2 s, then its first step compiles (no second tick): still the long bound
        "compiling": Watchdog(4.0, count=_after(began, (2.0, 0, 0), (60.0, 1, 0)), target=targets["compiling"].pid,
                              **learn),
    }
    died: dict[str, float] = {}
    try:
        while time.monotonic() - began < 45 and (len(died) < 3 or time.monotonic() - began < 11):
            for name, target in targets.items():  # past the long step, and two bounds more
                if name not in died and target.poll() is not None:
                    died[name] = time.monotonic() - began
            time.sleep(0.05)
    finally:
        for dog in dogs.values():
            dog.stop()
        for target in targets.values():
            target.kill()
            target.wait()
    assert all(dog.process.poll() is not None for dog in dogs.values())  # they end with the pipe
    assert set(died) == {"stalled", "silent", "compiling"}, died
    assert 4.0 < died["stalled"] < 45  # its steps stopped at 4 s; the learned bound, not the 60 s ceiling
    assert died["silent"] >= 4.0 and died["compiling"] >= 6.0, died  # never before the long bound
    assert {targets[name].returncode for name in died} == {-9}
    err = capfd.readouterr().err
    assert f"no progress in process {targets['stalled'].pid} for " in err and "(3 x its slowest step so far" in err
    assert f"no progress in process {targets['silent'].pid} for 4 s (the bound before a first step" in err
    assert f"process {targets['slow'].pid} " not in err and f"process {targets['long'].pid} " not in err


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_floor_fails_with_the_fix(value, monkeypatch):
    from mop_airflow.slots.watchdog import stall_floor_seconds, stall_seconds

    env = {"MOP_SHARD_STALL_FLOOR_SECONDS": value}
    with pytest.raises(ValueError, match=r"MOP_SHARD_STALL_FLOOR_SECONDS='.*': must be a number of seconds >= 0 "
                                         r"\(the least stall bound once steps are seen.*Fix: set "
                                         r"MOP_SHARD_STALL_FLOOR_SECONDS=60 or unset it"):
        stall_floor_seconds(env)
    with pytest.raises(ValueError, match="MOP_SHARD_STALL_FLOOR_SECONDS"):
        stall_seconds(env)  # the task checks it before it trains
    assert stall_seconds({**env, "MOP_SHARD_STALL_SECONDS": "0"}) == 0.0  # no watchdog: nothing to check
    assert stall_floor_seconds({}) == 60.0 and stall_floor_seconds({"MOP_SHARD_STALL_FLOOR_SECONDS": "300"}) == 300.0
