"""A hop's TensorFlow thread count: 1 by default on every worker, so results never depend on the
executor; ``"auto"`` shares the worker's cores only when a spec asks for it. No TensorFlow needed."""

from __future__ import annotations

import pytest

from mop_airflow.config import ScheduleSpec
from mop_airflow.errors import SpecError
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.training import session as session_module
from mop_airflow.training.session import HOPS_PER_WORKER_ENV, TaskSession, threads_for


@pytest.mark.parametrize("cores", [1, 2, 8, 64])
@pytest.mark.parametrize("env", [{}, {HOPS_PER_WORKER_ENV: "1"}, {HOPS_PER_WORKER_ENV: "4"},
                                 {HOPS_PER_WORKER_ENV: ""}])
@pytest.mark.parametrize("slots", [1, 2])
def test_the_default_is_one_thread_whatever_the_worker(cores, env, slots):
    default = ScheduleSpec(slots_per_shard=slots).threads_per_hop
    assert default == 1
    assert threads_for(default, slots, cores=cores, env=env) == 1


def test_auto_still_shares_the_worker_cores():
    assert threads_for("auto", 1, cores=2, env={}) == 2  # a Celery worker of concurrency 1 on 2 cores
    assert threads_for("auto", 2, cores=8, env={}) == 4  # else the shard's slots share the cores
    assert threads_for("auto", 1, cores=8, env={HOPS_PER_WORKER_ENV: "4"}) == 2  # the deployment says
    assert threads_for("auto", 1, cores=2, env={HOPS_PER_WORKER_ENV: "2"}) == 1  # the embedded Airflow
    assert threads_for("auto", 1, cores=2, env={HOPS_PER_WORKER_ENV: "8"}) == 1  # never below one
    assert threads_for(3, 1, cores=2, env={HOPS_PER_WORKER_ENV: "2"}) == 3  # a number is kept as it is


def _run(schedule: dict) -> TaskSession:
    params = {"model": ["mop_airflow.examples.mnist1d_models:mlp"], "learning_rate": [1e-3]}
    spec = {"data": {"source": "/data/train.parquet", "label": "y", "features": "x*", "classes": [0, 1]},
            "search": {"space": {"method": "grid", "params": params}},
            "schedule": {"shards": 2, "iterations": 1, **schedule}}
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    return TaskSession(run, manifest=None, cache_dir="/nonexistent")  # type: ignore[arg-type]  # not read


@pytest.mark.parametrize("schedule, expected", [({}, 1), ({"threads_per_hop": "auto"}, 2),
                                                ({"threads_per_hop": 2}, 2)])
def test_a_task_session_asks_the_backend_for_the_recorded_threads(monkeypatch, schedule, expected):
    """The run record keeps the resolved schedule (1 when the spec says nothing), and the task's
    backend gets that many threads on a 2-core worker of concurrency 1 (the issue's Celery case)."""
    asked = []
    monkeypatch.setattr(session_module, "apply_threads", lambda n: asked.append(n) or n)
    monkeypatch.setattr(session_module, "compilation_cache", lambda *a, **k: None)
    monkeypatch.setattr(session_module.os, "cpu_count", lambda: 2)
    monkeypatch.delenv(HOPS_PER_WORKER_ENV, raising=False)
    task = _run(schedule)
    assert task.run.spec["schedule"]["threads_per_hop"] == schedule.get("threads_per_hop", 1)
    assert task.start_backend() == expected and asked == [expected]


@pytest.mark.parametrize("value", [0, -2, "fast", 1.5, True, None])
def test_a_bad_thread_count_names_the_field_the_rule_and_the_choices(value):
    with pytest.raises(SpecError) as info:
        ScheduleSpec(threads_per_hop=value)
    message = str(info.value)
    assert message.startswith(f"schedule.threads_per_hop={value!r}")
    assert 'must be "auto" or an integer >= 1' in message
    assert "Fix: leave schedule.threads_per_hop out (1 thread" in message and '"auto"' in message
