"""Warm start: which configurations start from an earlier run's checkpoints, and that they continue.

The matching rules on hand-made run folders (no TensorFlow); then two real runs of a tiny DAG: the
second starts from the first and its first iteration's training loss is below a cold start's.
"""

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import HopRecord
from mop_airflow.store import Store
from mop_airflow.serving.warm_start import resolve_warm_start


def cfg(cid, model="m:mlp", lr=0.01, units=32):
    return {"config_id": cid, "model": model, "optimizer": "adam", "optimizer_params": {"learning_rate": lr},
            "hparams": {"units": units}, "batch_size": 32}


OLD = [cfg("c000-aaaaaa", lr=0.01), cfg("c001-bbbbbb", lr=0.001), cfg("c002-cccccc", model="m:cnn"),
       cfg("c003-dddddd", units=64)]


def earlier_run(store, run_id, written_at, ranking, failed=()):
    layout = RunLayout(store, "dag", run_id)
    store.write_json(layout.run_record_uri, {"dag_id": "dag", "run_id": run_id, "configs": OLD})
    store.write_json(layout.report_uri("leaderboard.json"), {"leaderboard": [
        {"config_id": cid, "status": "failed" if cid in failed else "finished"} for cid in ranking]})
    store.write_json(layout.report_uri("summary.json"), {"dag_id": "dag", "run_id": run_id,
                                                         "report_written_at": written_at})
    for c in OLD:
        for t in (2, 3):
            uri = layout.checkpoint_uri(c["config_id"], t)
            store.write_bytes(uri, b"state")
            HopRecord(config_id=c["config_id"], t=t, iteration=1, hop=t - 2, shard=0, checkpoint=uri,
                      checkpoint_sha256=f"sha-{t}").write(store, layout.hop_record_uri(c["config_id"], t))
    return layout


@pytest.fixture()
def store(tmp_path):
    store = Store(f"file://{tmp_path}")
    earlier_run(store, "old", "2026-01-01T00:00:00", ["c003-dddddd", "c001-bbbbbb", "c000-aaaaaa", "c002-cccccc"])
    earlier_run(store, "newer", "2026-02-01T00:00:00", ["c001-bbbbbb", "c000-aaaaaa", "c002-cccccc", "c003-dddddd"],
                failed={"c003-dddddd"})
    return store


NEW = [cfg("c000-aaaaaa", lr=0.01), cfg("c001-xxxxxx", lr=0.0003), cfg("c002-cccccc", model="m:cnn"),
       cfg("c003-yyyyyy", units=128)]


def test_the_winner_lends_its_weights_to_every_configuration_of_its_architecture(store):
    warm = resolve_warm_start(store, "dag", "this", NEW, {"from": "latest", "select": "winner", "k": 3,
                                                         "dag_id": None})
    # latest = "newer", whose winner c001 is an mlp of 32 units: c000 and c001 of the new run share that
    assert sorted(warm) == ["c000-aaaaaa", "c001-xxxxxx"]
    assert {w["run_id"] for w in warm.values()} == {"newer"}
    assert {w["config_id"] for w in warm.values()} == {"c001-bbbbbb"}
    assert warm["c001-xxxxxx"]["t"] == 3 and warm["c001-xxxxxx"]["checkpoint_sha256"] == "sha-3"
    # another learning rate: weights only, a fresh optimizer
    assert warm["c000-aaaaaa"]["optimizer"] is False and warm["c001-xxxxxx"]["optimizer"] is False


def test_top_k_gives_each_configuration_its_best_ranked_match_and_skips_failed_ones(store):
    warm = resolve_warm_start(store, "dag", "this", NEW, {"from": "newer", "select": "top_k", "k": 4,
                                                         "dag_id": None})
    assert {cid: w["config_id"] for cid, w in warm.items()} == {
        "c000-aaaaaa": "c001-bbbbbb", "c001-xxxxxx": "c001-bbbbbb", "c002-cccccc": "c002-cccccc"}
    assert warm["c002-cccccc"]["optimizer"] is True  # the same settings: the optimizer state comes along


def test_matching_pairs_configurations_of_the_same_content_only(store):
    warm = resolve_warm_start(store, "dag", "this", NEW, {"from": "old", "select": "matching", "k": 3,
                                                         "dag_id": None})
    assert {cid: (w["run_id"], w["config_id"], w["optimizer"]) for cid, w in warm.items()} == {
        "c000-aaaaaa": ("old", "c000-aaaaaa", True), "c002-cccccc": ("old", "c002-cccccc", True)}


def test_a_first_run_starts_fresh_and_a_named_run_without_a_report_is_an_error(tmp_path, store):
    empty = Store(f"file://{tmp_path / 'empty'}")
    assert resolve_warm_start(empty, "dag", "this", NEW, {"from": "latest", "select": "winner", "k": 3,
                                                         "dag_id": None}) == {}
    with pytest.raises(SpecError, match="search.warm_start.from='gone'.*has no report"):
        resolve_warm_start(store, "dag", "this", NEW, {"from": "gone", "select": "winner", "k": 3, "dag_id": None})


def test_a_configuration_whose_checkpoints_are_gone_starts_fresh(store):
    layout = RunLayout(store, "dag", "newer")
    for t in (2, 3):
        store.delete_tree(layout.checkpoint_uri("c001-bbbbbb", t))
    warm = resolve_warm_start(store, "dag", "this", NEW, {"from": "latest", "select": "winner", "k": 3,
                                                         "dag_id": None})
    assert warm == {}


@pytest.mark.integration
def test_a_warm_started_run_continues_training_and_the_report_says_from_where(airflow_db, tmp_path):
    from tests.conftest import write_dag_file
    from tests.test_end_to_end import tiny_spec, write_digits

    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    spec = tiny_spec(source, root, iterations=1)
    spec["search"]["space"]["params"]["learning_rate"] = [3e-3, 1e-2]
    dag = write_dag_file("mop_warm", spec)
    cold = dag.test()
    assert cold.state == "success"
    # the same DAG, triggered again with a warm start from its latest run, and a third configuration
    conf = {"search": {"warm_start": {"from": "latest", "select": "matching"},
                       "space": {**spec["search"]["space"], "params": {**spec["search"]["space"]["params"],
                                                                        "learning_rate": [3e-3, 1e-2, 3e-4]}}}}
    warm = dag.test(run_conf=conf)
    assert warm.state == "success"

    store = Store(root)
    cold_layout, warm_layout = RunLayout(store, "mop_warm", cold.run_id), RunLayout(store, "mop_warm", warm.run_id)
    summary = store.read_json(warm_layout.report_uri("summary.json"))
    started = summary["warm_start"]
    assert len(started) == 2 and {w["run_id"] for w in started.values()} == {cold.run_id}
    board = {row["config_id"]: row for row in store.read_json(warm_layout.report_uri("leaderboard.json"))["leaderboard"]}
    fresh = [cid for cid, row in board.items() if row["warm_start"] is None]
    assert len(fresh) == 1 and board[fresh[0]]["learning_rate"] == 3e-4
    for cid, source_run in started.items():
        assert board[cid]["warm_start"] == f"{cold.run_id}/{cid}"
        first_warm = HopRecord.read(store, warm_layout.hop_record_uri(cid, 0)).train_metrics["loss"]
        first_cold = HopRecord.read(store, cold_layout.hop_record_uri(cid, 0)).train_metrics["loss"]
        last_cold = HopRecord.read(store, cold_layout.hop_record_uri(cid, 1)).train_metrics["loss"]
        # it goes on from where the cold run ended, not from random weights
        assert first_warm < first_cold and first_warm < 1.5 * last_cold, (cid, first_warm, first_cold, last_cold)
