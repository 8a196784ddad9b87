"""A tiny MOP DAG on a real Airflow: api-server, scheduler and dag-processor as processes.

Checks what dag.test() cannot: with pools="check" a run fails at once when the shard pools are
missing (instead of leaving it in "scheduled" for ever); by default the first task creates them and
the run succeeds with one train task per shard on its shard's pool and queue. A train task whose
process is SIGKILLed half-way through a block is retried by the scheduler, trains only the hops it
had not committed, and the run ends with the same metrics as an undisturbed one. A search split over several DAG runs
(``schedule.iterations_per_run``) goes on run after run and ends with the metrics of one run.
"""

import json
import re
from urllib.parse import quote
import subprocess
import sys

import pytest

from mop_airflow.records.layout import RunLayout
from mop_airflow.store import Store
from tests.conftest import airflow_part
from tests.killer import killer_source
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = pytest.mark.integration

DAG_ID = "mop_real_scheduler"
CHECKED = "mop_pools_checked"  # the same DAG with pools="check"
KILLED, UNDISTURBED = "mop_killed_hop", "mop_undisturbed"
SPLIT, WHOLE = "mop_split_runs", "mop_one_run"  # 3 iterations: one per DAG run, or all in one

# A builder whose training process SIGKILLs itself half-way through the first try of shard 1's train
# task of the KILLED DAG (Airflow exports the task's ids into the environment): at its 40th training
# batch, which is in its second hop (a hop is 23 batches of 32 rows here); importable by the task
# processes through PYTHONPATH, outside the DAG folder so the DAG processor never imports it.
KILLER = killer_source('_batches == 40 and env.get("AIRFLOW_CTX_DAG_ID") == "mop_killed_hop" and '
                       'env.get("AIRFLOW_CTX_TASK_ID") == "train_shard_1" and env.get("AIRFLOW_CTX_TRY_NUMBER") == "1"',
                       "killer")


@pytest.fixture(scope="module")
def airflow(shared_airflow, tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    lib = root / "lib"
    lib.mkdir()
    (lib / "killer.py").write_text(KILLER)
    with airflow_part(shared_airflow, root, "real_scheduler", paths=[lib]) as af:
        write_digits(root / "digits.parquet")
        spec = tiny_spec(root / "digits.parquet", f"file://{root / 'store'}")
        spec["schedule"]["iterations"] = 1
        spec["search"]["space"]["params"]["learning_rate"] = [3e-3, 1e-2]
        af.dag_file(DAG_ID, spec)
        af.dag_file(CHECKED, spec, pools="check")
        killer_spec = tiny_spec(root / "digits.parquet", f"file://{root / 'store'}", iterations=1)
        # 4 configurations, 2 per offset class: each shard's train task trains 4 hops
        killer_spec["search"]["space"]["params"].update(model=["killer:mlp"], learning_rate=[1e-3, 3e-3, 1e-2, 3e-2])
        for dag_id in (KILLED, UNDISTURBED):
            af.write_dag(dag_id,
                "import datetime, json\nfrom mop_airflow import build_mop_dag\n"
                f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(killer_spec))}), dag_id={dag_id!r},\n"
                "                    default_args={'retry_delay': datetime.timedelta(seconds=2)})\n")
        for dag_id, per_run in ((SPLIT, 1), (WHOLE, "auto")):
            split_spec = tiny_spec(root / "digits.parquet", f"file://{root / 'store'}", iterations=3,
                                   iterations_per_run=per_run)
            # 4 configurations, the two 200 units wide fail at their first hop (in the first block)
            split_spec["search"]["space"]["params"].update(model=["killer:narrow"], learning_rate=[3e-3, 1e-2],
                                                           hparams={"units": [32, 200]})
            af.dag_file(dag_id, split_spec)
        af.wait_for_dags(DAG_ID, CHECKED, KILLED, UNDISTURBED, SPLIT, WHOLE)
        yield af


@pytest.mark.slow
def test_missing_pools_fail_the_run_fast_with_the_fix_when_only_checked(airflow):
    run_id = airflow.trigger(CHECKED)
    state = airflow.wait_for_run(CHECKED, run_id, timeout=240)
    assert state == "failed"
    states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(CHECKED, run_id)}
    assert states["preflight"] == "failed"
    assert states["list_data"] == "upstream_failed"
    log = airflow.task_log(CHECKED, run_id, "preflight")
    assert "mop_shard_0" in log and "mop_shard_1" in log
    assert "mop-airflow pools sync --shards 2 --slots 1" in log
    assert not {"mop_shard_0", "mop_shard_1"} & {p["name"] for p in airflow.rest.paged("/pools", "pools")}


def test_the_first_task_creates_missing_pools_and_the_run_succeeds_on_shard_pools_and_queues(airflow):
    run_id = airflow.trigger(DAG_ID)
    assert airflow.wait_for_run(DAG_ID, run_id, timeout=420) == "success"
    pools = {p["name"]: p for p in airflow.rest.paged("/pools", "pools")}
    for shard in (0, 1):
        assert pools[f"mop_shard_{shard}"]["slots"] == 1
        assert pools[f"mop_shard_{shard}"]["description"].startswith(f"mop_airflow shard {shard}:")
    assert "created pools mop_shard_0, mop_shard_1 with 1 slot(s) each" in airflow.task_log(DAG_ID, run_id, "preflight")
    tis = airflow.task_instances(DAG_ID, run_id)
    train = [ti for ti in tis if ti["task_id"].startswith("train_shard_")]
    # 2 configurations x 2 hops on 2 one-slot shards: one plain train task per shard
    assert len(train) == 2 and all(ti["state"] == "success" for ti in train)
    for ti in train:
        shard = ti["task_id"].rsplit("_", 1)[1]
        assert ti["pool"] == ti["queue"] == f"mop_shard_{shard}" and ti["map_index"] == -1
    # each slot said what it trained, from which checkpoint, for how long
    log = airflow.task_log(DAG_ID, run_id, "train_shard_1")
    assert re.search(r"c00\d-\w{6} t=1 on shard 1 from file://\S+/t000\.npz", log)
    assert re.search(r"c00\d-\w{6} hop t=1 \(iteration 0, hop 1\) on shard 1: loss [\d.]+, .*s training", log)
    store = Store(f"file://{airflow.root / 'store'}")
    board = store.read_json(RunLayout(store, DAG_ID, run_id).report_uri("leaderboard.json"))
    assert len(board["leaderboard"]) == 2 and board["leaderboard"][0]["val_accuracy"] > 0.5


def test_the_task_execution_api_is_built_at_start_not_in_the_first_task(airflow):
    """The api-server builds its task execution API on its first request (about 4 s on two cores):
    LocalAirflow asks for it when it starts, before any task's first call (``/run``) needs it."""
    log = (airflow.home / "logs" / "api-server.log").read_text()
    warm_up = re.search(r"method=GET path=/execution/health .*status_code=200", log)
    first_task = re.search(r"method=PATCH path=/execution/task-instances/\S+/run", log)
    assert warm_up and first_task and warm_up.start() < first_task.start()


@pytest.mark.slow
def test_a_train_task_killed_half_way_is_retried_and_trains_only_the_rest(airflow):
    """SIGKILL the process of shard 1's train task half-way through its second hop: shard 0's waits,
    the scheduler retries shard 1's, the retry skips the hop already committed and trains the others,
    and the run's metrics equal an undisturbed run's."""
    sync = subprocess.run([sys.executable, "-m", "mop_airflow.cli.main", "pools", "sync", "--shards", "2"],
                          env=airflow.env, capture_output=True, text=True)
    assert sync.returncode == 0, sync.stderr
    store = Store(f"file://{airflow.root / 'store'}")
    boards, hops = {}, {}
    for dag_id in (UNDISTURBED, KILLED):
        run_id = airflow.trigger(dag_id)
        assert airflow.wait_for_run(dag_id, run_id, timeout=420) == "success"
        layout = RunLayout(store, dag_id, run_id)
        boards[dag_id] = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
        hops[dag_id] = [store.read_json(uri) for uri in store.glob(layout.hops_glob)]
        tis = {ti["task_id"]: ti for ti in airflow.task_instances(dag_id, run_id)}
        retried = sorted(task_id for task_id, ti in tis.items() if ti["try_number"] > 1)
        if dag_id == KILLED:  # shard 1's train task died once and succeeded on its second try
            assert retried == ["train_shard_1"] and tis["train_shard_1"]["state"] == "success"
            assert tis["train_shard_1"]["try_number"] == 2 and tis["train_shard_0"]["try_number"] == 1
            log = airflow.task_log(dag_id, run_id, "train_shard_1", 2)
            assert re.search(r"c00\d-\w{6} t=0: already committed by try 1 of train_shard_1; not trained again", log)
        else:
            assert retried == []
    on_shard_1 = sorted((h["try_number"], h["t"]) for h in hops[KILLED] if h["shard"] == 1)
    # its first hop was committed by the killed try; the one it died in and the rest, by the retry
    assert on_shard_1[0][0] == 1 and [try_ for try_, _ in on_shard_1[1:]] == [2, 2, 2]
    assert all(h["try_number"] == 1 for h in hops[KILLED] if h["shard"] == 0)
    assert all(h["bytes_read"]["checkpoint"] > 0 for h in hops[KILLED] if h["t"] == 1)  # from hop 0's state
    assert [row["config_id"] for row in boards[KILLED]] == [row["config_id"] for row in boards[UNDISTURBED]]
    for a, b in zip(boards[KILLED], boards[UNDISTURBED]):
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1e-6)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)


def _results(store, run_id):
    layout = RunLayout(store, DAG_ID, run_id)
    rows = store.read_json(layout.report_uri("metrics.json"))
    records = [store.read_json(uri) for uri in store.glob(layout.hops_glob)]
    return {
        "board": [(r["config_id"], r["val_accuracy"]) for r in store.read_json(layout.report_uri("leaderboard.json"))
                  ["leaderboard"]],
        "rows": sorted((r["config_id"], r["iteration"]) for r in rows),
        "losses": [r["val_loss"] for r in sorted(rows, key=lambda r: (r["config_id"], r["iteration"]))],
        "checkpoints": store.glob(f"{layout.run_uri}/checkpoints/*/*"),
        "recorded": sorted(r["checkpoint"] for r in records),
        "shards": store.glob(store.uri(DAG_ID, "shards", "*")),
    }


@pytest.mark.slow
def test_clearing_a_finished_run_or_one_hop_gives_the_same_results_without_duplicates(airflow):
    """Clear one hop, then the whole run, as the UI's Clear button does (the REST API): the metrics
    table keeps one row per configuration and iteration, every checkpoint belongs to a hop record,
    the shards are reused, and the results are those of the first run."""
    sync = subprocess.run([sys.executable, "-m", "mop_airflow.cli.main", "pools", "sync", "--shards", "2"],
                          env=airflow.env, capture_output=True, text=True)
    assert sync.returncode == 0, sync.stderr
    store = Store(f"file://{airflow.root / 'store'}")
    run_id = airflow.trigger(DAG_ID)
    assert airflow.wait_for_run(DAG_ID, run_id, timeout=420) == "success"
    first = _results(store, run_id)
    assert len(first["rows"]) == len(set(first["rows"])) == 2  # 2 configurations x 1 iteration
    assert first["checkpoints"] == first["recorded"] and len(first["checkpoints"]) == 4

    hop = next(ti for ti in airflow.task_instances(DAG_ID, run_id) if ti["task_id"] == "train_shard_1")
    airflow.api("POST", f"/dags/{DAG_ID}/clearTaskInstances", json={
        "dry_run": False, "only_failed": False, "dag_run_id": run_id, "task_ids": [[hop["task_id"], hop["map_index"]]]})
    assert airflow.wait_for_run(DAG_ID, run_id, timeout=420) == "success"
    tis = {(ti["task_id"], ti["map_index"]): ti for ti in airflow.task_instances(DAG_ID, run_id)}
    assert tis[(hop["task_id"], hop["map_index"])]["try_number"] == hop["try_number"] + 1
    once = _results(store, run_id)
    assert once["rows"] == first["rows"] and once["checkpoints"] == once["recorded"] == first["checkpoints"]
    assert once["board"] == first["board"]  # the report is not re-run: the cleared hop changed nothing

    airflow.api("POST", f"/dags/{DAG_ID}/dagRuns/{run_id}/clear", json={"dry_run": False, "only_failed": False})
    assert airflow.wait_for_run(DAG_ID, run_id, timeout=420) == "success"
    again = _results(store, run_id)
    assert all(ti["try_number"] >= 2 for ti in airflow.task_instances(DAG_ID, run_id) if ti["state"] == "success")
    assert again["rows"] == first["rows"] and again["checkpoints"] == again["recorded"] == first["checkpoints"]
    assert again["shards"] == first["shards"]  # the same data and seed: the shards were reused, not written again
    assert [c for c, _ in again["board"]] == [c for c, _ in first["board"]]
    for (_, a), (_, b) in zip(again["board"], first["board"]):
        assert a == pytest.approx(b, abs=1e-6)
    assert again["losses"] == pytest.approx(first["losses"], rel=1e-5)


@pytest.mark.slow
def test_a_search_split_over_dag_runs_goes_on_run_after_run_and_ends_as_one_run(airflow):
    """3 iterations, one per DAG run: the first run's next_run task triggers the run of block 2, and
    that one block 3's; each run holds a third of the hop task instances; the configurations that
    failed in the first block train no further; the last run reports into the first run's folder,
    with the same leaderboard and metrics as the search in one run."""
    from mop_airflow.monitor.run_status import find_run
    from mop_airflow.records.layout import run_folder

    store = Store(f"file://{airflow.root / 'store'}")
    whole = airflow.trigger(WHOLE)
    first = airflow.trigger(SPLIT)
    assert airflow.wait_for_run(WHOLE, whole, timeout=420) == "success"
    runs = [first, f"{first}__block_1", f"{first}__block_2"]
    for run_id in runs:
        assert airflow.wait_for_run(SPLIT, run_id, timeout=420) == "success"
    hop_tis = {}
    for run_id in runs:
        states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(SPLIT, run_id)}
        hop_tis[run_id] = sorted(t for t in states if t.startswith("train_shard_"))
        last = run_id == runs[-1]
        assert states["report"] == ("success" if last else "skipped"), run_id
        assert states["publish"] == ("success" if last else "skipped"), run_id
        assert states["next_run"] == "success", run_id
    whole_tis = sorted(ti["task_id"] for ti in airflow.task_instances(WHOLE, whole)
                       if ti["task_id"].startswith("train_shard_"))
    assert "next_run" not in {ti["task_id"] for ti in airflow.task_instances(WHOLE, whole)}
    # every run renders the same train task per shard as the one-run DAG, for a third of its hops
    assert hop_tis[runs[0]] == hop_tis[runs[1]] == hop_tis[runs[2]] == whole_tis == ["train_shard_0", "train_shard_1"]
    assert "continues the search of run" in airflow.task_log(SPLIT, runs[2], "preflight")

    layout = RunLayout(store, SPLIT, first)
    assert store.read_json(layout.chain_uri)["runs"] == runs
    assert not store.exists(RunLayout(store, SPLIT, runs[1]).run_record_uri)
    assert run_folder(store, SPLIT, runs[2]).run_id == first == run_folder(store, SPLIT, first).run_id
    # the two narrow configurations trained their 6 hops (3 iterations x 2 shards) into the first run's
    # folder; the two wide ones have their failure at hop 0, their next hop settled where it was due (the
    # failure repeated, so the other shard's slot learnt of it) and nothing after
    hops = [store.read_json(uri) for uri in store.glob(layout.hops_glob)]
    trained = {h["config_id"] for h in hops if h["status"] == "ok"}
    failed = {h["config_id"]: (h["t"], h["status"]) for h in hops if h["status"] != "ok" and h.get("dropped_after") is None}
    settled = {h["config_id"]: (h["t"], h["dropped_after"]) for h in hops if h.get("dropped_after") is not None}
    assert len(trained) == 2 and sorted(h["t"] for h in hops if h["status"] == "ok") == sorted(2 * list(range(6)))
    assert len(failed) == 2 and {t for t, _ in failed.values()} == {0}
    assert settled == {cid: (1, 0) for cid in failed} and len(hops) == 2 * 6 + 2 + 2
    # the next run's train tasks read each configuration from where the block before left it
    assert "did not finish hop 1 (it failed earlier)" in airflow.task_log(SPLIT, runs[1], "train_shard_0") + \
        airflow.task_log(SPLIT, runs[1], "train_shard_1")
    split_board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    whole_board = store.read_json(RunLayout(store, WHOLE, whole).report_uri("leaderboard.json"))["leaderboard"]
    assert [(r["config_id"], r["status"]) for r in split_board] == [(r["config_id"], r["status"]) for r in whole_board]
    assert [r["status"] for r in split_board].count("finished") == 2
    for a, b in zip(split_board, whole_board):
        if a["status"] == "finished":
            assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=1e-6)
            assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-5)
    # asked for by its first run, the search is the run of its last block, reading the first run's folder
    ref = find_run(airflow.rest, SPLIT, first)
    assert (ref.run_id, ref.state, ref.layout().run_id) == (runs[2], "success", first)
    ref = find_run(airflow.rest, SPLIT, runs[1])  # a later run's record is the first run's, from its conf
    assert (ref.run_id, ref.record.run_id, ref.layout().run_id) == (runs[2], first, first)
    # the results page shows the whole search from any of its runs
    for run_id in runs:
        page = airflow.rest.client.get(f"/mop/api/runs/{SPLIT}/{quote(run_id, safe='')}",
                                       headers={"Authorization": f"Bearer {airflow.rest.token}"})
        assert page.status_code == 200, page.text
        board = page.json()["leaderboard"]
        assert board["final"] and [r["config_id"] for r in board["leaderboard"]] == [r["config_id"] for r in split_board]
