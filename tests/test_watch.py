"""Following a run survives an Airflow API that fails now and then, and still fails fast on a wrong call.

A busy Airflow on SQLite answered a poll of a 256-configuration run with 500 ("Database error") while the
run went on; the watch raised and the demo's caller lost a run that succeeded. Here the API's answers are
scripted (the polls are what is tested, not Airflow), each a run state or an error.
"""

from __future__ import annotations

import io

import pytest

from mop_airflow.errors import AirflowApiError
from mop_airflow.monitor import watch as watch_module
from mop_airflow.monitor.run_status import RunRef


def _follow(monkeypatch, answers, **kwargs):
    """Watch a run whose polls answer ``answers`` in turn; the lines printed and each poll's answer used."""
    answers = list(answers)
    polled = []

    def find_run(api, dag_id, run_id, *, group=None, record=None):
        answer = answers.pop(0)
        polled.append(answer)
        if isinstance(answer, Exception):
            raise answer
        return RunRef(dag_id, "run_1", answer, None)

    monkeypatch.setattr(watch_module, "find_run", find_run)
    monkeypatch.setattr(watch_module, "snapshot", lambda api, ref, store_root=None: None)
    out = io.StringIO()
    ref = watch_module.watch(None, "mop_demo", None, interval=0.01, out=out, live=False, **kwargs)
    return ref, out.getvalue().splitlines(), polled, answers


def _server_error():
    return AirflowApiError("Airflow REST API at http://127.0.0.1:8080: GET /dags/mop_demo/dagRuns -> 500: "
                           '{"detail":{"reason":"Database error"}}', status=500)


def test_a_run_followed_through_server_errors_ends_in_its_own_state(monkeypatch):
    ref, lines, polled, left = _follow(
        monkeypatch, ["running", _server_error(), _server_error(), "running", "success", "never asked"])
    assert ref.state == "success" and left == ["never asked"] and len(polled) == 5
    retries = [line for line in lines if line.startswith("polling again in")]
    assert len(retries) == 2 and all("-> 500" in line and "giving up after 120 s" in line for line in retries)
    assert lines[0] == "running: resolving the run (preflight)" and lines[-1] == "success: resolving the run (preflight)"


def test_no_answer_at_all_is_tried_again_too(monkeypatch):
    unreachable = AirflowApiError("Airflow REST API at http://127.0.0.1:8080: GET /dags -> connection refused")
    ref, lines, _, _ = _follow(monkeypatch, ["running", unreachable, "failed"])
    assert ref.state == "failed" and sum(line.startswith("polling again") for line in lines) == 1


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_refusal_or_a_missing_run_is_raised_at_once(monkeypatch, status):
    refused = AirflowApiError(f"... -> {status}", status=status)
    with pytest.raises(AirflowApiError) as raised:
        _follow(monkeypatch, ["running", refused, "success"])
    assert raised.value.status == status


def test_a_first_poll_that_fails_is_the_callers_error(monkeypatch):
    """A wrong address or a server that is not up yet: nothing was seen, so nothing is waited for."""
    with pytest.raises(AirflowApiError):
        _follow(monkeypatch, [_server_error(), "success"])


def test_errors_past_the_patience_raise_the_last_one(monkeypatch):
    with pytest.raises(AirflowApiError) as raised:
        _follow(monkeypatch, ["running"] + [_server_error() for _ in range(200)], patience=0.05)
    assert raised.value.status == 500


def test_a_single_look_does_not_wait_out_an_error(monkeypatch):
    with pytest.raises(AirflowApiError):
        _follow(monkeypatch, [_server_error()], follow=False)
