"""The step between two blocks of an adaptive search (mop_airflow.planning.blocks), on hand-made records."""

import pytest

from mop_airflow.planning.blocks import completions, next_classes
from mop_airflow.records import HopRecord
from mop_airflow.search.jobs import Job


def hop(cid, t, saved, val=None, status="ok", error=None):
    return HopRecord(config_id=cid, t=t, iteration=t // 2, hop=t % 2, shard=0, status=status, saved_at=saved,
                     val_metrics=val, error=error)


def test_completions_come_in_the_order_their_last_hop_was_saved_and_say_how_each_job_ended():
    jobs = [Job("a", 0, "start", 1), Job("b", 0, "start", 1), Job("c", 1, "promote", 3, bracket=2),
            Job("d", 0, "start", 1), Job("e", 0, "start", 2)]
    records = [hop("a", 0, 1.0), hop("a", 1, 9.0, {"val_loss": 0.4}),          # a: rung 0 done at 9.0
               hop("b", 0, 2.0), hop("b", 1, 5.0, {"val_loss": 0.2}),          # b: done first, at 5.0
               hop("c", 2, 3.0), hop("c", 3, 4.0, status="failed", error="OOM"),  # c failed in its job
               hop("d", 0, 3.0), hop("d", 1, 6.0, {"val_loss": float("nan")}),  # d: a loss that blew up
               hop("e", 0, 3.5), hop("e", 1, 7.0, {"val_loss": 0.1})]          # e: its job is 2 iterations
    found = completions(records, jobs, shards=2, metric="val_loss")
    assert [(c.config_id, c.rung, c.metric, c.status) for c in found] == [
        ("c", 1, None, "failed"), ("b", 0, 0.2, "ok"), ("d", 0, None, "diverged"), ("a", 0, 0.4, "ok")]
    assert found[0].error == "OOM" and found[0].bracket == 2  # e is still training: nothing for it


def test_the_next_blocks_classes_keep_a_rotation_inside_a_job_and_spread_new_jobs():
    classes, offsets = next_classes({"a": 2, "b": 2, "c": 0, "d": 2}, ["c", "d"], shards=2,
                                    rotation={"a": 0, "b": 1, "d": 1})
    # a and b keep their rotations: next hop 2 is on shard 0 for a, shard 1 for b; c (new) and d
    # (promoted: a new job may take any rotation) join the emptier class, the lower first
    assert classes == [["a", "c"], ["b", "d"]]
    assert offsets == {"a": 0, "b": 1, "c": 0, "d": 1}
    classes, _ = next_classes({}, ["x", "y", "z"], shards=2, rotation={})
    assert classes == [["x", "z"], ["y"]]


def test_a_block_after_the_search_ended_in_the_same_run_deals_nothing_and_a_missing_decision_is_an_error(tmp_path):
    """A run of several blocks: the decide steps after the one that found nothing left write no
    decision, so their blocks' train tasks find none and train nothing; a decision missing while the
    search goes on is a StoreError that says which decide task to clear."""
    import pytest

    from mop_airflow.errors import StoreError
    from mop_airflow.planning.blocks import decision_or_end
    from mop_airflow.planning.resume import decision_classes
    from mop_airflow.records import BlockDecision
    from mop_airflow.records.layout import RunLayout
    from mop_airflow.store import Store

    layout = RunLayout(Store(f"file://{tmp_path}"), "d", "r")
    BlockDecision(block=0, capacity=2, training={"a": 0}, offsets={"a": 0}, lineup=[["a"], []]).write(
        layout.store, layout.block_decision_uri(0))
    items = decision_classes(layout, decision_or_end(layout, 0))
    assert [[(a.config_id, a.t, a.checkpoint) for a in per] for per in items] == [[("a", -1, None)], []]
    with pytest.raises(StoreError, match="no decision for block 2 .* Fix: clear the decide task of block 1"):
        decision_or_end(layout, 1)
    BlockDecision(block=1, capacity=2, finished=True, lineup=[[], []]).write(layout.store, layout.block_decision_uri(1))
    assert decision_or_end(layout, 1).finished and decision_or_end(layout, 2) is None
    assert decision_or_end(layout, 5) is None



def test_an_asha_budget_trains_one_per_slot_ends_where_no_leg_fits_and_says_why(tmp_path):
    """ASHA with a budget of 6 iterations on 2 shards x 1 slot, decided from hand-written hop records:
    2 configurations at once for 3 blocks. The best of the first four is in the top third of rung 0,
    but in block 2 its 2 more iterations would end after block 2, so the search ends and its row says why."""
    from mop_airflow.planning.blocks import decide_next_block, first_block
    from mop_airflow.results.report import block_outcome
    from mop_airflow.results.runs import load_block_decisions
    from mop_airflow.store import Store
    from tests.test_end_to_end import MLP, tiny_spec
    from tests.test_results import hop, planned

    spec = tiny_spec("/data/digits.parquet", f"file://{tmp_path / 'store'}")  # 2 shards
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {
        "model": [MLP], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2}}}
    spec["search"]["adaptive"] = {"method": "asha", "n": 4, "r": 1, "R": 3, "eta": 3, "budget": 6}
    layout, run, plan = planned(Store(spec["store"]["root"]), spec)
    ids = [c["config_id"] for c in run.configs]
    accuracy = dict(zip(ids, (0.5, 0.8, 0.6, 0.7)))

    def trained(cids, start):
        for k, cid in enumerate(cids):
            for t in (0, 1):
                hop(layout, cid, t, t, start=start + k + t, acc=accuracy[cid],
                    val=(1.0 - accuracy[cid], accuracy[cid]) if t == 1 else None)

    blocks = [first_block(layout, run, plan)]
    assert blocks[0].capacity == 2 and [(j["config_id"], j["kind"]) for j in blocks[0].jobs] == [
        (ids[0], "start"), (ids[1], "start")]
    trained(ids[:2], 0)
    blocks.append(decide_next_block(layout, run, plan, 0))  # two completions: none promotable, two start
    assert [(j["config_id"], j["kind"]) for j in blocks[1].jobs] == [(ids[2], "start"), (ids[3], "start")]
    trained(ids[2:], 10)
    blocks.append(decide_next_block(layout, run, plan, 1))
    assert blocks[2].jobs == [] and blocks[2].training == {} and blocks[2].finished

    board = [{"config_id": cid, "status": "finished"} for cid in ids]
    block_outcome(load_block_decisions(layout), plan, board, "val_accuracy", "max")
    best = next(row for row in board if row["config_id"] == ids[1])
    assert best["outcome"] == (
        "stopped at rung 0 (1 iteration(s)): ranked 1 of 4 that completed it; ASHA promotes from the best 1/3 "
        "(0 promoted); it was among them, but its 2 more iteration(s) to rung 1 would not have ended within the "
        "3 blocks the budget of 6 iterations lasts")
    assert all("budget" not in row["outcome"] for row in board if row["config_id"] != ids[1])


@pytest.mark.parametrize("failed", [False, True])
def test_a_pbt_search_begun_before_blocks_ran_to_the_boundary_goes_on_to_it_before_anyone_is_ranked(failed, tmp_path):
    """A PBT decision written before the upgrade is one iteration long (``hops`` 0) and may end in the
    middle of a segment: the members are still on it, so the next block takes them to the boundary and
    nobody is ranked or copied before, even when one of them failed in that iteration (it is replaced at
    the boundary; planning/blocks.py, ``_pbt_jobs``)."""
    import dataclasses

    from mop_airflow.planning.blocks import decide_next_block, first_block
    from mop_airflow.store import Store
    from tests.test_end_to_end import MLP, tiny_spec
    from tests.test_results import hop, planned

    spec = tiny_spec("/data/digits.parquet", f"file://{tmp_path / 'store'}")  # 2 shards
    rate = {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2}
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {"model": [MLP], "learning_rate": rate}}
    spec["search"]["adaptive"] = {"method": "pbt", "population": 2, "iterations": 4, "interval": 2,
                                  "mutations": {"learning_rate": rate}}
    layout, run, plan = planned(Store(spec["store"]["root"]), spec)
    first = first_block(layout, run, plan)
    assert first.hops == 4 and sorted(first.ends) == sorted(first.training)  # now: to the boundary, 2 iterations
    old = dataclasses.replace(first, hops=0, ends=[])  # as written before: one iteration
    old.write(layout.store, layout.block_decision_uri(0))
    members = sorted(first.training)
    for k, cid in enumerate(members):
        for t in (0, 1):
            hop(layout, cid, t, t, start=k + t, acc=0.5 + k / 10, status="failed" if failed and k == 1 else "ok")
    after = decide_next_block(layout, run, plan, 0)
    going_on = members[:1] if failed else members
    assert after.jobs == [] and after.copies == [] and len(after.completions) == int(failed)
    assert after.training == dict.fromkeys(going_on, 2) and after.hops == 2  # on to the boundary
    assert sorted(after.ends) == going_on and after.members == old.members
