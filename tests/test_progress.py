"""Progress of a run from its records: hand-computable counts, best, time left or the task waiting for a
worker (no Airflow)."""

import dataclasses

from mop_airflow.results.progress import format_seconds, progress_of
from mop_airflow.records import HopRecord, Plan

PLAN = Plan(shards=2, iterations=2, seed=0, priority="hops_left", model_hops_total=12,
            classes=[["a", "b"], ["c"]])  # 3 configurations x 2 iterations x 2 shards


def hop(config_id, t, started, acc=None, status="ok"):
    iteration, h = divmod(t, 2)
    return HopRecord(config_id=config_id, t=t, iteration=iteration, hop=h, shard=h, status=status,
                     started_at=started, saved_at=None if started is None else started + 10,
                     val_metrics=None if acc is None else {"val_accuracy": acc, "val_loss": 1 - acc})


def test_hops_best_and_time_left_from_hop_records():
    records = [hop("a", 0, 100.0), hop("a", 1, 110.0, acc=0.6), hop("b", 0, 100.0), hop("b", 1, 112.0, acc=0.7)]
    p = progress_of(PLAN, records, {}, "val_accuracy", "max", busy={0: ["c"]}, now=140.0)
    assert (p.hops_done, p.hops_total, p.iteration, p.iterations) == (4, 12, 1, 2)
    assert (p.best, p.best_config) == (0.7, "b")
    # 4 hops in 40 s since the first started: 8 left take about 80 s
    assert p.elapsed == 40.0 and p.eta == 80.0
    assert p.shard_line() == "shard 0: c  shard 1: idle"
    assert p.summary_line() == ("model hops 4/12, iteration 1/2, best val_accuracy 0.7000 (b), about 1 min 20 s left")
    low = progress_of(PLAN, records, {}, "val_loss", "min", now=140.0)
    assert (round(low.best, 6), low.best_config) == (0.3, "b")


def test_a_failed_configuration_settles_the_hops_it_will_never_run():
    records = [hop("a", 0, 100.0), hop("a", 1, 110.0, acc=0.6)]
    failed = {"b": hop("b", 1, None, status="failed")}  # b failed at its hop 1: hops 1, 2, 3 never run
    p = progress_of(PLAN, records, failed, "val_accuracy", "max", now=120.0)
    assert p.hops_done == 2 + 3 and p.failed == ("b",)
    assert "1 configuration(s) failed" in p.summary_line()


def test_a_finished_run_has_nothing_left_and_no_nan_best():
    records = [hop(c, t, 100.0 + t, acc=float("nan") if c == "c" else 0.5) for c in "abc" for t in range(4)]
    p = progress_of(PLAN, records, {}, "val_accuracy", "max", now=200.0)
    assert p.hops_done == p.hops_total == 12 and p.fraction == 1.0 and p.eta == 0.0
    assert p.best_config == "a" and p.iteration == 2


def test_best_so_far_ranks_each_configuration_by_its_latest_evaluation_as_the_leaderboard_does():
    records = [hop("a", 1, 100.0, acc=0.9), hop("a", 3, 120.0, acc=0.7), hop("b", 1, 100.0, acc=0.8),
               hop("b", 3, 121.0, acc=0.75)]
    p = progress_of(PLAN, records, {}, "val_accuracy", "max", now=130.0)
    assert (p.best, p.best_config) == (0.75, "b")


def test_format_seconds():
    assert [format_seconds(s) for s in (5, 65, 3725)] == ["5 s", "1 min 05 s", "1 h 02 min"]


def test_the_terminal_view_shows_a_bar_each_shard_and_the_best():
    import io

    from rich.console import Console

    from mop_airflow.monitor.run_status import RunRef
    from mop_airflow.monitor.watch import _renderable

    records = [hop("a", 0, 100.0), hop("a", 1, 110.0, acc=0.6), hop("b", 0, 100.0)]
    progress = progress_of(PLAN, records, {}, "val_accuracy", "max", busy={1: ["c001", "c002"]}, now=130.0)
    screen = io.StringIO()
    Console(file=screen, width=100, color_system=None).print(_renderable(RunRef("d", "r1", "running", None), progress))
    text = screen.getvalue()
    assert "d / r1: running" in text
    assert "3/12 model hops (25%)" in text and "about 1 min 30 s left" in text
    assert "━" in text  # the bar
    assert "shard 0  idle" in text and "shard 1  busy: c001, c002" in text
    assert "iteration 1/2; best val_accuracy: 0.6000 (a)" in text


def test_a_task_no_worker_started_is_named_with_since_when_instead_of_the_time_left():
    import datetime as dt

    from mop_airflow.monitor.run_status import RunRef, waiting_of
    from mop_airflow.results.progress import Waiting

    queued_at = dt.datetime(2026, 11, 26, 14, 40, 53, tzinfo=dt.timezone.utc)
    now = queued_at.timestamp() + 32

    def ti(task_id, state="queued", seconds=0.0, queue="mop_shard_1"):
        return {"task_id": task_id, "state": state, "queue": queue,
                "queued_when": (queued_at + dt.timedelta(seconds=seconds)).isoformat()}

    listed = [ti("train_shard_2", seconds=10), ti("train_shard_1"), ti("report", seconds=20, queue="default"),
              ti("train_shard_3", state="running"), ti("other.train_shard_0")]
    # queued longer than 15 s, longest first; 12 s is an ordinary hand-off; the other group's is not this run's
    assert waiting_of(listed, RunRef("d", "r1", "running", None, "g"), now) == ()
    waiting = waiting_of(listed, RunRef("d", "r1", "running", None), now)
    assert [w.task_id for w in waiting] == ["train_shard_1", "other.train_shard_0", "train_shard_2"]
    assert waiting[0] == Waiting("train_shard_1", "mop_shard_1", queued_at.timestamp())

    records = [hop("a", 0, 100.0), hop("a", 1, 110.0, acc=0.6), hop("b", 0, 100.0)]
    progress = progress_of(PLAN, records, {}, "val_accuracy", "max", now=130.0)
    assert "about 1 min 30 s left" in progress.summary_line()
    stalled = dataclasses.replace(progress, waiting=waiting[:1])
    line = "train_shard_1 waiting for a worker on queue mop_shard_1 since 14:40:53 UTC"
    assert waiting[0].line(now) == f"{line} (32 s)"
    assert f"; {line} (" in stalled.summary_line() and "left" not in stalled.summary_line()
    assert stalled.summary_line(eta=False).endswith(f"; {line}")  # the line printed into a pipe is new once


def test_the_terminal_view_shows_the_waiting_task_instead_of_the_time_left():
    import io

    from rich.console import Console

    from mop_airflow.monitor.run_status import RunRef
    from mop_airflow.monitor.watch import _renderable
    from mop_airflow.results.progress import Waiting

    records = [hop("a", 0, 100.0), hop("a", 1, 110.0, acc=0.6), hop("b", 0, 100.0)]
    progress = progress_of(PLAN, records, {}, "val_accuracy", "max", now=130.0)
    stalled = dataclasses.replace(progress, waiting=(Waiting("train_shard_1", "mop_shard_1", 0.0),))
    screen = io.StringIO()
    Console(file=screen, width=200, color_system=None).print(_renderable(RunRef("d", "r1", "running", None), stalled))
    text = screen.getvalue()
    assert "train_shard_1 waiting for a worker on queue mop_shard_1 since 00:00:00 UTC" in text
    assert "left" not in text
