"""ASHA decided inside the shard slots on a real Airflow: one DAG run, one block, no decide task.

6 configurations, rungs at 1 and 3 iterations, eta 3, 2 shards of one slot: each train task asks
what trains next whenever it has nothing ready, so both slots decide, each decision once, and the
search's order of decisions depends on timing (ASHA is asynchronous). What does not: every decision is
recorded with the completions it saw and follows ASHA's rule from them, no configuration starts twice
or is promoted twice, every started one is ranked, and the search ends in the run that began it. A
train task SIGKILLed half-way through is retried and goes on from the recorded decisions; so does a
search whose scheduler is stopped while it trains and started again.
"""

import json
import time

import pytest

from mop_airflow.records import BlockDecision
from mop_airflow.records.layout import RunLayout
from mop_airflow.search.promotion import rank_rung
from mop_airflow.store import Store
from tests.conftest import airflow_part, failed_logs
from tests.killer import killer_source
from tests.test_end_to_end import MLP, tiny_spec, write_digits

pytestmark = pytest.mark.integration

KILLED, RESTARTED = "mop_asha_killed", "mop_asha_restarted"

# SIGKILLs the train task of shard 1 at its 40th training batch (its third hop or so), on its first try
KILLER = killer_source('_batches == 40 and env.get("AIRFLOW_CTX_DAG_ID") == "mop_asha_killed" and '
                       'env.get("AIRFLOW_CTX_TASK_ID") == "train_shard_1" and env.get("AIRFLOW_CTX_TRY_NUMBER") == "1"',
                       "asha_killer")


def asha_spec(source, root, model=MLP):
    spec = tiny_spec(source, root)
    spec["search"]["space"] = {"method": "random", "seed": 5, "params": {
        "model": [model], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32], "hparams": {"units": [32]}}}
    spec["search"]["adaptive"] = {"method": "asha", "n": 6, "r": 1, "R": 3, "eta": 3}
    return spec


@pytest.fixture(scope="module")
def airflow(shared_airflow, tmp_path_factory):
    root = tmp_path_factory.mktemp("asha")
    lib = root / "lib"
    lib.mkdir()
    (lib / "asha_killer.py").write_text(KILLER)
    with airflow_part(shared_airflow, root, "asha", paths=[lib]) as af:
        write_digits(root / "digits.parquet")
        af.dag_file(RESTARTED, asha_spec(root / "digits.parquet", f"file://{root / 'store'}"))
        spec = asha_spec(root / "digits.parquet", f"file://{root / 'store'}", model="asha_killer:mlp")
        af.write_dag(KILLED,
            "import datetime, json\nfrom mop_airflow import build_mop_dag\n"
            f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={KILLED!r},\n"
            "                    default_args={'retry_delay': datetime.timedelta(seconds=2)})\n")
        af.wait_for_dags(KILLED, RESTARTED)
        yield af


def check_search(store, layout, n=6, eta=3, top=1):
    """ASHA's rules, decision by decision, from what each decision recorded; returns the decisions."""
    decisions = [BlockDecision.read(store, u) for u in sorted(store.glob(layout.block_decision_uri("*")))]
    assert [d.block for d in decisions] == list(range(len(decisions)))  # taken in sequence, none lost
    assert decisions[-1].finished and not any(d.finished for d in decisions[:-1])
    jobs = [j for d in decisions for j in d.jobs]
    starts = [j["config_id"] for j in jobs if j["kind"] == "start"]
    assert len(starts) == len(set(starts)) == n  # every configuration started once
    promotions = [(j["config_id"], j["rung"]) for j in jobs if j["kind"] == "promote"]
    assert len(promotions) == len(set(promotions)) >= 1
    for d in decisions:
        for job in d.jobs:
            if job["kind"] != "promote":
                continue
            done = [c for c in d.completions if c["rung"] == job["rung"] - 1]
            best = [r["config_id"] for r in rank_rung([{k: c[k] for k in ("config_id", "metric", "status")}
                                                       for c in done], direction="max")][:len(done) // eta]
            assert job["config_id"] in best and job["of"] == len(done)  # among the best 1/eta of what it saw
    for job in jobs:  # each job's hops were trained, each from the state the one before it left
        first = 0 if job["kind"] == "start" else job["from"]["t"] + 1
        hops = [store.read_json(layout.hop_record_uri(job["config_id"], t)) for t in range(first, job["iterations"] * 2)]
        assert all(h["status"] == "ok" for h in hops)
        for before, after in zip(hops, hops[1:]):
            assert after["input_sha256"] == before["checkpoint_sha256"]
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    assert sorted(r["config_id"] for r in board) == sorted(starts)
    finished = [r for r in board if r["outcome"] == "finished: reached the last rung, 3 iterations"]
    assert {r["config_id"] for r in finished} == {cid for cid, rung in promotions if rung == top}
    return decisions


@pytest.mark.slow
def test_a_train_task_killed_half_way_through_asha_is_retried_and_the_search_goes_on_from_its_decisions(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    run = airflow.trigger(KILLED)
    assert airflow.wait_for_run(KILLED, run, timeout=600) == "success", failed_logs(airflow, KILLED, run)
    states = {ti["task_id"]: ti for ti in airflow.task_instances(KILLED, run)}
    assert states["train_shard_1"]["try_number"] == 2  # killed on its first try, trained the rest on its second
    assert not {t for t in states if t.endswith("decide") or "block_" in t}  # one block, no decide task
    assert not store.exists(RunLayout(store, KILLED, f"{run}__block_1").continues_uri)  # one DAG run
    decisions = check_search(store, RunLayout(store, KILLED, run))
    # both slots took decisions: whichever had nothing ready asked what trains next
    assert {tuple(j["decided_on"]) for d in decisions for j in d.jobs} == {(0, 0), (1, 0)}


@pytest.mark.slow
def test_a_scheduler_stopped_while_asha_trains_and_started_again_ends_the_search(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    run = airflow.trigger(RESTARTED)
    layout = RunLayout(store, RESTARTED, run)
    deadline = time.time() + 300
    while len(store.glob(layout.block_decision_uri("*"))) < 3 and time.time() < deadline:
        time.sleep(0.5)
    assert len(store.glob(layout.block_decision_uri("*"))) >= 3, failed_logs(airflow, RESTARTED, run)
    old = airflow.processes["scheduler"]
    # SIGTERM, then after 5 s SIGKILL to the scheduler and the task processes its LocalExecutor runs
    airflow.stop_service("scheduler", timeout=5)
    # a task lost with the scheduler is found 30 s after its last heartbeat (300 s by default), then
    # retried; the shared Airflow's scheduler is started again with its own settings when this file ends
    airflow.start_service("scheduler", env={"AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30"})
    airflow.wait_healthy()
    assert airflow.processes["scheduler"].pid != old.pid
    assert airflow.wait_for_run(RESTARTED, run, timeout=900) == "success", failed_logs(airflow, RESTARTED, run)
    check_search(store, layout)
