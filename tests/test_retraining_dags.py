"""The retraining examples on a real Airflow (api-server, scheduler and dag-processor as processes).

New data lands: an event on the digits folder's Asset, posted through the REST API as an upload job
would, starts a ``mop_digits_retrain`` run (no one triggers it). Its winner is the first champion:
the publish task emits the champion Asset event, and that event — nothing else — starts a
``mop_digits_score`` run, which takes the run and configuration from the event's extra and scores
the digits folder with that very model. More data lands: the next retrain run starts from the
champion's weights and challenges it.

Unpausing the retrain DAG first creates the run of its latest nightly slot (the time half of its
schedule); the fixture checks that and marks it failed before it trains, so that the data events
drive what follows.

The two DAG files are copied from ``dags/`` into this file's DAG folder of the test worker's shared
Airflow, each setting this file's temporary ``MOP_HOME`` (the data, the store and the scores)
for the processes that parse it.
"""

import datetime as dt
import time
from pathlib import Path

import numpy as np
import pytest

from mop_airflow.serving.champion import asset_extra, champion_asset_uri, read_registry
from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import REPO, airflow_part

pytestmark = pytest.mark.integration

RETRAIN, SCORE = "mop_digits_retrain", "mop_digits_score"
RUN_TIMEOUT = 300  # a retrain run takes about a minute on two cores; a score run seconds


@pytest.fixture(scope="module")
def airflow(shared_airflow, tmp_path_factory):
    from mop_airflow.examples.sklearn_data import write_digits  # what `mop-airflow example-data` writes

    root = tmp_path_factory.mktemp("retraining")
    home = root / "mop"
    with airflow_part(shared_airflow, root, "retraining") as af:
        data = Path(write_digits(str(home / "data")))
        for dag_id in (RETRAIN, SCORE):  # as in dags/, with this file's MOP_HOME
            af.write_dag(dag_id, (REPO / "dags" / f"{dag_id}.py").read_text())
        for dag_id in (SCORE, RETRAIN):
            af.wait_for_dag(dag_id)
            af.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        af.home_dir, af.data, af.store = home, data, Store(f"file://{home / 'store'}")
        set_aside_the_nightly_catch_up_run(af)
        yield af


def set_aside_the_nightly_catch_up_run(af):
    """Unpausing the retrain DAG runs its latest nightly slot at once (catchup=False runs the latest
    one): the time half of its schedule works. The tests are about the data events, so that run is
    marked failed at once, as an operator would in the UI, before it trains; the next nightly run
    is tomorrow's."""
    now = dt.datetime.now(dt.timezone.utc)
    slot = now.replace(hour=3, minute=0, second=0, microsecond=0)
    slot -= dt.timedelta(days=1) if slot > now else dt.timedelta(0)
    nightly = wait_for_new_run(af, RETRAIN, set(), timeout=60)
    assert (nightly["run_type"], nightly["triggered_by"]) == ("scheduled", "timetable"), nightly
    assert dt.datetime.fromisoformat(nightly["run_after"].replace("Z", "+00:00")) == slot, nightly
    af.api("PATCH", f"/dags/{RETRAIN}/dagRuns/{nightly['dag_run_id']}", json={"state": "failed"})
    af.nightly_run_id = nightly["dag_run_id"]
    deadline = time.time() + 60  # its first task may be running: let it end
    while any(ti["state"] in ("running", "queued", "scheduled", "restarting", "deferred")
              for ti in af.task_instances(RETRAIN, nightly["dag_run_id"])):
        assert time.time() < deadline, failures(af, RETRAIN, nightly["dag_run_id"])
        time.sleep(2)


def asset_id(af, uri, timeout=60):
    """The id Airflow gave the Asset ``uri`` (registered when the DAG that uses it was parsed)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [a for a in af.rest.paged("/assets", "assets", uri_pattern=uri) if a["uri"] == uri]
        if found:
            return found[0]["id"]
        time.sleep(1)
    raise AssertionError(f"Airflow registered no Asset {uri} within {timeout}s; assets: "
                         f"{[a['uri'] for a in af.rest.paged('/assets', 'assets')]}")


def runs(af, dag_id):
    return list(af.rest.paged(f"/dags/{dag_id}/dagRuns", "dag_runs", order_by="run_after"))


def wait_for_new_run(af, dag_id, known, timeout=90):
    """The run of ``dag_id`` that is not in ``known`` (run ids), once the scheduler created it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        new = [r for r in runs(af, dag_id) if r["dag_run_id"] not in known]
        if new:
            assert len(new) == 1, f"expected one new run of {dag_id}, got {new}"
            return new[0]
        time.sleep(2)
    raise AssertionError(f"no new run of {dag_id} within {timeout}s (runs: {runs(af, dag_id)}); scheduler log:\n"
                         + scheduler_log(af))


def scheduler_log(af, chars=4000):
    path = af.home / "logs" / "scheduler.log"
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no scheduler log)"


def failures(af, dag_id, run_id):
    """Every task instance's state and the logs of those that did not succeed: the assertion message."""
    lines, logs = [], []
    for ti in af.task_instances(dag_id, run_id):
        lines.append(f"{ti['task_id']}[{ti['map_index']}] {ti['state']} (try {ti['try_number']})")
        if ti["state"] not in ("success", "skipped", "upstream_failed", None):
            try:
                log = af.task_log(dag_id, run_id, ti["task_id"], max(1, ti["try_number"]), ti["map_index"])
            except RuntimeError as exc:
                log = f"(no log: {exc})"
            logs.append(f"--- {ti['task_id']}[{ti['map_index']}] ---\n{log[-3000:]}")
    return "\n".join(lines + logs)


def finish(af, dag_id, run):
    run_id = run["dag_run_id"]
    state = af.wait_for_run(dag_id, run_id, timeout=RUN_TIMEOUT)
    assert state == "success", f"run {run_id} of {dag_id} ended {state}:\n{failures(af, dag_id, run_id)}"
    return {ti["task_id"]: ti for ti in af.task_instances(dag_id, run_id) if ti["map_index"] == -1}


def new_data_event(af, note):
    """What an upload job does when files land: an event on the data folder's Asset, through the REST API."""
    from mop_airflow.errors import AirflowApiError

    uri = "file://" + str(af.data)
    files = sorted(p.name for p in af.data.glob("*.parquet"))
    asset = asset_id(af, uri)
    for attempt in range(3):
        try:
            event = af.api("POST", "/assets/events", json={"asset_id": asset, "extra": {"files": files, "note": note}})
            break
        except AirflowApiError as exc:
            # SQLite has one writer: a request that waited out its lock fails with a database error
            # and wrote nothing; post again, unless the event is there after all.
            posted = [e for e in af.api("GET", "/assets/events", params={"asset_id": asset})["asset_events"]
                      if e["extra"].get("note") == note]
            if posted:
                event = posted[0]
                break
            if attempt == 2 or "Database error" not in str(exc):
                raise
            time.sleep(3)
    assert event["uri"] == uri and event["extra"]["note"] == note
    return event


def upstream_events(af, dag_id, run_id):
    """The Asset events that created the run. Asked once the run has started: this endpoint fails
    (500) while a run its events created has no start date yet."""
    return af.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/upstreamAssetEvents")["asset_events"]


@pytest.mark.slow
def test_new_data_retrains_and_the_new_champion_is_scored_by_the_deployment_dag(airflow):
    af = airflow
    assert [r["dag_run_id"] for r in runs(af, RETRAIN)] == [af.nightly_run_id] and runs(af, SCORE) == []
    event = new_data_event(af, "first batch")

    retrain = wait_for_new_run(af, RETRAIN, {af.nightly_run_id})
    assert retrain["run_type"] == "asset_triggered"
    tasks = finish(af, RETRAIN, retrain)
    assert tasks["publish"]["state"] == "success"
    consumed = upstream_events(af, RETRAIN, retrain["dag_run_id"])
    assert [e["id"] for e in consumed] == [event["id"]]  # the run is there because of the data event
    (entry,) = read_registry(af.store, RETRAIN)
    assert (entry["version"], entry["run_id"]) == (1, retrain["dag_run_id"])
    assert entry["reason"].startswith(f"first champion of {RETRAIN}")

    # the champion event, and only it, starts the deployment DAG
    score = wait_for_new_run(af, SCORE, set())
    assert score["run_type"] == "asset_triggered"
    tasks = finish(af, SCORE, score)
    assert tasks["score"]["state"] == "success"
    (handoff,) = upstream_events(af, SCORE, score["dag_run_id"])
    assert handoff["uri"] == champion_asset_uri(RETRAIN)
    assert handoff["source_dag_id"] == RETRAIN and handoff["source_run_id"] == retrain["dag_run_id"]
    assert handoff["source_task_id"] == "publish"
    assert handoff["extra"] == asset_extra(entry)
    log = af.task_log(SCORE, score["dag_run_id"], "score")
    assert f"of {RETRAIN} / {retrain['dag_run_id']}" in log and entry["config_id"] in log

    # one prediction per row of the batch, each the class the published model ranks first
    import keras
    import pyarrow.parquet as pq

    out = af.home_dir / "scores" / f"{score['dag_run_id']}.parquet"
    assert out.exists(), f"no predictions at {out}; scores: {list((af.home_dir / 'scores').glob('*'))}"
    predicted = pq.read_table(out)
    batch = [pq.read_table(path) for path in sorted(af.data.glob("part-*.parquet"))]
    pixels = np.concatenate([np.asarray(t["pixels"].to_pylist(), np.float32) for t in batch])
    assert predicted.num_rows == len(pixels) == 1797
    assert predicted["row_id"].to_pylist() == list(range(len(pixels)))
    model_path = af.home_dir / "model.keras"
    af.store.get_file(handoff["extra"]["model_uri"], str(model_path))
    model = keras.models.load_model(model_path, safe_mode=True)
    expected = np.argmax(model.predict(pixels.reshape(-1, 8, 8, 1), verbose=0), axis=1)
    response = np.asarray(predicted["response"].to_pylist())
    assert (response == expected).mean() == 1.0, f"{(response != expected).sum()} of {len(response)} rows differ"


def test_more_data_retrains_from_the_champions_weights(airflow):
    af = airflow
    (champion,) = read_registry(af.store, RETRAIN)
    known = {r["dag_run_id"] for r in runs(af, RETRAIN)}
    scored = {r["dag_run_id"] for r in runs(af, SCORE)}  # before: a new champion's score run starts at once
    new_data_event(af, "second batch")
    retrain = wait_for_new_run(af, RETRAIN, known)
    assert retrain["run_type"] == "asset_triggered"
    tasks = finish(af, RETRAIN, retrain)

    layout = RunLayout(af.store, RETRAIN, retrain["dag_run_id"])
    summary = af.store.read_json(layout.report_uri("summary.json"))
    # both configurations share the champion's model: both start from its winner's last checkpoint
    assert len(summary["warm_start"]) == 2
    assert {(w["run_id"], w["config_id"]) for w in summary["warm_start"].values()} == {
        (champion["run_id"], champion["config_id"])}
    challenge = summary["challenge"]
    assert challenge["champion"]["version"] == 1 and challenge["champion"]["run_id"] == champion["run_id"]
    # published only when better by more than the margin: then version 2, else the champion stays
    history = read_registry(af.store, RETRAIN)
    if challenge["publish"]:
        assert tasks["publish"]["state"] == "success" and history[-1]["run_id"] == retrain["dag_run_id"]
        assert len(history) == 2 and challenge["challenger"]["value"] > challenge["champion"]["value"] + 0.005
        # the new champion is deployed: the scoring DAG runs again, with version 2's hand-off
        score = wait_for_new_run(af, SCORE, scored)
        assert finish(af, SCORE, score)["score"]["state"] == "success"
        (handoff,) = upstream_events(af, SCORE, score["dag_run_id"])
        assert handoff["extra"] == asset_extra(history[-1]) and handoff["extra"]["version"] == 2
        assert (af.home_dir / "scores" / f"{score['dag_run_id']}.parquet").exists()
    else:  # the champion stays, no event: nothing is redeployed
        assert tasks["publish"]["state"] == "skipped" and history == [champion]
        assert challenge["reason"].endswith("the champion stays")
        time.sleep(10)
        assert {r["dag_run_id"] for r in runs(af, SCORE)} == scored
