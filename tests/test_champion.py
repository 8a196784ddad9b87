"""Champion and challenger: the decision rule, the registry, and three real runs of one DAG.

The runs: a weak first winner becomes the first champion; a clearly better winner replaces it
(both evaluated on the run's validation data) and its Asset event carries the metadata; a weak
winner again leaves the champion, the publish task is skipped and no event is emitted.
"""

import math

import pytest

from mop_airflow.serving.champion import (asset_extra, better, champion_asset_uri, current_champion, incompatible, publish,
                                  read_registry, registry_uri, republish)
from mop_airflow.errors import SpecError, StoreError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import Manifest, ShardEntry
from mop_airflow.store import Store
from mop_airflow.serving.warm_start import resolve_warm_start


@pytest.mark.parametrize("challenger, champion, direction, margin, expected", [
    (0.91, 0.90, "max", 0.0, True),
    (0.90, 0.90, "max", 0.0, False),     # a tie keeps the champion
    (0.905, 0.90, "max", 0.01, False),   # better, but by less than the margin
    (0.92, 0.90, "max", 0.01, True),
    (0.30, 0.35, "min", 0.0, True),      # a loss: lower is better
    (0.35, 0.30, "min", 0.0, False),
    (0.34, 0.35, "min", 0.02, False),
    (math.nan, 0.5, "max", 0.0, False),  # a challenger without a finite metric never wins
    (0.5, math.nan, "max", 0.0, True),
])
def test_a_challenger_must_beat_the_champion_by_more_than_the_margin(challenger, champion, direction, margin,
                                                                     expected):
    assert better(challenger, champion, direction, margin) is expected


def entry(run_id, value, config_id="c000-aaaaaa", model_uri="file:///m.keras"):
    return {"dag_id": "dag", "run_id": run_id, "config_id": config_id, "metric": "val_accuracy", "direction": "max",
            "value": value, "model_uri": model_uri, "report_uri": f"file:///{run_id}/report/",
            "data_fingerprint": "fp", "configuration": {"config_id": config_id}}


def test_the_registry_keeps_every_champion_in_order_and_a_retried_publish_adds_nothing(tmp_path):
    store = Store(f"file://{tmp_path}")
    assert read_registry(store, "dag") == [] and current_champion(store, "dag") is None
    first = publish(store, "dag", entry("r1", 0.8), reason="first")
    again = publish(store, "dag", entry("r1", 0.8), reason="first, retried")
    second = publish(store, "dag", entry("r2", 0.9), reason="better")
    assert (first["version"], again["version"], second["version"]) == (1, 1, 2)
    history = read_registry(store, "dag")
    assert [(e["version"], e["run_id"], e["reason"], e["published_by"]) for e in history] == [
        (1, "r1", "first", "run"), (2, "r2", "better", "run")]
    assert current_champion(store, "dag")["run_id"] == "r2"
    assert registry_uri(store, "dag") == f"file://{tmp_path}/dag/registry.json"
    extra = asset_extra(second)
    assert {k: extra[k] for k in ("run_id", "config_id", "version", "metric", "value", "data_fingerprint")} == {
        "run_id": "r2", "config_id": "c000-aaaaaa", "version": 2, "metric": "val_accuracy", "value": 0.9,
        "data_fingerprint": "fp"}
    assert champion_asset_uri("dag") == "mop://dag/champion"


def test_a_rollback_re_publishes_an_earlier_entry_as_a_new_one(tmp_path):
    store = Store(f"file://{tmp_path}")
    model = f"file://{tmp_path}/m.keras"
    store.write_bytes(model, b"model")
    publish(store, "dag", entry("r1", 0.8, model_uri=model), reason="first")
    publish(store, "dag", entry("r2", 0.9, model_uri=f"file://{tmp_path}/gone.keras"), reason="better")
    back = republish(store, "dag", "1")
    assert (back["version"], back["run_id"], back["published_by"]) == (3, "r1", "cli")
    assert back["reason"] == "re-published version 1 by hand, replacing version 2"
    assert current_champion(store, "dag")["run_id"] == "r1"
    with pytest.raises(SpecError, match=r"version='7'.*is not a version in dag's registry \(1, 2, 3\)"):
        republish(store, "dag", "7")
    with pytest.raises(StoreError, match="gone.keras.*is no longer in the store"):
        republish(store, "dag", "2")
    assert len(read_registry(store, "dag")) == 3  # a refused rollback changes nothing
    assert republish(store, "dag", "r1")["version"] == 3  # already the champion: nothing appended
    assert len(read_registry(store, "dag")) == 3


def manifest(**changes):
    values = {"fingerprint": "fp", "source": "s", "features": ["a", "b"], "label": "y", "classes": [0, 1], "seed": 1,
              "schema": {}, "shards": [], "validation": ShardEntry(index=-1, uri="u", rows=1, bytes=1, sha256="x"),
              "total_rows": 1, "created_at": "now", "inputs": [{"name": "features", "columns": ["a", "b"]}]}
    return Manifest(**{**values, **changes})


def test_a_champion_trained_on_other_inputs_or_classes_cannot_be_evaluated():
    assert incompatible(manifest(), manifest(fingerprint="other", total_rows=9)) is None  # new rows are fine
    assert "other classes ([0, 1], this run's: [0, 1, 2])" in incompatible(manifest(), manifest(classes=[0, 1, 2]))
    assert "other inputs" in incompatible(manifest(), manifest(inputs=[{"name": "features", "columns": ["a"]}]))


def test_warm_start_from_the_champion_starts_from_its_run(tmp_path):
    from tests.test_warm_start import NEW, earlier_run

    store = Store(f"file://{tmp_path}")
    earlier_run(store, "old", "2026-01-01T00:00:00", ["c003-dddddd", "c001-bbbbbb", "c000-aaaaaa", "c002-cccccc"])
    earlier_run(store, "newer", "2026-02-01T00:00:00", ["c001-bbbbbb", "c000-aaaaaa", "c002-cccccc", "c003-dddddd"])
    spec = {"from": "champion", "select": "matching", "k": 3, "dag_id": None}
    assert resolve_warm_start(store, "dag", "this", NEW, spec) == {}  # no champion yet: a fresh start
    publish(store, "dag", entry("old", 0.8), reason="first")  # the champion is the older run, not the latest
    warm = resolve_warm_start(store, "dag", "this", NEW, spec)
    assert {w["run_id"] for w in warm.values()} == {"old"} and sorted(warm) == ["c000-aaaaaa", "c002-cccccc"]


def asset_events(uri):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                               .where(AssetModel.uri == uri).order_by(AssetEvent.id)).all()
        return [(e.source_run_id, dict(e.extra)) for e in rows]


@pytest.mark.integration
def test_only_a_better_winner_is_published_and_its_asset_event_carries_the_metadata(airflow_db, tmp_path):
    from tests.conftest import write_dag_file
    from tests.test_end_to_end import tiny_spec, write_digits

    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    spec = tiny_spec(source, root, iterations=1)
    spec["search"]["space"]["params"]["learning_rate"] = [1e-4]
    spec["publish"] = {"margin": 0.02}
    dag = write_dag_file("mop_champion", spec)
    assert dag.get_task("publish").upstream_task_ids == {"report"}
    assert [o.uri for o in dag.get_task("publish").outlets] == ["mop://mop_champion/champion"]
    store = Store(root)

    def states(run):
        return {ti.task_id: ti.state for ti in run.get_task_instances() if ti.task_id in ("report", "publish")}

    def challenge(run):
        return store.read_json(RunLayout(store, "mop_champion", run.run_id).report_uri("challenge.json"))

    weak = dag.test()  # a learning rate too small to learn much in one iteration
    assert weak.state == "success" and states(weak) == {"report": "success", "publish": "success"}
    first = challenge(weak)
    assert first["publish"] is True and first["reason"].startswith("first champion of mop_champion: ")
    (v1,) = read_registry(store, "mop_champion")
    assert v1["run_id"] == weak.run_id and v1["version"] == 1

    strong = dag.test(run_conf={"learning_rate": [1e-2]})
    assert strong.state == "success" and states(strong) == {"report": "success", "publish": "success"}
    second = challenge(strong)
    # the champion was evaluated again here, on this run's validation data (the same rows: the same value)
    assert second["champion"]["run_id"] == weak.run_id
    assert second["champion"]["value"] == pytest.approx(v1["value"], abs=1e-6)
    assert second["challenger"]["value"] > second["champion"]["value"] + 0.02
    assert second["publish"] is True and "more than the margin 0.02" in second["reason"]
    board = store.read_json(RunLayout(store, "mop_champion", strong.run_id).report_uri("leaderboard.json"))
    assert second["challenger"]["value"] == pytest.approx(board["leaderboard"][0]["val_accuracy"], abs=1e-6)
    v2 = current_champion(store, "mop_champion")
    assert (v2["version"], v2["run_id"], v2["value"]) == (2, strong.run_id, second["challenger"]["value"])

    again = dag.test(run_conf={"learning_rate": [1e-4]})
    assert again.state == "success" and states(again) == {"report": "success", "publish": "skipped"}
    third = challenge(again)
    assert third["publish"] is False and third["reason"].endswith("the champion stays")
    assert "not better" in third["reason"] and third["champion"]["version"] == 2
    summary = store.read_json(RunLayout(store, "mop_champion", again.run_id).report_uri("summary.json"))
    assert summary["challenge"]["reason"] == third["reason"]
    assert len(read_registry(store, "mop_champion")) == 2

    # The champion's run again over the same data trains the very same weights: nothing to evaluate.
    repeat = dag.test(run_conf={"learning_rate": [1e-2]})
    assert repeat.state == "success" and states(repeat) == {"report": "success", "publish": "skipped"}
    fourth = challenge(repeat)
    assert fourth["publish"] is False and fourth["gain"] == 0.0
    assert f"has the very weights of the champion (version 2, {v2['config_id']} of run {strong.run_id}" in \
        fourth["reason"] and fourth["reason"].endswith("a tie; the champion stays")
    assert v2["checkpoint_sha256"] == store.read_json(
        RunLayout(store, "mop_champion", repeat.run_id).report_uri("summary.json"))["best_checkpoint_sha256"]
    assert len(read_registry(store, "mop_champion")) == 2

    events = asset_events("mop://mop_champion/champion")
    assert [run_id for run_id, _ in events] == [weak.run_id, strong.run_id]  # none for the run that lost
    extra = events[-1][1]
    assert extra == asset_extra(v2)
    assert extra["model_uri"].endswith("/report/best_model.keras") and store.exists(extra["model_uri"])
    assert extra["configuration"]["optimizer_params"]["learning_rate"] == 1e-2
    assert extra["data_fingerprint"] == store.read_json(
        RunLayout(store, "mop_champion", strong.run_id).manifest_pointer_uri)["fingerprint"]
