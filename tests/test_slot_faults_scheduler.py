"""A shard slot's faults cost seconds, on a real Airflow (api-server, scheduler, dag-processor).

Sleepy models (0.15 s a batch, about 3.5 s a hop) on 2 shards:

- shard 1 slot 1's train task SIGKILLed after its first hop (2 slots a shard): its retry trains the
  rest, the run ends within 60 s of an undisturbed run's time with no reschedule, and the same
  leaderboard;
- the same task stopped (SIGSTOP) after its first hop, at the default settings: its watchdog kills it
  after the bound it learned from the steps it saw (10 x the slowest, at least 60 s; not the 300 s
  bound before a first step), Airflow retries it, and the run ends within 3 minutes of the undisturbed one, with the
  same leaderboard;
- a slot stopped (SIGSTOP) while it builds a model, in a grid of eight architectures whose builds take
  8 s in a train slot: its watchdog kills it after the bound it learned from the builds it saw (5 x the slowest, at least
  120 s; not the 300 s ceiling), and the run ends within 3 minutes of its undisturbed run;
- shard 1's pool held by another DAG for longer than the wait bound (20 s here): shard 0's slot is
  retried, never failed for good, keeping its hops, and the run succeeds;
- shard 0's pool held the same way: shard 1's slot gives its pool slot back and is rescheduled
  (``AirflowRescheduleException``) until shard 0 starts, without a failed try;
- on 3 shards, shard 2's pool closed for ever once its stage task ran (its train task never starts), in
  a grid and in ASHA: the run ends failed within the stated bound, the slots' failures naming shard 2,
  its pool and queue, and shard 2's train task failed by them so that nothing waits for it; and where
  shard 2 holds only a configuration's last hop, which no slot waits for: the slots done wait for it
  before they end (slot_sim seed 24973's kind: they ended done, and the run waited for ever).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mop_airflow.planning.task_plan import shard_pool
from mop_airflow.records import SlotStatus
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import airflow_part
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLEEPY = "mop_airflow.examples.timed_models:sleepy"
UNDISTURBED, KILLED, STOPPED = "mop_slots_undisturbed", "mop_slots_killed", "mop_slots_stopped"
LATE, YIELDING = "mop_slots_late_peer", "mop_slots_yielding"
NEVER_GRID, NEVER_ASHA = "mop_slots_never_grid", "mop_slots_never_asha"
NEVER_LAST = "mop_slots_never_last"  # one configuration: shard 2 holds its last hop, which no slot waits for
BUILDS = "mop_slots_builds"  # eight architectures, a build of 8 s each: a slot builds a model at most hops
# A builder that says, by a file named after its process, while it builds (the test stops a slot then).
SLOW_BUILDS = """
import os, pathlib, time

from mop_airflow.examples.timed_models import sleepy

BUILDING = pathlib.Path({folder!r})


def slow_build(hparams):
    if not os.environ.get("AIRFLOW_CTX_TASK_ID", "").startswith("train_"):
        return sleepy(hparams)  # check_models builds each at once
    mark = BUILDING / f"building_{{os.getpid()}}"
    mark.write_text(str(hparams.get("units")))
    time.sleep(BUILD_S)
    model = sleepy(hparams)
    mark.unlink()
    return model
"""
BUILD_S = 8.0  # a train slot's build
STOP_INTO_BUILD_S = 6.5  # past a status write (every 5 s), which tells the watchdog a long step is in progress
# small bounds, so a slot that never starts ends the run in a minute or two (600 s and 30 s by default)
NEVER_ENV = {"MOP_SHARD_WAIT_SECONDS": "15", "MOP_SHARD_YIELD_SECONDS": "8"}
NEVER_RETRIES, NEVER_RETRY_DELAY = 1, 2
HOLDERS = ("hold_mop_shard_0", "hold_mop_shard_1")  # each holds its shard's pool
HOLD_AT_MOST_S = 300  # a holder holds until the test has seen what it waits for (see _held_during), or this long


def _spec(root, *, slots):
    spec = tiny_spec(root / "digits.parquet", f"file://{root / 'store'}", iterations=1, slots_per_shard=slots)
    params = spec["search"]["space"]["params"]
    params.update(model=[SLEEPY], learning_rate=[1e-3, 3e-3, 1e-2, 3e-2])
    params["hparams"] = {"units": [32], "seconds_per_batch": [0.15]}  # 3.5 s a hop: time to stop one mid-block
    return spec


def _mop_dag(part, dag_id, spec, env=None, retries=2):
    # The task process parses its DAG file before it runs: an environment set here reaches its slot only.
    part.write_dag(
        dag_id, "import datetime, json, os\nfrom mop_airflow import build_mop_dag\n"
        f"os.environ.update({dict(env or {})!r})\n"
        f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={dag_id!r},\n"
        f"    default_args={{'retries': {retries}, 'retry_delay': datetime.timedelta(seconds=2),"
        " 'retry_exponential_backoff': 0})\n")


def _holder(part, dag_id, pool):
    """A DAG whose one task holds both slots of ``pool`` until :func:`_release` has written its file, or for
    ``HOLD_AT_MOST_S`` at most: another DAG's long task."""
    part.write_dag(
        dag_id, "import os, time\nfrom airflow.sdk import dag, task\n"
        f"@dag(dag_id={dag_id!r}, schedule=None)\ndef hold():\n"
        f"    @task(pool={pool!r}, pool_slots=2, priority_weight=1000000, weight_rule='absolute')\n    def sleep():\n"
        f"        deadline = time.time() + {HOLD_AT_MOST_S}\n"
        f"        while time.time() < deadline and not os.path.exists({str(_release(part.root, dag_id))!r}):\n"
        "            time.sleep(0.5)\n"
        "    sleep()\nhold()\n")


def _release(root, holder):
    """The file that ends ``holder``'s hold."""
    return root / f"release_{holder}"


@pytest.fixture(scope="module")
def airflow(shared_airflow, tmp_path_factory):
    root = tmp_path_factory.mktemp("slots")
    write_digits(root / "digits.parquet")
    builders = root / "builders"
    builders.mkdir()
    (builders / "slow_builds.py").write_text(SLOW_BUILDS.format(folder=str(root)) + f"BUILD_S = {BUILD_S}\n")
    with airflow_part(shared_airflow, root, "slot_faults", paths=[builders]) as af:
        two = _spec(root, slots=2)
        for dag_id in (UNDISTURBED, KILLED):
            _mop_dag(af, dag_id, two)
        _mop_dag(af, STOPPED, two)  # the default stall bounds
        one = _spec(root, slots=1)
        _mop_dag(af, LATE, one, {"MOP_SHARD_WAIT_SECONDS": "20"}, retries=4)
        _mop_dag(af, YIELDING, one, {"MOP_SHARD_YIELD_SECONDS": "8"})
        built = _spec(root, slots=2)
        params = built["search"]["space"]["params"]
        params.update(model=["slow_builds:slow_build"], learning_rate=[1e-2])
        params["hparams"] = {"units": [8, 16, 24, 32, 40, 48, 56, 64], "seconds_per_batch": [0.05]}
        _mop_dag(af, BUILDS, built)  # the default stall bounds
        _holder(af, HOLDERS[0], shard_pool(0))
        _holder(af, HOLDERS[1], shard_pool(1))
        three = _spec(root, slots=1)
        three["schedule"]["shards"] = 3
        _mop_dag(af, NEVER_GRID, three, NEVER_ENV, retries=NEVER_RETRIES)
        from tests.test_asha_runs import asha_spec

        asha = asha_spec(root / "digits.parquet", f"file://{root / 'store'}")
        asha["schedule"]["shards"] = 3
        _mop_dag(af, NEVER_ASHA, asha, NEVER_ENV, retries=NEVER_RETRIES)
        last = _spec(root, slots=1)
        last["schedule"]["shards"] = 3
        last["search"]["space"]["params"]["learning_rate"] = [1e-3]
        _mop_dag(af, NEVER_LAST, last, NEVER_ENV, retries=NEVER_RETRIES)
        for dag_id in (UNDISTURBED, KILLED, STOPPED, BUILDS, LATE, YIELDING, *HOLDERS, NEVER_GRID, NEVER_ASHA,
                       NEVER_LAST):
            af.wait_for_dag(dag_id)
        sync = subprocess.run([sys.executable, "-m", "mop_airflow.cli.main", "pools", "sync", "--shards", "2",
                               "--slots", "2"], env=af.env, capture_output=True, text=True)
        assert sync.returncode == 0, sync.stderr
        af.root = root
        af.store = Store(f"file://{root / 'store'}")
        yield af


def _run(af, dag_id, *, during=None, timeout=420):
    """Trigger ``dag_id``, call ``during(run_id)`` while it runs, and return (run id, seconds it took)."""
    run_id = af.trigger(dag_id)
    if during is not None:
        during(run_id)
    assert af.wait_for_run(dag_id, run_id, timeout=timeout) == "success", _failures(af, dag_id, run_id)
    run = af.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
    took = dt.datetime.fromisoformat(run["end_date"]) - dt.datetime.fromisoformat(run["start_date"])
    return run_id, took.total_seconds()


def _failures(af, dag_id, run_id):
    return [(ti["task_id"], ti["state"], ti["try_number"]) for ti in af.task_instances(dag_id, run_id)]


def _board(af, dag_id, run_id):
    layout = RunLayout(af.store, dag_id, run_id)
    return [(r["config_id"], r["val_accuracy"], r["val_loss"])
            for r in af.store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]]


def _tries(af, dag_id, run_id):
    return {ti["task_id"]: ti["try_number"] for ti in af.task_instances(dag_id, run_id)
            if ti["task_id"].startswith("train_shard_")}


def _reschedules(af, dag_id, run_id):
    """The task reschedules of a run, from the metadata database (the REST API does not list them)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(af.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    try:
        with engine.connect() as db:
            rows = db.execute(sqlalchemy.text(
                "SELECT ti.task_id FROM task_reschedule tr JOIN task_instance ti ON tr.ti_id = ti.id "
                "WHERE ti.dag_id = :dag_id AND ti.run_id = :run_id"), {"dag_id": dag_id, "run_id": run_id}).fetchall()
    finally:
        engine.dispose()
    return sorted(task_id for (task_id,) in rows)


class Stopped:
    """Processes SIGSTOPped by a test (:meth:`stop`), SIGKILLed when it leaves (``with``) if each is still the
    process it stopped: a hung slot's watchdog kills it long before the run ends, and by then its pid may
    be another process's (a task of the run, a service of the shared Airflow, the other test worker)."""

    def __init__(self):
        self.stopped: list[tuple[int, str]] = []

    @staticmethod
    def _started(pid: int) -> str | None:
        try:  # the process's start time (field 22 of /proc/<pid>/stat, after the parenthesised name)
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        except (OSError, IndexError):
            return None

    @property
    def pids(self) -> list[int]:
        return [pid for pid, _ in self.stopped]

    def stop(self, pid: int) -> None:
        self.stopped.append((pid, self._started(pid)))
        os.kill(pid, signal.SIGSTOP)  # every thread of it stops: heartbeats and all

    def __enter__(self) -> "Stopped":
        return self

    def __exit__(self, *exc) -> None:
        for pid, started in self.stopped:
            if started is not None and self._started(pid) == started:
                os.kill(pid, signal.SIGKILL)


def _slot_pid(af, dag_id, run_id, shard, slot, *, timeout=240):
    """The pid of the slot's task process once it has committed a hop (its first commit marker is
    there) and has more to train (its status says running, and which process it is)."""
    layout = RunLayout(af.store, dag_id, run_id)
    deadline = time.time() + timeout
    while time.time() < deadline:
        for block in af.store.glob(f"{layout.run_uri}/slots/*"):
            marks = af.store.names_after(f"{block}/commits/shard_{shard:02d}_slot_{slot}")
            status = af.store.read_if_there(f"{block}/shard_{shard:02d}_slot_{slot}.json")
            if marks and status is not None:
                status = SlotStatus.from_dict(json.loads(status))
                assert status.state == "running", f"shard {shard} slot {slot} ended before it could be stopped"
                return status.pid
        time.sleep(0.05)
    raise TimeoutError(f"shard {shard} slot {slot} of {dag_id} did not commit a hop in {timeout} s")


@pytest.fixture(scope="module")
def undisturbed(airflow):
    run_id, took = _run(airflow, UNDISTURBED)
    assert _tries(airflow, UNDISTURBED, run_id) == {f"train_shard_{s}_slot_{k}": 1 for s in (0, 1) for k in (0, 1)}
    return _board(airflow, UNDISTURBED, run_id), took


def test_a_train_task_killed_mid_block_costs_seconds_and_changes_nothing(airflow, undisturbed):
    board, baseline = undisturbed
    run_id, took = _run(airflow, KILLED, during=lambda run_id: os.kill(_slot_pid(airflow, KILLED, run_id, 1, 1),
                                                                       signal.SIGKILL))
    tries = _tries(airflow, KILLED, run_id)
    assert tries.pop("train_shard_1_slot_1") == 2 and set(tries.values()) == {1}
    assert _reschedules(airflow, KILLED, run_id) == []  # no slot gave its pool slot back for it
    assert _board(airflow, KILLED, run_id) == board
    assert took <= baseline + 60, (took, baseline)
    print(f"killed: {took:.1f} s against {baseline:.1f} s undisturbed")


def test_a_hung_train_task_is_killed_by_its_watchdog_and_retried(airflow, undisturbed):
    board, baseline = undisturbed
    with Stopped() as stopped:  # never leaves a stopped process behind, whatever happens
        run_id, took = _run(airflow, STOPPED, during=lambda run_id: stopped.stop(_slot_pid(airflow, STOPPED, run_id, 1, 1)))
    tries = _tries(airflow, STOPPED, run_id)
    assert tries.pop("train_shard_1_slot_1") == 2 and set(tries.values()) == {1}
    assert _board(airflow, STOPPED, run_id) == board
    # killed after the bound learned from its steps (its first hop's), not the 300 s before a first step
    log = airflow.task_log(STOPPED, run_id, "train_shard_1_slot_1", 1)
    assert f"no progress in process {stopped.pids[0]} for " in log and "(10 x its slowest step so far" in log, log[-3000:]
    assert took <= baseline + 180, (took, baseline)
    killed = log[log.index("no progress in process"):].split("killing it")[0]
    print(f"stopped: {took:.1f} s against {baseline:.1f} s undisturbed; {killed}")


def _stop_in_a_build(airflow, stopped, run_id, shard=1, slot=1, timeout=240):
    """SIGSTOP the slot's task process while it builds a model, after its first commit (its watchdog has
    seen a build to its end by then: the first, in the slot's start)."""
    pid = _slot_pid(airflow, BUILDS, run_id, shard, slot)
    mark = airflow.root / f"building_{pid}"
    deadline = time.time() + timeout
    while not mark.exists():
        assert time.time() < deadline, f"shard {shard} slot {slot} built no model after its first commit"
        time.sleep(0.02)
    time.sleep(STOP_INTO_BUILD_S)
    assert mark.exists(), "the build ended before the slot could be stopped in it"
    stopped.stop(pid)


def test_a_slot_hung_while_it_builds_a_model_costs_at_most_three_minutes(airflow):
    """Issue 70: the watchdog of a slot hung in a model build waited the 300 s ceiling (+316 s over the clean
    run); it now learns the long steps' bound from the builds it saw, as it learns the steps' bound."""
    _, baseline = _run(airflow, BUILDS)
    with Stopped() as stopped:
        run_id, took = _run(airflow, BUILDS, during=lambda run_id: _stop_in_a_build(airflow, stopped, run_id))
    tries = _tries(airflow, BUILDS, run_id)
    assert tries.pop("train_shard_1_slot_1") == 2 and set(tries.values()) == {1}
    log = airflow.task_log(BUILDS, run_id, "train_shard_1_slot_1", 1)
    assert f"no progress in process {stopped.pids[0]} for " in log and "slowest long step so far" in log, log[-3000:]
    assert took <= baseline + 180, (took, baseline)
    killed = log[log.index("no progress in process"):].split("killing it")[0]
    print(f"stopped in a build: {took:.1f} s against {baseline:.1f} s undisturbed; {killed}")


def _held_during(airflow, dag_id, shard, until):
    """Run ``dag_id`` with shard ``shard``'s holder DAG holding its pool (both slots) from the end of the
    run's stage task of that shard, before that shard's train task can start, until ``until(run_id)`` is
    true; returns the run's id and seconds. The holder's run must succeed too.

    The hold ends on what it is for, not after fixed seconds: a hold of 60 s ended, in a whole run on two
    busy cores, before shard 0's slot had waited its 20 s for shard 1 (its train task started late), and
    the late peer was never waited for.

    Every train task waits for every stage task, so once ``stage`` runs, nothing of this run asks for
    ``pool`` until the stage ends. The pool is closed (0 slots) while the holder is triggered and until
    the scheduler has it waiting for the pool; opened again, the pool goes to the holder first (its
    priority is higher) however long the holder's run took to be created: triggering alone raced the
    stage's end on a busy machine, and the train task sometimes started first."""
    stage, pool, holder = f"stage_shard_{shard}", shard_pool(shard), HOLDERS[shard]
    held = []

    def resize(slots):  # Airflow validates the whole pool, though the mask changes its slots alone
        airflow.api("PATCH", f"/pools/{pool}", json={"pool": pool, "slots": slots, "include_deferred": False},
                    params={"update_mask": "slots"})

    def states(run_id):
        return {ti["task_id"]: ti["state"] for ti in airflow.task_instances(dag_id, run_id)}

    def hold(run_id):
        deadline = time.time() + 240
        # "success" too: a stage of a cached shard can begin and end between two looks on a busy
        # machine (CI waited the whole 240 s for a "running" it had missed)
        while time.time() < deadline and states(run_id).get(stage) not in ("running", "success"):
            time.sleep(0.2)
        assert time.time() < deadline, f"{stage} of {dag_id} never ran"
        resize(0)
        # closed in time: no train task of this run had taken a slot of the pool yet
        train = {t: s for t, s in states(run_id).items() if t.startswith(f"train_shard_{shard}")}
        assert all(s in (None, "scheduled") for s in train.values()), (f"{pool} closed too late", train)
        try:
            held.append(airflow.trigger(holder))
            while time.time() < deadline and not any(ti["state"] == "scheduled"
                                                     for ti in airflow.task_instances(holder, held[0])):
                time.sleep(0.2)
            assert time.time() < deadline, f"{holder} never waited for {pool}"
        finally:
            resize(2)
        deadline = time.time() + HOLD_AT_MOST_S
        while time.time() < deadline and not until(run_id):
            time.sleep(1)
        _release(airflow.root, holder).touch()

    run_id, took = _run(airflow, dag_id, during=hold)
    assert airflow.wait_for_run(holder, held[0], timeout=180) == "success"
    return run_id, took


def test_a_late_peer_is_waited_for_and_never_fails_the_block_for_good(airflow):
    # held until shard 0's slot has given up waiting for shard 1 once: its train task is retried
    run_id, took = _held_during(airflow, LATE, 1, until=lambda run_id: any(
        ti["task_id"] == "train_shard_0" and (ti["try_number"] >= 2 or ti["state"] == "up_for_retry")
        for ti in airflow.task_instances(LATE, run_id)))
    tries = _tries(airflow, LATE, run_id)
    assert tries["train_shard_1"] == 1 and tries["train_shard_0"] >= 2, tries  # retried while shard 1 was late
    log = airflow.task_log(LATE, run_id, "train_shard_0", 1)
    # named as a slot that has not started, with its pool and queue (issue 70), and retried: it may be late
    assert "shard 1 slot 0 has not started" in log and "pool mop_shard_1" in log, log[-3000:]
    assert "Airflow retries this task" in log
    hops = [airflow.store.read_json(u) for u in airflow.store.glob(RunLayout(airflow.store, LATE, run_id).hops_glob)]
    # shard 0's first try committed its first hops; no later try trained them again
    assert sorted(h["try_number"] for h in hops if h["shard"] == 0 and h["t"] == 0) == [1, 1]
    assert len(hops) == 8 and all(h["status"] == "ok" for h in hops)
    print(f"late peer: {took:.1f} s, shard 0 in {tries['train_shard_0']} tries")


def test_a_slot_whose_earlier_slot_waits_for_its_pool_is_rescheduled_without_a_try(airflow):
    # held until shard 1's slot, waiting for shard 0's, has given its pool slot back once
    run_id, took = _held_during(airflow, YIELDING, 0,
                                until=lambda run_id: "train_shard_1" in _reschedules(airflow, YIELDING, run_id))
    assert _tries(airflow, YIELDING, run_id) == {"train_shard_0": 1, "train_shard_1": 1}
    rescheduled = _reschedules(airflow, YIELDING, run_id)
    assert "train_shard_1" in rescheduled and "train_shard_0" not in rescheduled  # the first slot never yields
    print(f"yielding: {took:.1f} s, {len(rescheduled)} reschedule(s)")


def _never_bound(wait, give_back, retries, retry_delay):
    """The stated bound (docs/what-happens-when.md): from a slot's pool closing for good to the run's end,
    a slot ranked after it yields for ``give_back`` + ``wait`` at most (and a reschedule, 20 s), then every try
    of the slots waiting for it waits ``wait`` and is retried after ``retry_delay``; the last fails for good."""
    return give_back + wait + 20 + (retries + 1) * (wait + retry_delay)


AIRFLOW_SLACK_S = 120  # tasks started and ended by a scheduler on two busy cores, and the run's last tasks


def _closed_for_ever(airflow, dag_id, shard):
    """Trigger ``dag_id`` and close shard ``shard``'s pool (0 slots) once its stage task ran, before its
    train task can start: that task never starts (as with no worker on its queue). Returns the run's id
    and when the pool closed."""
    stage, pool = f"stage_shard_{shard}", shard_pool(shard)
    run_id = airflow.trigger(dag_id)
    deadline = time.time() + 240

    def states():
        return {ti["task_id"]: ti["state"] for ti in airflow.task_instances(dag_id, run_id)}

    while time.time() < deadline and states().get(stage) not in ("running", "success"):
        time.sleep(0.2)
    assert time.time() < deadline, f"{stage} of {dag_id} never ran"
    airflow.pool_slots = airflow.api("GET", f"/pools/{pool}")["slots"]  # given back by _reopen
    airflow.api("PATCH", f"/pools/{pool}", json={"pool": pool, "slots": 0, "include_deferred": False},
                params={"update_mask": "slots"})
    closed = time.time()
    train = {t: s for t, s in states().items() if t.startswith(f"train_shard_{shard}")}
    assert all(s in (None, "scheduled") for s in train.values()), (f"{pool} closed too late", train)
    return run_id, closed


def _reopen(airflow, shard):
    """The pool as it was before :func:`_closed_for_ever`: the next test's stage tasks need it."""
    pool = shard_pool(shard)
    airflow.api("PATCH", f"/pools/{pool}", json={"pool": pool, "slots": getattr(airflow, "pool_slots", 1),
                                                 "include_deferred": False}, params={"update_mask": "slots"})


def _ended_naming_the_absent_shard(airflow, dag_id, run_id, closed):
    state = airflow.wait_for_run(dag_id, run_id, timeout=600)
    run = airflow.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
    took = dt.datetime.fromisoformat(run["end_date"]).timestamp() - closed
    tis = {ti["task_id"]: ti for ti in airflow.task_instances(dag_id, run_id)}
    assert state == "failed", [(t, ti["state"], ti["try_number"]) for t, ti in tis.items()]
    bound = _never_bound(15, 8, NEVER_RETRIES, NEVER_RETRY_DELAY)
    assert took <= bound + AIRFLOW_SLACK_S, (took, bound)
    # shard 2's task never ran: failed by the slot whose last try gave up waiting for it, with a note
    absent = tis["train_shard_2"]
    assert absent["state"] == "failed" and "never started" in (absent.get("note") or ""), absent
    assert "queue and pool mop_shard_2" in absent["note"]
    logs = {t: airflow.task_log(dag_id, run_id, t, tis[t]["try_number"]) for t in ("train_shard_0", "train_shard_1")
            if tis[t]["state"] == "failed"}
    named = [t for t, log in logs.items() if "shard 2 slot 0 has not started" in log and "queue mop_shard_2" in log
             and "pool mop_shard_2" in log]
    assert named, {t: log[-3000:] for t, log in logs.items()}
    assert any("never started (queue and pool mop_shard_2): failed now, so the run ends" in logs[t] for t in named)
    return took, bound


def test_a_grid_whose_third_shard_never_starts_ends_failed_within_the_bound_naming_it(airflow):
    try:
        run_id, closed = _closed_for_ever(airflow, NEVER_GRID, 2)
        took, bound = _ended_naming_the_absent_shard(airflow, NEVER_GRID, run_id, closed)
    finally:
        _reopen(airflow, 2)
    print(f"grid, shard 2 never started: failed {took:.0f} s after its pool closed (bound {bound} s + Airflow's)")


def test_asha_whose_third_shard_never_starts_ends_failed_within_the_bound_naming_it(airflow):
    try:
        run_id, closed = _closed_for_ever(airflow, NEVER_ASHA, 2)
        took, bound = _ended_naming_the_absent_shard(airflow, NEVER_ASHA, run_id, closed)
    finally:
        _reopen(airflow, 2)
    print(f"ASHA, shard 2 never started: failed {took:.0f} s after its pool closed (bound {bound} s + Airflow's)")


def test_a_grid_whose_never_started_shard_holds_only_last_hops_ends_failed_naming_it(airflow):
    """One configuration on 3 shards, one iteration: shard 2 holds its last hop, which no other slot waits
    for. Shards 0 and 1 train theirs, and before they end they wait for shard 2 to start; past the bound
    they fail for good naming it, and fail its task (before, both ended done and the run never ended)."""
    try:
        run_id, closed = _closed_for_ever(airflow, NEVER_LAST, 2)
        took, bound = _ended_naming_the_absent_shard(airflow, NEVER_LAST, run_id, closed)
    finally:
        _reopen(airflow, 2)
    print(f"one configuration, shard 2 never started: failed {took:.0f} s after its pool closed (bound {bound} s "
          "+ Airflow's)")

