"""A tiny Hyperband run through Airflow (dag.test): blocks to the rung ends, promote the best, prune the rest.

R=3, eta=3 on 2 shards: bracket 1 starts 3 configurations for 1 iteration and promotes the best
one to 3 iterations; bracket 0 trains 2 configurations for 3 iterations. Both brackets train side by
side: block 1 trains all 5 to iteration 1, where bracket 1's rung 0 ends; block 2 trains the promoted
one and bracket 0's two to iteration 3. One of bracket 1's configurations has hparams its builder
raises for: it is pruned with that reason and fails nothing.
"""

import io

import numpy as np
import pytest

from mop_airflow.records import Plan, RunRecord
from mop_airflow.records.layout import RunLayout
from mop_airflow.results.runs import load_rung_decisions
from mop_airflow.search.adaptive import split_by_bracket
from mop_airflow.config import MopSpec
from mop_airflow.store import Store
from tests.conftest import write_dag_file
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = pytest.mark.integration

NARROW = "tests.training.toys:narrow_only"  # raises for units above 100
GOOD, BROKEN = 32, 200


def hyperband_spec(source, root, seed):
    spec = tiny_spec(source, root)
    spec["search"]["space"] = {"method": "random", "seed": seed, "params": {
        "model": [NARROW], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32], "hparams": {"units": {"distribution": "choice", "values": [GOOD, GOOD, BROKEN]}}}}
    spec["search"]["adaptive"] = {"method": "hyperband", "R": 3, "eta": 3}
    return spec


def test_hyperband_promotes_exactly_the_best_and_skips_the_rest(airflow_db, tmp_path):
    source = tmp_path / "digits.parquet"
    write_digits(source)
    root = f"file://{tmp_path / 'store'}"
    # a seed whose bracket 1 holds exactly one broken configuration (found, not assumed)
    for seed in range(50):
        spec = MopSpec.from_dict(hyperband_spec(source, root, seed))
        configs = spec.configurations()
        bracket1 = split_by_bracket([c["config_id"] for c in configs], spec.adaptive_plan())[1]
        models = {c["config_id"]: c["hparams"]["units"] for c in configs}
        if sorted(models[c] for c in bracket1) == [GOOD, GOOD, BROKEN]:
            break
    dag = write_dag_file("mop_hyperband", hyperband_spec(source, root, seed))
    run = dag.test()
    assert run.state == "success"

    store = Store(root)
    layout = RunLayout(store, "mop_hyperband", run.run_id)
    plan = Plan.read(store, layout.plan_uri)
    (decision,) = [d.to_dict() for d in load_rung_decisions(layout, plan, RunRecord.read(store, layout.run_record_uri))]
    assert (decision["bracket"], decision["rung"]) == (1, 0)
    ok = [r for r in decision["results"] if r["status"] == "ok"]
    assert len(ok) == 2 and len(decision["results"]) == 3
    # exactly the best validation accuracy after rung 0 was promoted (keep = floor(3 / 3) = 1)
    best = max(ok, key=lambda r: (r["metric"], -int(r["config_id"][1:4])))
    assert decision["promoted"] == [best["config_id"]]
    reasons = {e["config_id"]: e["reason"] for e in decision["pruned"]}
    broken = next(c for c in bracket1 if models[c] == BROKEN)
    assert reasons[broken].startswith("failed: TrainingError") and "units=200 is too wide" in reasons[broken]
    loser = next(r["config_id"] for r in ok if r["config_id"] != best["config_id"])
    assert reasons[loser] == "ranked below the top 1"

    # the promoted configuration resumed from its checkpoint: after rung 1 its optimizer's step
    # counter equals every step it took since hop 0, not just the steps of rung 1
    steps = [store.read_json(layout.hop_record_uri(best["config_id"], t))["train_metrics"]["steps"] for t in range(6)]
    with np.load(io.BytesIO(store.read_bytes(layout.checkpoint_uri(best["config_id"], 5)))) as state:
        assert int(state["optimizer/00000"]) == sum(steps)  # Keras keeps the iteration counter first
    assert not store.exists(layout.hop_record_uri(loser, 2))  # the pruned one trained no further

    # block 2 trains the promoted configuration and bracket 0's two, from iteration 1 to 3; the broken
    # configuration stops at its first hop, never failing a task, and the others of its rung go on. A
    # block is one train task per shard (2 shards), each training the block's hops on its shard
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    blocks = {task: state for task, state in states.items() if "train_shard_" in task}
    assert set(blocks) == {f"{prefix}train_shard_{s}" for prefix in ("", "block_1.") for s in range(2)}
    assert set(blocks.values()) == {"success"}
    second = store.read_json(layout.block_decision_uri(1))
    assert second["hops"] == 4 and second["start"] == 2 and sorted(second["training"]) == sorted(
        [best["config_id"], *split_by_bracket([c["config_id"] for c in configs], spec.adaptive_plan())[0]])
    rung1_hops = [t for t in range(2, 6) if store.exists(layout.hop_record_uri(best["config_id"], t))]
    assert rung1_hops == [2, 3, 4, 5]  # from 1 to 3 iterations: 2 more iterations x 2 shards
    # its next hop is settled where it was due (its failure repeated), and nothing after it trained
    assert store.read_json(layout.hop_record_uri(broken, 1))["dropped_after"] == 0
    assert not any(store.exists(layout.hop_record_uri(broken, t)) for t in range(2, 6))
    assert "failed" not in set(states.values())

    board = store.read_json(layout.report_uri("leaderboard.json"))
    assert set(board["best_per_bracket"]) == {"0", "1"}
    assert board["best_per_bracket"]["1"]["config_id"] == best["config_id"]
    outcomes = {row["config_id"]: row["outcome"] for row in board["leaderboard"]}
    assert outcomes[best["config_id"]] == "finished" and outcomes[loser].startswith("pruned at rung 0")
    assert {e["config_id"] for e in board["pruned"]} == {broken, loser}
