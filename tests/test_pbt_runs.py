"""Population-based training and TPE proposals on a real Airflow, decided between blocks of one
iteration; a search this small holds all its blocks in one DAG run.

A population of 4 on 2 shards for 3 iterations, ranked after every iteration (interval 1, quantile
0.25): after each of the first two iterations the worst member copies one of the best: its
checkpoint (weights and Adam moments), with its learning rate or batch size explored. The copy is
a new configuration with its own hop records from the boundary on; the decision records who copied
whom and the copied checkpoint. A hop task SIGKILLed right after a copy is retried, and the lineage
and the leaderboard equal the undisturbed search's.
"""

import io
import json

import numpy as np
import pytest

from mop_airflow.records import BlockDecision, HopRecord, RunRecord
from mop_airflow.records.layout import RunLayout, read_run
from mop_airflow.store import Store
from mop_airflow.results.page import run_results
from mop_airflow.search.jobs import Completion
from mop_airflow.search.space import SearchSpace, config_id
from mop_airflow.search.tpe import proposer
from tests.conftest import airflow_part, failed_logs
from tests.killer import killer_source
from tests.test_end_to_end import MLP, tiny_spec, write_digits

pytestmark = pytest.mark.integration

KILLED, UNDISTURBED = "mop_pbt_killed", "mop_pbt_undisturbed"
TPE = "mop_tpe"
# Every first try of a hop task of the search's second block (the one right after the first copy)
# SIGKILLs its process at its 5th training batch.
KILLER = killer_source('_batches == 5 and env.get("AIRFLOW_CTX_DAG_ID") == "mop_pbt_killed" and '
                       '"block_1." in env.get("AIRFLOW_CTX_TASK_ID", "") and '
                       'env.get("AIRFLOW_CTX_TRY_NUMBER") == "1"', "pbt_killer")


def pbt_spec(source, root):
    spec = tiny_spec(source, root)
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {
        "model": ["pbt_killer:mlp"],
        "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [16, 32]}}
    spec["search"]["adaptive"] = {"method": "pbt", "population": 4, "iterations": 3, "interval": 1,
                                  "mutations": {"learning_rate": {"distribution": "log_uniform", "low": 1e-4,
                                                                  "high": 3e-2},
                                                "batch_size": [16, 32]}}
    spec["store"]["keep_checkpoints"] = None  # the test reads every checkpoint the search wrote
    return spec


def tpe_spec(source, root):
    """A model-based random search: 6 configurations on 2 shards, one iteration each, the first 4 drawn
    at random (block 1 holds two per slot, 4), the last 2 proposed by TPE from their results."""
    spec = tiny_spec(source, root, iterations=1)
    spec["search"]["space"] = {"method": "random", "seed": 3, "num_samples": 6, "sampler": "tpe", "startup": 4,
                               "params": {"model": [MLP], "hparams": {"units": [32]},
                                          "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
                                          "batch_size": [16, 32]}}
    return spec


@pytest.fixture(scope="module")
def airflow(shared_airflow, tmp_path_factory):
    root = tmp_path_factory.mktemp("pbt")
    lib = root / "lib"
    lib.mkdir()
    (lib / "pbt_killer.py").write_text(KILLER)
    with airflow_part(shared_airflow, root, "pbt", paths=[lib]) as af:
        write_digits(root / "digits.parquet")
        for dag_id in (KILLED, UNDISTURBED):
            spec = pbt_spec(root / "digits.parquet", f"file://{root / 'store'}")
            af.write_dag(dag_id,
                "import datetime, json\nfrom mop_airflow import build_mop_dag\n"
                f"dag = build_mop_dag(json.loads({json.dumps(json.dumps(spec))}), dag_id={dag_id!r},\n"
                "                    default_args={'retry_delay': datetime.timedelta(seconds=2)})\n")
        af.dag_file(TPE, tpe_spec(root / "digits.parquet", f"file://{root / 'store'}"))
        af.wait_for_dags(KILLED, UNDISTURBED, TPE)
        yield af


def lineage(store, dag_id, first):
    layout = RunLayout(store, dag_id, first)
    return [[(c["member"], c["iteration"], c["replaced"], c["config_id"], c["parent"], c["changes"])
             for c in BlockDecision.read(store, layout.block_decision_uri(b)).copies] for b in range(4)]


def arrays(data):
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {k: archive[k] for k in archive.files if k != "meta"}, \
            json.loads(archive["meta"].tobytes().decode())["meta"]


@pytest.mark.slow
def test_pbt_copies_the_best_members_checkpoint_between_blocks_and_a_killed_hop_changes_nothing(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    searches = {dag_id: airflow.trigger(dag_id) for dag_id in (KILLED, UNDISTURBED)}
    for dag_id, first in searches.items():
        assert airflow.wait_for_run(dag_id, first, timeout=600) == "success", failed_logs(airflow, dag_id, first)
    first = searches[UNDISTURBED]
    layout = RunLayout(store, UNDISTURBED, first)
    states = {ti["task_id"]: ti["state"] for ti in airflow.task_instances(UNDISTURBED, first)}
    # every block in this one run: block k's deal tasks wait for the decision after block k - 1
    assert [states[f"block_{k}.decide"] for k in (1, 2)] + [states["decide"], states["report"]] == ["success"] * 4
    assert not store.exists(RunLayout(store, UNDISTURBED, f"{first}__block_1").continues_uri)  # no second run
    blocks = [BlockDecision.read(store, layout.block_decision_uri(b)) for b in range(4)]
    assert [len(b.training) for b in blocks] == [4, 4, 4, 0] and blocks[3].finished
    assert [len(b.copies) for b in blocks] == [0, 1, 1, 0]  # ceil(4 x 0.25) = 1 member copies at each boundary
    run = read_run(layout)
    assert len(run.configs) == 6 and [len(b.members) for b in blocks] == [4, 4, 4, 4]

    for block in blocks[1:3]:
        (copy,) = block.copies
        t = copy["t"]
        assert t == copy["iteration"] * 2 - 1
        # the worst member after the boundary's iteration copied the best, on the hop records' own metrics
        values = {cid: HopRecord.read(store, layout.hop_record_uri(cid, t)).val_metrics["val_accuracy"]
                  for cid in blocks[block.block - 1].members}
        ranked = sorted(values, key=lambda cid: (-values[cid], cid))  # ties: the lower id ranks higher
        assert (copy["parent"], copy["replaced"]) == (ranked[0], ranked[-1])
        assert copy["parent_metric"] == pytest.approx(values[copy["parent"]])
        # the copy's checkpoint holds its parent's weights and Adam moments, under its own id
        parent_state, _ = arrays(store.read_bytes(copy["source_checkpoint"]))
        copied, meta = arrays(store.read_bytes(copy["checkpoint"]))
        assert meta == {"config_id": copy["config_id"], "t": t, "copied_from": copy["parent"]}
        assert parent_state.keys() == copied.keys() and all(np.array_equal(parent_state[k], copied[k])
                                                            for k in copied)
        # its first hop restored that state and trained with its own values
        child = run.config(copy["config_id"])
        parent = run.config(copy["parent"])
        for field, (old, new) in copy["changes"].items():
            value = child["optimizer_params"]["learning_rate"] if field == "learning_rate" else child[field]
            assert value == new and old == (parent["optimizer_params"]["learning_rate"] if field == "learning_rate"
                                            else parent[field])
        first_hop = HopRecord.read(store, layout.hop_record_uri(copy["config_id"], t + 1))
        assert first_hop.input_sha256 == copy["checkpoint_sha256"]
        after, _ = arrays(store.read_bytes(first_hop.checkpoint))
        scalars = [float(v) for k, v in after.items() if k.startswith("optimizer/") and v.shape == ()]
        assert any(v == pytest.approx(child["optimizer_params"]["learning_rate"], rel=1e-6) for v in scalars)
        hops = sorted(store.read_json(uri)["t"] for uri in store.glob(layout.config_hops_glob(copy["config_id"])))
        assert hops == list(range(t + 1, 6))  # its own records from the boundary to the end

    board = store.read_json(layout.report_uri("leaderboard.json"))
    rows = {row["config_id"]: row for row in board["leaderboard"]}
    assert len(rows) == 6 and board["members"] == blocks[3].members
    for copy in board["lineage"]:
        assert rows[copy["replaced"]]["status"] == "pruned"
        assert rows[copy["replaced"]]["outcome"].startswith(f"replaced after iteration {copy['iteration']}: ranked 4 of 4")
        assert rows[copy["config_id"]]["parent"] == copy["parent"]
    for cid in blocks[3].members:
        assert rows[cid]["outcome"].startswith("finished: member ")

    # the results page's family tree: each member's configurations end to end, every copy an edge
    tree = run_results(layout, RunRecord.read(store, layout.run_record_uri))["lineage"]
    assert tree["members"] == 4 and tree["fields"] == ["batch_size", "learning_rate"]
    for m in range(4):
        spans = [(seg["from"], seg["to"]) for seg in tree["segments"] if seg["member"] == m]
        assert spans[0][0] == 0 and spans[-1][1] == 3 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert [(c["replaced"], c["config_id"], c["parent"]) for c in tree["copies"]] == \
        [(c["replaced"], c["config_id"], c["parent"]) for c in board["lineage"]]
    assert board["importance"]["trials"] == 4  # the members that trained to the end

    tries = [ti for ti in airflow.task_instances(KILLED, searches[KILLED])
             if ti["task_id"].startswith("block_1.train_shard_") and ti["state"] == "success"]
    assert max(ti["try_number"] for ti in tries) == 2  # the killed train tasks ran again
    assert lineage(store, KILLED, searches[KILLED]) == lineage(store, UNDISTURBED, first)
    boards = {dag_id: store.read_json(RunLayout(store, dag_id, run).report_uri("leaderboard.json"))["leaderboard"]
              for dag_id, run in searches.items()}
    assert [(r["config_id"], r["outcome"]) for r in boards[KILLED]] == \
        [(r["config_id"], r["outcome"]) for r in boards[UNDISTURBED]]
    for a, b in zip(boards[KILLED], boards[UNDISTURBED]):
        assert (a["val_accuracy"], a["val_loss"]) == pytest.approx((b["val_accuracy"], b["val_loss"]), abs=1e-6)


@pytest.mark.slow
def test_tpe_proposes_the_last_configurations_from_the_first_ones_results_and_a_replay_gives_the_same(airflow):
    store = Store(f"file://{airflow.root / 'store'}")
    first = airflow.trigger(TPE)
    assert airflow.wait_for_run(TPE, first, timeout=420) == "success", failed_logs(airflow, TPE, first)
    layout = RunLayout(store, TPE, first)
    blocks = [BlockDecision.read(store, layout.block_decision_uri(b)) for b in range(3)]
    run = read_run(layout)
    drawn = store.read_json(layout.run_record_uri)["configs"]
    assert len(drawn) == 4 and len(run.configs) == 6  # 4 drawn at random when resolved, 2 proposed
    assert [j["kind"] for j in blocks[0].jobs] == ["start"] * 4 and not blocks[0].proposed
    proposed = [c["config_id"] for c in run.configs[4:]]
    assert blocks[1].proposed == proposed and [j["config_id"] for j in blocks[1].jobs] == proposed
    assert blocks[2].finished and not blocks[2].proposed
    # the proposals are TPE's from the first four's recorded results: rebuilt from the records, the same
    seen = [Completion(**c) for c in blocks[1].completions]
    assert {c.config_id for c in seen} == {c["config_id"] for c in drawn} and all(c.metric for c in seen)
    made = []
    ask = proposer(SearchSpace.from_dict(run.spec["search"]["space"]), drawn, seen, [], top_rung=0,
                   direction="max", block=1, default_epochs_per_hop=1,
                   new_id=lambda c: config_id(4 + len(made), c))
    for _ in range(2):
        made.append(ask())
    assert made == run.configs[4:]
    for cid in proposed:  # each trained its iteration (2 hops) and was evaluated
        assert HopRecord.read(store, layout.hop_record_uri(cid, 1)).val_metrics["val_accuracy"] > 0
    board = store.read_json(layout.report_uri("leaderboard.json"))["leaderboard"]
    assert sorted(r["config_id"] for r in board) == sorted(c["config_id"] for c in run.configs)
    assert all(r["status"] == "finished" for r in board)
