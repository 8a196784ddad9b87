"""`mop-airflow champion list / publish`, `predict --champion`, the predict operator's champion and the
challenge line of `mop-airflow report`, on registries built from a real reported run.

The run is test_predict_cli's tiny digits run (made once here with dag.test()); every test starts
from a registry it writes itself. The champion Asset event is checked against a real Airflow
api-server reading the test session's metadata database, where dag.test() registered the DAG and
its champion Asset.
"""

import os
import signal
import subprocess
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from mop_airflow.serving.champion import champion_asset_uri, publish, read_registry, registry_uri, run_entry
from mop_airflow.cli.main import OK, UNAVAILABLE, USAGE, main
from tests.test_predict_cli import _expected, run  # noqa: F401 - the module-scoped tiny run

pytestmark = pytest.mark.integration

DAG = "mop_predict_cli"


def _closed_port() -> int:
    from mop_airflow.deployment.local import free_port

    return free_port()  # bound then released: nothing listens on it


@pytest.fixture
def registry(run):  # noqa: F811 - the imported fixture
    """The run's registry reset to one entry, version 1, published by the run."""
    tmp, source, layout = run
    store = layout.store
    if store.exists(registry_uri(store, DAG)):
        os.remove(store.local_path(registry_uri(store, DAG)))
    publish(store, DAG, run_entry(layout), reason="first champion")
    return tmp, source, layout


def _cli(tmp, *args):
    return main([*args, "--store", str(tmp / "store")])


def _gone_entry(layout):
    """An entry whose model has left the store (its run was cleaned up)."""
    return {**run_entry(layout), "run_id": "manual__gone", "model_uri": layout.store.uri("gone", "best_model.keras")}


def test_list_prints_the_history_and_marks_the_champion(registry, capsys):
    tmp, _, layout = registry
    # a later run's winner (the same model file will do); publishing the champion again would add nothing
    publish(layout.store, DAG, {**run_entry(layout), "run_id": "manual__later"}, reason="second time, by hand",
            by="cli")
    assert _cli(tmp, "champion", "list", DAG) == OK
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"Champion registry of {DAG} (file://{tmp / 'store'}/{DAG}/registry.json)")
    header, first, second = lines[1], lines[2], lines[3]
    assert header.split()[:3] == ["version", "published_at", "(UTC)"] and header.rstrip().endswith("reason")
    entry = run_entry(layout)
    value = f"{entry['metric']}={entry['value']:.6g}"
    assert first.split()[0] == "1" and layout.run_id in first and entry["config_id"] in first
    assert value in first and " run " in first and first.endswith("first champion")
    assert second.startswith("* ") and second.split()[1] == "2" and " cli " in second
    assert second.endswith("second time, by hand")
    assert "manual__later" in second and layout.run_id not in second
    assert f"* current champion: version 2: {entry['config_id']} of run manual__later ({value})" in out
    assert f"model: {layout.report_uri('best_model.keras')}" in out

    assert _cli(tmp, "champion", "list", "mop_never_published") == OK
    assert "mop_never_published: no champion published yet" in capsys.readouterr().out


def test_publish_by_version_and_by_run_id_appends_an_entry(registry, capsys, monkeypatch):
    tmp, _, layout = registry
    store = layout.store
    later = {**run_entry(layout), "run_id": "manual__later"}  # a later run's winner (the same model file will do)
    publish(store, DAG, later, reason="a later run", by="cli")

    def no_airflow(args):
        raise AssertionError("--no-event must not ask Airflow")

    monkeypatch.setattr("mop_airflow.cli.runs.api", no_airflow)
    assert _cli(tmp, "champion", "publish", DAG, "1", "--no-event") == OK
    out = capsys.readouterr().out
    assert f"{DAG}: champion is now version 3: " in out and "no Asset event emitted (--no-event)" in out
    history = read_registry(store, DAG)
    assert len(history) == 3
    rolled = history[-1]
    assert {k: rolled[k] for k in ("run_id", "config_id", "model_uri", "value", "configuration")} == \
        {k: history[0][k] for k in ("run_id", "config_id", "model_uri", "value", "configuration")}
    assert rolled["published_by"] == "cli" and rolled["reason"] == "re-published version 1 by hand, replacing version 2"

    assert _cli(tmp, "champion", "publish", DAG, "manual__later", "--no-event") == OK
    history = read_registry(store, DAG)
    assert len(history) == 4 and history[-1]["run_id"] == "manual__later" and history[-1]["version"] == 4
    assert history[-1]["reason"] == "re-published run manual__later by hand, replacing version 3"
    assert f"version 4: {rolled['config_id']} of run manual__later" in capsys.readouterr().out

    # the champion itself again: nothing appended (re-running a rollback whose event failed is safe)
    assert _cli(tmp, "champion", "publish", DAG, "manual__later", "--no-event") == OK
    assert len(read_registry(store, DAG)) == 4 and "champion is now version 4" in capsys.readouterr().out


def test_publish_refuses_what_cannot_serve(registry, capsys):
    tmp, _, layout = registry
    store = layout.store
    assert _cli(tmp, "champion", "publish", DAG, "7", "--no-event") == USAGE
    err = capsys.readouterr().err
    assert f"version='7': is not a version in {DAG}'s registry (1)" in err
    assert "Fix: pick one from `mop-airflow champion list`" in err

    assert _cli(tmp, "champion", "publish", DAG, "manual__no_such_run", "--no-event") == UNAVAILABLE
    assert "run manual__no_such_run of mop_predict_cli has no report" in capsys.readouterr().err

    publish(store, DAG, _gone_entry(layout), reason="a run since cleaned up", by="cli")
    for which in ("2", "manual__gone"):
        assert _cli(tmp, "champion", "publish", DAG, which, "--no-event") == UNAVAILABLE
        err = capsys.readouterr().err
        assert f"({store.uri('gone', 'best_model.keras')}) is no longer in the store" in err
    assert len(read_registry(store, DAG)) == 2  # nothing appended


def test_publish_with_airflow_unreachable_still_updates_the_registry(registry, capsys):
    tmp, _, layout = registry
    publish(layout.store, DAG, {**run_entry(layout), "run_id": "manual__later"}, reason="a later run", by="cli")
    port = _closed_port()
    assert _cli(tmp, "champion", "publish", DAG, "1", "--api-url", f"http://127.0.0.1:{port}") == UNAVAILABLE
    captured = capsys.readouterr()
    assert f"{DAG}: champion is now version 3" in captured.out
    assert "the registry was updated (version 3 is the champion), but the Asset event on " \
           f"{champion_asset_uri(DAG)} was not emitted" in captured.err
    assert f"127.0.0.1:{port}" in captured.err and "--no-event" in captured.err
    assert [e["version"] for e in read_registry(layout.store, DAG)] == [1, 2, 3]


def test_predict_with_the_champion_writes_what_its_run_id_writes(registry, capsys):
    tmp, source, layout = registry
    args = ["predict", DAG, "--source", str(source), "--mode", "prob"]
    assert _cli(tmp, *args, "--champion", "--out", str(tmp / "champion.parquet")) == OK
    out = capsys.readouterr().out
    assert f"champion of {DAG}: version 1, " in out and f"of {DAG} / {layout.run_id}" in out
    assert _cli(tmp, *args[:2], layout.run_id, *args[2:], "--out", str(tmp / "by_id.parquet")) == OK
    assert pq.read_table(tmp / "champion.parquet").equals(pq.read_table(tmp / "by_id.parquet"))

    assert _cli(tmp, *args[:2], layout.run_id, *args[2:], "--champion", "--out", str(tmp / "x.parquet")) == USAGE
    assert f"RUN_ID={layout.run_id!r}: cannot be combined with --champion" in capsys.readouterr().err
    assert _cli(tmp, *args, "--champion", "--config", "c000", "--out", str(tmp / "x.parquet")) == USAGE
    assert "--config='c000': cannot be combined with --champion" in capsys.readouterr().err
    assert _cli(tmp, "predict", "mop_never_published", "--champion", "--source", str(source),
                "--out", str(tmp / "x.parquet")) == UNAVAILABLE
    assert "DAG 'mop_never_published' has no champion in the store" in capsys.readouterr().err
    assert not (tmp / "x.parquet").exists()

    assert _cli(tmp, "export-best", DAG, "--champion", "--out", str(tmp / "serving")) == OK
    assert (tmp / "serving" / "best_model.keras").read_bytes() == \
        layout.store.read_bytes(layout.report_uri("best_model.keras"))


def test_predict_operator_scores_with_the_champion(registry, session_dir):
    import importlib.util

    tmp, source, layout = registry
    path = session_dir / "dags" / "mop_predict_champion.py"
    out = tmp / "operator_champion.parquet"
    path.write_text(
        "import pendulum\nfrom airflow.sdk import DAG\nfrom mop_airflow.operators.predict import MopPredictOperator\n"
        "with DAG('mop_predict_champion', schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:\n"
        f"    MopPredictOperator(task_id='score', source={str(source)!r}, out={str(out)!r}, mode='prob',\n"
        f"                       model_dag_id={DAG!r}, model_run_id='champion',\n"
        f"                       store={{'root': {layout.store.root!r}}})\n")
    spec = importlib.util.spec_from_file_location("dagfile_mop_predict_champion", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dag.test().state == "success"
    _, expected = _expected(tmp, source, layout)
    table = pq.read_table(out)
    np.testing.assert_allclose(np.stack([table[f"prob_{c}"].to_numpy() for c in range(10)], 1), expected,
                               rtol=1e-5, atol=1e-6)


# -- against a real Airflow api-server ----------------------------------------------------------
@pytest.fixture(scope="module")
def api_server(run, session_dir, tmp_path_factory):  # noqa: F811
    """Airflow's api-server alone (no scheduler), on the session's metadata database, where dag.test()
    of the run registered the DAG, its run and its champion Asset."""
    import httpx

    from mop_airflow.deployment.local import _bin, airflow_env, free_port

    home = session_dir / "airflow"
    port = free_port()
    env = airflow_env(home, session_dir / "dags", port,
                      {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
                       "AIRFLOW__API__WORKERS": "1", "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"})
    log = open(tmp_path_factory.mktemp("api_server") / "api-server.log", "wb")
    proc = subprocess.Popen([_bin("airflow"), "api-server", "--port", str(port)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 150
        while True:
            assert proc.poll() is None, f"the api-server exited; see {log.name}"
            assert time.time() < deadline, f"the api-server did not answer in time; see {log.name}"
            try:
                if httpx.get(f"{url}/api/v2/monitor/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_publish_emits_the_champion_asset_event(registry, api_server, capsys):
    from mop_airflow.hooks.rest import AirflowAPI

    tmp, _, layout = registry
    uri = champion_asset_uri(DAG)
    with AirflowAPI(api_server) as api:
        asset = next(a for a in api.paged("/assets", "assets", uri_pattern=uri) if a["uri"] == uri)
        before = api.get("/assets/events", asset_id=asset["id"], limit=100)["total_entries"]
        publish(layout.store, DAG, {**run_entry(layout), "run_id": "manual__later"}, reason="a later run", by="cli")
        assert _cli(tmp, "champion", "publish", DAG, "1", "--api-url", api_server) == OK
        assert f"emitted on {uri}" in capsys.readouterr().out
        events = api.get("/assets/events", asset_id=asset["id"], order_by="-timestamp", limit=1)
    assert events["total_entries"] == before + 1
    extra = events["asset_events"][0]["extra"]
    entry = read_registry(layout.store, DAG)[-1]
    assert extra["version"] == entry["version"] == 3 and extra["run_id"] == layout.run_id
    assert extra["model_uri"] == entry["model_uri"] and extra["config_id"] == entry["config_id"]

    # a registry whose DAG Airflow never parsed: updated, and the fix says so
    other = "mop_not_deployed"
    publish(layout.store, other, {**run_entry(layout), "dag_id": other}, reason="copied", by="cli")
    assert _cli(tmp, "champion", "publish", other, "1", "--api-url", api_server) == UNAVAILABLE
    err = capsys.readouterr().err
    assert f"knows no Asset {champion_asset_uri(other)}" in err and f"deploy DAG {other}" in err
    assert len(read_registry(layout.store, other)) == 1  # version 1 was the champion already: nothing appended


def test_report_prints_the_challenge_decision(registry, api_server, capsys):
    tmp, _, layout = registry
    summary = layout.store.read_json(layout.report_uri("summary.json"))
    assert "challenge" in summary, "the report task of this checkout takes no champion decision"
    assert main(["report", DAG, layout.run_id, "--api-url", api_server, "--store", str(tmp / "store"),
                 "--out", str(tmp / "report")]) == OK
    out = capsys.readouterr().out
    decision = summary["challenge"]
    said = "published" if decision["publish"] else "not published"
    assert f"\nChampion: {said}: {decision['reason']}" in out
    assert out.index("Leaderboard") < out.index("Champion:")
