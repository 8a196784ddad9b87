"""The results page's data, built from a run's folder in the store without Airflow or training.

Hop records are written by hand with round numbers, so progress, the provisional leaderboard, the
learning curves and the pool busy fractions can be checked against hand-computed values at each
stage of a run: resolved (nothing in the store), planned, training, failed, reported; and for
Hyperband, where each configuration was pruned.
"""

import json
import math
import subprocess
import sys

import pytest

from mop_airflow.records.layout import RunLayout
from mop_airflow.records import HopRecord
from mop_airflow.planning.plan import make_plan
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.results.page import (
    NotARunFolder,
    check_folder,
    check_ids,
    download_uri,
    json_safe,
    read_chunks,
    run_results,
)
from mop_airflow.planning.blocks import decide_next_block, first_block
from mop_airflow.store import Store
from tests.test_end_to_end import MLP, tiny_spec, write_digits

RUN_ID = "manual__2026-01-01T00:00:00+00:00"


@pytest.fixture
def store(tmp_path):
    return Store(f"file://{tmp_path / 'store'}")


def resolved(store, spec=None, dag_id="mop_results"):
    spec = spec or tiny_spec("/data/digits.parquet", store.root)  # 3 configurations, 2 shards, 2 iterations
    run = resolve_run(spec, None, dag_id=dag_id, run_id=RUN_ID)
    return RunLayout(store, dag_id, RUN_ID), run


def planned(store, spec=None):
    layout, run = resolved(store, spec)
    plan = make_plan(run)
    run.write(store, layout.run_record_uri)
    plan.write(store, layout.plan_uri)
    return layout, run, plan


def hop(layout, cid, t, shard, *, shards=2, start=0.0, seconds=1.0, loss=1.0, acc=0.5, val=None, status="ok",
        commit=None):
    """Write the record of hop ``t`` of ``cid``: started ``start`` s after 1000, saved ``seconds`` later
    (``commit``: released after ``seconds`` and saved that much later, on the slot's writer thread)."""
    iteration, h = divmod(t, shards)
    if status != "ok":
        record = HopRecord(config_id=cid, t=t, iteration=iteration, hop=h, shard=shard, status=status,
                           error="TrainingError: boom")
    else:
        began = 1000.0 + start
        record = HopRecord(
            config_id=cid, t=t, iteration=iteration, hop=h, shard=shard, started_at=began,
            train_begin=began + 0.25, train_end=began + seconds - 0.25, saved_at=began + seconds + (commit or 0.0),
            released_at=None if commit is None else began + seconds,
            timings={"train": seconds - 0.5},
            train_metrics={"loss": loss, "accuracy": acc, "steps": 10, "samples": 320},
            val_metrics=None if val is None else {"val_loss": val[0], "val_accuracy": val[1]})
    record.write(layout.store, layout.hop_record_uri(cid, t))
    return record


def test_before_the_data_is_listed_the_page_shows_a_provisional_plan(store):
    layout, run = resolved(store)
    data = run_results(layout, run)
    plan = make_plan(run)
    assert data["stage"] == "resolved" and data["plan"]["recorded"] is False
    assert data["plan"]["classes"] == plan.classes and data["plan"]["visit_order"] == plan.visit_order
    assert data["plan"]["model_hops_total"] == 3 * 2 * 2 and data["plan"]["shards"] == 2
    assert data["progress"] == {"hops_done": 0, "hops_total": 12, "failed": 0, "iteration": 0, "iterations": 2,
                                "best": None}
    rows = data["leaderboard"]["leaderboard"]
    assert data["leaderboard"]["final"] is False and len(rows) == 3
    assert {r["status"] for r in rows} == {"waiting"} and rows[0]["outcome"] == "waiting: 0 of 4 hops done"
    assert data["timeline"]["hops"] == [] and data["timeline"]["busy"] is None
    assert data["downloads"] == [] and data["summary"] is None
    assert [c["config_id"] for c in data["configs"]] == [c["config_id"] for c in run.configs]
    assert {c["offset_class"] for c in data["configs"]} == {0, 1}
    json.dumps(data, allow_nan=False)  # what the browser gets is strict JSON


def test_once_the_data_is_listed_the_provisional_plan_is_the_one_the_plan_task_writes(store, tmp_path):
    from mop_airflow.data.shard import collect_shards, expected_shard_rows, plan_sharding, scatter_slice, write_plan

    source = tmp_path / "digits.parquet"
    write_digits(source)
    spec = tiny_spec(str(source), store.root)
    # 5 draws of two models and four batch sizes, one model more often than the other: the deal
    # weighs each class's hops, which grow with the rows, against building a model once more, and
    # here a shard of 719 rows deals otherwise than one of the 1,000 rows assumed before the listing
    spec["search"]["space"] = {"method": "random", "num_samples": 5, "seed": 5, "params": {
        "model": [MLP, "mop_airflow.examples.mnist1d_models:cnn"], "learning_rate": [3e-3, 1e-2],
        "batch_size": [4, 8, 32, 128], "hparams": {"units": [32]}}}
    layout, run = resolved(store, spec)
    assert make_plan(run).classes != make_plan(run, rows=719).classes
    assert run_results(layout, run)["plan"]["classes"] == make_plan(run).classes  # nothing listed yet
    sharding = plan_sharding(run.data, store, layout.dag_id, 2, run.schedule.seed)  # what list_data does
    write_plan(sharding, store, layout.sharding_plan_uri)
    page = run_results(layout, run)["plan"]
    assert page["recorded"] is False

    # what scatter, shard and plan then do
    manifest = collect_shards(sharding, run.data, store,
                              [scatter_slice(sharding, run.data, store, piece.index) for piece in sharding.slices])
    rows = max(e.rows for e in manifest.shards)
    assert expected_shard_rows(sharding, run.data) == rows == 719  # 1,797 rows, 360 held out, 2 shards
    final = make_plan(run, rows=rows)
    assert page["classes"] == final.classes and page["visit_order"] == final.visit_order


def test_while_training_progress_provisional_leaderboard_curves_and_busy_fractions(store):
    layout, run, plan = planned(store)
    order = plan.visit_order
    a, b, c = sorted(order)
    # a finishes iteration 0 (both shards), b trains one hop, c has not started. a's hop 0 runs
    # 0..2 s on one shard while b's hop 0 runs 0..1 s on the other; a's hop 1 follows b's there, 2..4 s
    hop(layout, a, 0, order[a][0], start=0, seconds=2, loss=2.0, acc=0.3)
    hop(layout, a, 1, order[a][1], start=2, seconds=2, loss=1.0, acc=0.5, val=(0.9, 0.6))
    hop(layout, b, 0, order[b][0], start=0, seconds=1, loss=3.0, acc=0.1)
    data = run_results(layout, run)
    assert data["stage"] == "training" and data["plan"]["recorded"] is True
    assert data["progress"]["hops_done"] == 3 and data["progress"]["hops_total"] == 12
    assert data["progress"]["iteration"] == 1 and data["progress"]["best"] == {"config_id": a, "val_accuracy": 0.6}
    rows = {r["config_id"]: r for r in data["leaderboard"]["leaderboard"]}
    assert data["leaderboard"]["final"] is False
    assert rows[a]["rank"] == 1 and rows[a]["val_accuracy"] == 0.6
    assert (rows[a]["status"], rows[a]["outcome"]) == ("training", "training: 2 of 4 hops done")
    assert (rows[b]["status"], rows[b]["outcome"]) == ("training", "training: 1 of 4 hops done")
    assert rows[c]["status"] == "waiting"

    curves = data["curves"]
    assert [ch["name"] for ch in curves["charts"]] == ["loss", "accuracy"]
    assert curves["charts"][1] == {"name": "accuracy", "train": "train_accuracy", "validation": "val_accuracy"}
    # iteration 0 of a: step-weighted mean of its two hops' training metrics, and the evaluation
    assert curves["configs"][a]["points"] == [{"iteration": 0, "complete": True, "train_loss": 1.5,
                                               "train_accuracy": 0.4, "val_loss": 0.9, "val_accuracy": 0.6}]
    assert curves["configs"][b]["points"] == [{"iteration": 0, "complete": False, "train_loss": 3.0,
                                               "train_accuracy": 0.1}]
    assert curves["configs"][c] == {"points": [], "status": "waiting", "stop": None}

    tl = data["timeline"]
    assert tl["span"] == pytest.approx(4.0)
    assert order[b][0] == order[a][1] != order[a][0]
    busy = {order[a][0]: 2.0, order[a][1]: 2.0 + 1.0}
    assert tl["busy_by_shard"] == pytest.approx([busy[0] / 4, busy[1] / 4])
    assert tl["busy"] == pytest.approx(5.0 / 8)  # 5 busy seconds of 2 shards x 4 s
    assert tl["training"] == pytest.approx((1.5 + 1.5 + 0.5) / 8)
    bars = sorted((bar["config_id"], bar["t"], bar["shard"], bar["start"], bar["end"]) for bar in tl["hops"])
    assert bars == sorted([(a, 0, order[a][0], 0.0, 2.0), (a, 1, order[a][1], 2.0, 4.0),
                           (b, 0, order[b][0], 0.0, 1.0)])
    assert {bar["lane"] for bar in tl["hops"]} == {0}  # one slot per shard, and no two hops overlap on one


def test_a_slot_committing_one_hop_while_it_trains_the_next_stays_one_lane_and_never_over_100_percent(store):
    """A warm shard slot commits a hop on its writer thread while its next hop trains: a hop's bar ends
    when the slot released it, so a slot's bars never overlap and it is never busier than its time."""
    layout, run, plan = planned(store)
    a, b, c = sorted(plan.visit_order)
    shard = plan.visit_order[a][0]
    hop(layout, a, 0, shard, start=0, seconds=2, commit=0.5)
    hop(layout, b, 0, shard, start=2, seconds=2, commit=0.5)  # started while a's commit ran
    tl = run_results(layout, run)["timeline"]
    assert {bar["lane"] for bar in tl["hops"]} == {0} and tl["lanes"] == 1
    assert [(bar["start"], bar["end"]) for bar in sorted(tl["hops"], key=lambda bar: bar["start"])] == [
        (0.0, 2.0), (2.0, 4.0)]
    assert tl["busy_by_shard"][shard] == pytest.approx(4.0 / 4.5) and tl["busy"] <= 1.0


def test_overlapping_hops_on_a_shard_with_two_slots_take_two_lanes(store):
    spec = tiny_spec("/data/digits.parquet", store.root, slots_per_shard=2)
    layout, run, plan = planned(store, spec)
    a, b, _ = sorted(plan.visit_order)
    hop(layout, a, 0, 0, start=0, seconds=2)
    hop(layout, b, 0, 0, start=1, seconds=2)
    tl = run_results(layout, run)["timeline"]
    assert sorted((bar["config_id"], bar["lane"]) for bar in tl["hops"]) == [(a, 0), (b, 1)]
    assert tl["lanes"] == 2 and tl["busy_by_shard"] == pytest.approx([4 / (3 * 2), 0.0])


def test_a_failed_configuration_is_last_with_its_reason_and_its_curve_stops(store):
    layout, run, plan = planned(store)
    a, b, c = sorted(plan.visit_order)
    hop(layout, a, 0, plan.visit_order[a][0], start=0)
    hop(layout, a, 1, plan.visit_order[a][1], start=1, val=(1.0, 0.4))
    hop(layout, b, 0, plan.visit_order[b][0], status="failed")
    data = run_results(layout, run)
    rows = data["leaderboard"]["leaderboard"]
    assert [r["config_id"] for r in rows][-1] == b
    assert rows[-1]["status"] == "failed" and rows[-1]["outcome"].startswith("failed at hop 0 (iteration 0, shard")
    assert rows[-1]["outcome"].endswith("TrainingError: boom")
    assert data["progress"]["failed"] == 1
    assert data["curves"]["configs"][b]["stop"]["status"] == "failed"
    assert data["curves"]["configs"][b]["stop"]["iteration"] == 0


def test_a_finished_run_shows_the_report_and_offers_only_its_files(store):
    layout, run, plan = planned(store)
    board = {"metric": "val_accuracy", "direction": "max", "leaderboard": [
        {"rank": 1, "config_id": "c001-x", "val_accuracy": 0.9, "val_loss": float("nan"), "status": "finished",
         "outcome": "finished"}]}
    store.write_json(layout.report_uri("leaderboard.json"), board)
    data = run_results(layout, run)
    assert data["stage"] != "reported"  # the report is complete only once its summary is written
    store.write_bytes(layout.report_uri("best_model.keras"), b"k" * 3_000_000)
    store.write_bytes(layout.report_uri("metrics.parquet"), b"PAR1")
    store.write_bytes(layout.report_uri("notes.txt"), b"not offered")
    store.write_json(layout.report_uri("summary.json"), {"best": board["leaderboard"][0], "model_hops": 12,
                                                         "spec": {"secret": "not shown"}})
    data = run_results(layout, run)
    assert data["stage"] == "reported" and data["leaderboard"]["final"] is True
    assert data["leaderboard"]["leaderboard"][0]["config_id"] == "c001-x"
    assert data["leaderboard"]["leaderboard"][0]["val_loss"] is None  # NaN is not JSON
    json.dumps(data, allow_nan=False)
    assert [d["name"] for d in data["downloads"]] == ["best_model.keras", "metrics.parquet", "leaderboard.json",
                                                     "summary.json"]
    assert data["summary"]["model_hops"] == 12 and "spec" not in data["summary"]
    chunks = list(read_chunks(layout, "best_model.keras"))
    assert len(chunks) == 3 and b"".join(chunks) == b"k" * 3_000_000  # streamed in 1 MiB pieces


@pytest.mark.parametrize("name", ["../run.json", "..", "notes.txt", "/etc/passwd", "report/summary.json",
                                  "summary.json/", "%2e%2e%2frun.json", ""])
def test_only_allow_listed_report_files_are_served(store, name):
    layout, _ = resolved(store)
    with pytest.raises(KeyError):
        download_uri(layout, name)


@pytest.mark.parametrize("dag_id, run_id", [("mop", ".."), ("mop", "."), ("..", "run"), ("mop", ""),
                                            ("mop", "x" * 251), ("mop", "...")])
def test_ids_that_do_not_name_a_run_folder_are_refused(store, dag_id, run_id):
    with pytest.raises(NotARunFolder):
        check_ids(dag_id, run_id)
    with pytest.raises(NotARunFolder):
        download_uri(RunLayout(store, dag_id, run_id), "summary.json")


def test_ids_with_slashes_stay_inside_the_run_folder(store):
    check_ids("mop", "../../etc/passwd")  # slashes become underscores: one segment ".._.._etc_passwd"
    uri = download_uri(RunLayout(store, "mop", "../../etc/passwd"), "summary.json")
    assert uri == f"{store.root}/mop/.._.._etc_passwd/report/summary.json"
    check_ids("mop", "/abs/path")
    assert download_uri(RunLayout(store, "mop", "/abs/path"), "metrics.json").startswith(f"{store.root}/mop/_abs_path/")


def test_json_safe_replaces_non_finite_numbers():
    assert json_safe({"a": [1.0, math.nan, {"b": math.inf}], "c": "x", "d": None}) == \
        {"a": [1.0, None, {"b": None}], "c": "x", "d": None}


def test_hyperband_shows_brackets_rungs_and_where_each_configuration_was_pruned(store):
    spec = tiny_spec("/data/digits.parquet", store.root)
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {
        "model": [MLP], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32], "hparams": {"units": [32]}}}
    spec["search"]["adaptive"] = {"method": "hyperband", "R": 3, "eta": 3}
    layout, run, plan = planned(store, spec)
    first_block(layout, run, plan)  # the plan task's: every bracket's rung 0, side by side
    data = run_results(layout, run)
    brackets = {b["s"]: b for b in data["plan"]["brackets"]}
    assert sorted(brackets) == [0, 1] and data["plan"]["adaptive"]["R"] == 3
    assert [(g["i"], g["n_i"], g["keep"], g["decided"]) for g in brackets[1]["rungs"]] == \
        [(0, 3, 1, False), (1, 1, 0, False)]
    first = brackets[1]["configs"]
    assert len(first) == 3 and {c["bracket"] for c in data["configs"] if c["config_id"] in first} == {1}
    # rung 0 of bracket 1 is one iteration (2 hops); its planned total is rung 1's 3 iterations
    assert {r["outcome"] for r in data["leaderboard"]["leaderboard"] if r["config_id"] in first} == \
        {"waiting: 0 of 6 hops done"}

    accuracy = dict(zip(first, (0.7, 0.5, 0.6)))
    for cid in (*first, *brackets[0]["configs"]):  # block 1 trains everyone one iteration, to rung 0's end
        for t in (0, 1):
            hop(layout, cid, t, t, start=t, val=(1.0, accuracy.get(cid, 0.4)) if t == 1 else None)
    decision = decide_next_block(layout, run, plan, 0)
    assert [(j["config_id"], j["kind"], j["rung"]) for j in decision.jobs] == [(first[0], "promote", 1)]
    assert decision.length(2) == 4 and set(decision.ends) == {first[0], *brackets[0]["configs"]}
    data = run_results(layout, run)
    rows = {r["config_id"]: r for r in data["leaderboard"]["leaderboard"]}
    for loser in first[1:]:
        assert rows[loser]["status"] == "pruned" and rows[loser]["bracket"] == 1
        assert rows[loser]["outcome"] == "pruned at rung 0: ranked below the top 1"
        stop = data["curves"]["configs"][loser]["stop"]
        assert stop["status"] == "pruned" and stop["rung"] == 0 and stop["iteration"] == 0
    assert rows[first[0]]["status"] == "training" and data["curves"]["configs"][first[0]]["stop"] is None
    best = data["leaderboard"]["best_per_bracket"]
    assert best["1"] == {"config_id": first[0], "val_accuracy": 0.7}
    assert best["0"]["val_accuracy"] == 0.4 and best["0"]["config_id"] in brackets[0]["configs"]
    rung0 = next(g for g in {b["s"]: b for b in data["plan"]["brackets"]}[1]["rungs"] if g["i"] == 0)
    assert rung0["decided"] and rung0["promoted"] == [first[0]] and sorted(rung0["pruned"]) == sorted(first[1:])


def test_a_folder_written_by_another_run_whose_id_maps_to_the_same_name_is_refused(store):
    layout, run, _ = planned(store)  # run id "manual__2026-01-01T00:00:00+00:00"
    twin = resolve_run(tiny_spec("/data/digits.parquet", store.root), None, dag_id=layout.dag_id,
                       run_id=RUN_ID.replace(":", "_"))  # another run, the same folder name
    with pytest.raises(NotARunFolder, match="holds run 'manual__2026-01-01T00:00:00"):
        run_results(RunLayout(store, layout.dag_id, twin.run_id), twin)
    with pytest.raises(NotARunFolder):  # what the download route checks before it serves a file
        check_folder(RunLayout(store, layout.dag_id, twin.run_id), twin)
    check_folder(layout, run)


def test_the_results_data_imports_no_airflow_and_no_tensorflow():
    code = ("import sys, mop_airflow.results.page\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'tensorflow', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_local_report_of_a_run_still_training_is_provisional(store, tmp_path):
    from mop_airflow.results.console import fetch_report, print_leaderboard

    layout, run, plan = planned(store)
    a = sorted(plan.visit_order)[0]
    hop(layout, a, 0, plan.visit_order[a][0], start=0, seconds=2)
    hop(layout, a, 1, plan.visit_order[a][1], start=2, seconds=2, val=(0.9, 0.6))
    board, files = fetch_report(layout, tmp_path / "out")
    assert board["provisional"] is True
    rows = {r["config_id"]: r for r in board["leaderboard"]}
    assert rows[a]["rank"] == 1 and rows[a]["status"] == "training" and rows[a]["val_accuracy"] == 0.6
    assert sorted(r["status"] for r in rows.values()) == ["training", "waiting", "waiting"]
    assert {f.name for f in files} == {"leaderboard.json", "metrics.json", "hop_timeline.json",
                                        "learning_curves.png", "hop_timeline.png"}
    printed = []
    print_leaderboard(board, printed.append)
    assert "provisional" in printed[0] and any(a in line and "training" in line for line in printed)


def test_a_run_stored_before_blocks_keeps_its_rung_decisions(tmp_path):
    """A Hyperband run drawn into one DAG before searches were decided between blocks wrote a rung
    decision per rung (``rungs/``) and no block decision: its results page, report and status still read
    those (results/runs.py, ``load_rung_decisions``), even with the plan and run at hand."""
    from mop_airflow.records import RungDecision
    from mop_airflow.results.runs import load_rung_decisions

    from tests.test_end_to_end import MLP, tiny_spec

    store = Store(f"file://{tmp_path / 'store'}")
    spec = tiny_spec("/data/digits.parquet", f"file://{tmp_path / 'store'}")
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {
        "model": [MLP], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2}}}
    spec["search"]["adaptive"] = {"method": "hyperband", "R": 3, "eta": 3}
    layout, run, plan = planned(store, spec)
    decision = RungDecision(bracket=1, rung=0, metric="val_accuracy", direction="max", keep=1, iterations_done=1,
                            results=[{"config_id": "a", "metric": 0.9, "status": "ok"},
                                     {"config_id": "b", "metric": 0.7, "status": "ok"}],
                            promoted=["a"], pruned=[{"config_id": "b", "rung": 0, "bracket": 1}])
    decision.write(store, layout.rung_decision_uri(1, 0))
    assert load_rung_decisions(layout) == [decision]
    assert load_rung_decisions(layout, plan, run) == [decision]  # not the (absent) block decisions' rungs


def test_the_printed_leaderboard_shows_the_builder_hyperparameters_that_differ_between_configurations():
    """Two configurations of one model, optimizer, learning rate and batch size differ only in their hparams:
    the hparams whose values differ get a column each, those every row shares none."""
    from mop_airflow.results.console import print_leaderboard

    def row(rank, cid, units, acc):
        return {"rank": rank, "config_id": cid, "val_accuracy": acc, "val_loss": 0.5, "status": "finished",
                "model": "my_models:mlp", "optimizer": "adam", "learning_rate": 0.01, "batch_size": 32,
                "hparams": {"units": units, "dropout": 0.2, **({"act": "gelu"} if rank == 1 else {})}}

    lines: list[str] = []
    print_leaderboard({"metric": "val_accuracy", "direction": "max",
                       "leaderboard": [row(1, "c003-374d85", 128, 0.961), row(2, "c001-19b656", 32, 0.9471)]},
                      out=lines.append)
    assert lines[1].endswith("model / optimizer / lr / batch / act / units")
    assert lines[2].endswith("c003-374d85        0.9610    0.5000  finished   mlp / adam / 0.01 / 32 / gelu / 128")
    assert lines[3].endswith("c001-19b656        0.9471    0.5000  finished   mlp / adam / 0.01 / 32 / - / 32")
    from mop_airflow.results.report import config_labels

    labels = config_labels([{"config_id": "c003-374d85", "model": "my_models:mlp", "optimizer": "adam",
                             "optimizer_params": {"learning_rate": 0.01}, "batch_size": 32, "hparams": {"units": 128}},
                            {"config_id": "c001-19b656", "model": "my_models:mlp", "optimizer": "adam",
                             "optimizer_params": {"learning_rate": 0.01}, "batch_size": 32, "hparams": {"units": 32}}])
    # the learning curves' legend (report/learning_curves.png) tells them apart the same way
    assert labels == {"c003-374d85": "c003 mlp adam lr=0.01 bs=32 units=128",
                      "c001-19b656": "c001 mlp adam lr=0.01 bs=32 units=32"}
