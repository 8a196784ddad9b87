"""ASHA decided inside the shard slots (mop_airflow.planning.asha_slots), from hand-written hop records:
each decision taken once whoever asks first, on file:// and on an S3 endpoint on loopback; promotions
from the completions each decision saw; capacity and the search's end; the DAG holds one block."""

import pytest

from mop_airflow.config import MopSpec
from mop_airflow.planning.asha_slots import Ledger, legs_of
from mop_airflow.planning.task_plan import spec_task_plan
from mop_airflow.records import BlockDecision, HopRecord
from mop_airflow.store import Store
from tests.test_end_to_end import MLP, tiny_spec
from tests.test_results import hop, planned


def asha(root, **options):
    spec = tiny_spec("/data/digits.parquet", root)  # 2 shards
    spec["search"]["space"] = {"method": "random", "seed": 3, "params": {
        "model": [MLP], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2}}}
    spec["search"]["adaptive"] = {"method": "asha", "n": 4, "r": 1, "R": 3, "eta": 3, **options}
    return spec


def trained(layout, cid, hops, accuracy, start):
    """``cid``'s hops ``hops`` recorded, the last one evaluated at ``accuracy``."""
    for k, t in enumerate(hops):
        hop(layout, cid, t, t % 2, start=start + k, acc=accuracy, val=(1 - accuracy, accuracy) if t == hops[-1] else None)


def test_the_dag_holds_one_block_whose_slots_decide_and_no_decide_step():
    plan = spec_task_plan(MopSpec.from_dict(asha("file:///s")))
    trains = [t for t in plan.tasks if t.kind == "train"]
    assert [t.task_id for t in trains] == ["train_shard_0", "train_shard_1"]
    assert all(t.args["asha"] for t in trains) and not [t for t in plan.tasks if t.kind in ("decide", "block_deal")]
    assert [t.task_id for t in plan.tasks if "train_shard_0" in t.upstream] == ["report"]
    tpe = asha("file:///s")  # a model-based ASHA waits for results between blocks
    tpe["search"]["space"].update(sampler="tpe", num_samples=4)
    del tpe["search"]["adaptive"]
    assert "decide" in {t.kind for t in spec_task_plan(MopSpec.from_dict(tpe)).tasks}


def test_slots_decide_in_sequence_promote_from_what_they_saw_and_end_the_search(tmp_path):
    layout, run, plan = planned(Store(f"file://{tmp_path / 'store'}"), asha(f"file://{tmp_path / 'store'}"))
    ids = [c["config_id"] for c in run.configs]
    a, b = Ledger(layout, run, 2, 1), Ledger(layout, run, 2, 1)  # two slots, each with its own view
    assert a.capacity == 4  # two configurations per slot
    first = a.decide(shard=0, slot=0)
    second = b.decide(shard=1, slot=0)  # reads the first one before it decides
    assert [(d.block, d.jobs[0]["config_id"], d.jobs[0]["kind"]) for d in (first, second)] == [
        (0, ids[0], "start"), (1, ids[1], "start")]
    (leg,) = legs_of(second)
    assert (leg.first, leg.end, leg.offset, leg.slot, leg.start.t) == (0, 2, 1, 0, -1)  # its first hop on shard 1
    a.decide(shard=0, slot=0)
    b.decide(shard=1, slot=0)
    assert a.decide(shard=0, slot=0) is None  # 4 in flight: the capacity is full, nothing completed
    # ids[1] and ids[2] complete rung 0; with 2 completions nothing is promotable (floor(2/3) = 0), all started
    trained(layout, ids[1], [0, 1], 0.9, 0)
    trained(layout, ids[2], [0, 1], 0.5, 5)
    assert a.decide(shard=0, slot=0) is None  # n=4 started, nothing promotable, two still in flight
    trained(layout, ids[0], [0, 1], 0.7, 10)  # the third completion: the best of three goes on
    promoted = b.decide(shard=1, slot=0)
    job = promoted.jobs[0]
    assert (job["config_id"], job["kind"], job["rung"], job["iterations"], job["rank"], job["of"]) == (
        ids[1], "promote", 1, 3, 1, 3)
    assert [c["config_id"] for c in promoted.completions] == [ids[1], ids[2], ids[0]]  # in the order saved
    (leg,) = legs_of(promoted)
    assert (leg.first, leg.end, leg.offset, leg.start.t) == (2, 6, 1, 1)  # from its state after hop 1
    assert leg.start.checkpoint == layout.checkpoint_uri(ids[1], 1)
    trained(layout, ids[3], [0, 1], 0.1, 15)
    trained(layout, ids[1], [2, 3, 4, 5], 0.95, 20)
    end = a.decide(shard=0, slot=0)
    assert end.finished and not end.jobs and len(end.completions) == 5
    assert a.decide(shard=0, slot=0) is None and b.decide(shard=1, slot=0) is None  # nothing after the end
    found = sorted(layout.store.glob(layout.block_decision_uri("*")))
    assert [BlockDecision.read(layout.store, u).block for u in found] == list(range(6))


def test_a_failed_hop_completes_its_job_as_a_failure_and_frees_its_place(tmp_path):
    layout, run, plan = planned(Store(f"file://{tmp_path / 'store'}"), asha(f"file://{tmp_path / 'store'}", n=5))
    ids = [c["config_id"] for c in run.configs]
    ledger = Ledger(layout, run, 2, 1)
    for _ in range(4):
        ledger.decide(shard=0, slot=0)
    hop(layout, ids[2], 0, 0, status="failed")
    nxt = ledger.decide(shard=0, slot=0)
    assert nxt.jobs[0]["config_id"] == ids[4] and nxt.completions[0]["status"] == "failed"


def test_a_leg_whose_next_hop_is_on_a_slot_dead_for_good_fails_there_and_the_search_goes_on(tmp_path):
    """Slot simulation seed 539: a job's next hop on a slot that died on its last try. When that hop is
    its leg's last, no slot waits for it; the idle slot that checks the legs in flight records the job
    failed, with the cause, and the next decision takes it as a completion (a failure)."""
    import time

    from mop_airflow.records import SlotStatus
    from mop_airflow.slots.asha_source import AshaSource
    from mop_airflow.training.model_hop import Where
    from mop_airflow.slots.driver import _Loop

    layout, run, plan = planned(Store(f"file://{tmp_path / 'store'}"), asha(f"file://{tmp_path / 'store'}"))
    ids = [c["config_id"] for c in run.configs]
    ledger = Ledger(layout, run, 2, 1)
    ledger.decide(shard=0, slot=0)  # ids[0]: hop 0 on shard 0, hop 1 (the leg's last) on shard 1
    ledger.decide(shard=1, slot=0)  # ids[1]: hop 0 on shard 1, hop 1 on shard 0
    trained(layout, ids[0], [0], 0.5, 0)
    assert [(leg.config_id, t) for leg, t in ledger.next_hops()] == [(ids[0], 1), (ids[1], 0)]

    def shard_1(**fields):
        SlotStatus(block="b0", shard=1, slot=0, state="running", try_number=2, progress=9,
                   **fields).write(layout.store, layout.slot_status_uri("b0", 1, 0))

    def slot_0():
        more = AshaSource(layout, run, shard=0, slot=0, shards=2, slots=1)
        more.new_hops()
        loop = _Loop(layout, run, None, [], [], block="b0", shard=0, slot=0, cache_dir=str(tmp_path / "cache"),
                     where=Where(task_id="train_shard_0", try_number=1), fatal=lambda exc: False, session=object(),
                     on_hop=None, wait=600.0, give_back=30.0, more=more)
        loop.began = time.time()
        loop._fail_dead_legs()
        return loop

    shard_1(heartbeat=time.time() - 700)  # silent 700 s, but a retry follows: it may come back
    assert slot_0().result.failed == [] and len(ledger.next_hops()) == 2
    shard_1(heartbeat=time.time() - 500, last_try=True)  # its last try, silent within the wait bound
    assert slot_0().result.failed == []
    shard_1(heartbeat=time.time() - 700, last_try=True)  # its last try, silent past the wait bound: dead
    # ids[1]'s next hop, its first, is on the dead slot too: recorded failed the same way
    failed = slot_0().result.failed
    assert [(f.config_id, f.t, f.shard, f.status) for f in failed] == [(ids[0], 1, 1, "failed"), (ids[1], 0, 1, "failed")]
    assert "its hop 1 on shard 1 never trained: shard 1 slot 0 died on its last try 2" in failed[0].error
    assert HopRecord.read(layout.store, layout.hop_record_uri(ids[0], 1)).error == failed[0].error
    nxt = ledger.decide(shard=0, slot=0)
    assert {c["config_id"]: c["status"] for c in nxt.completions} == {ids[0]: "failed", ids[1]: "failed"}
    assert [leg.config_id for leg, _ in ledger.next_hops()] == [nxt.jobs[0]["config_id"]]  # only the new job


def test_a_hop_given_up_is_taken_back_once_its_input_is_found_in_the_store_though_no_marker_named_it(tmp_path):
    """The slot protocol's simulation (seeds 136875, 212597): a hop given up while its slot was gone, whose
    input that slot committed after all with a marker no listing shows. A waiting hop's input was looked
    up after a minute; a given-up hop's never was, and an ASHA slot kept it given up for ever."""
    import time

    from mop_airflow.slots.asha_source import AshaSource
    from mop_airflow.training.model_hop import Where
    from mop_airflow.slots.driver import _Loop

    layout, run, plan = planned(Store(f"file://{tmp_path / 'store'}"), asha(f"file://{tmp_path / 'store'}"))
    ids = [c["config_id"] for c in run.configs]
    Ledger(layout, run, 2, 1).decide(shard=1, slot=0)  # ids[0]: hop 0 on shard 1, hop 1 on shard 0
    from mop_airflow.slots.messages import Decide, Train

    more = AshaSource(layout, run, shard=0, slot=0, shards=2, slots=1)
    loop = _Loop(layout, run, None, [], [], block="b0", shard=0, slot=0, cache_dir=str(tmp_path / "cache"),
                 where=Where(task_id="train_shard_0", try_number=1), fatal=lambda exc: False, session=object(),
                 on_hop=None, wait=600.0, give_back=30.0, more=more)
    machine = loop.machine
    loop._extend(more.new_hops())
    (hop,) = machine.pending
    assert (hop.config_id, hop.hop, hop.shard) == (ids[0], 1, 0)
    machine.pending.remove(hop)  # given up: shard 1 slot 0 made no progress within the wait bound
    machine.given_up[ids[0], 1] = hop
    machine.untrained[hop.label] = "shard 1 slot 0 made no progress for 600 s"
    machine.looked_at[ids[0], 1] = time.time()
    trained(layout, ids[0], [0], 0.5, 0)  # it came back and committed hop 0: a record, no marker listed
    assert isinstance(loop._next(), Decide)  # nothing to train: the search decides
    assert machine.pending == [] and (ids[0], 1) in machine.given_up  # looked up at most once a LOOK_SECONDS
    machine.looked_at[ids[0], 1] -= 61
    act = loop._next()  # looked up: taken back, and trained
    assert isinstance(act, Train) and [h for h, _ in act.members] == [hop] and act.members[0][1].t == 0
    assert machine.given_up == {} and machine.untrained == {}


@pytest.mark.parametrize("where", ["file", "s3"])
def test_a_decision_is_taken_once_whoever_asks_first(where, tmp_path, request):
    if where == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        import boto3

        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
                     region_name="us-east-1").create_bucket(Bucket="asha-decisions")
        store = Store("s3://asha-decisions/root", options={"key": "k", "secret": "s",
                                                           "client_kwargs": {"endpoint_url": endpoint}})
    else:
        store = Store(f"file://{tmp_path / 'store'}")
    layout, run, plan = planned(store, asha(store.root))
    a, b = Ledger(layout, run, 2, 1), Ledger(layout, run, 2, 1)
    a.decide(shard=0, slot=0)
    b.read = lambda: []  # b has not seen decision 0 yet: it asks for the same one
    mine = b.decide(shard=1, slot=0)
    assert mine.block == 0 and mine.jobs[0]["decided_on"] == [0, 0]  # the first writer's, read back
    assert store.read_json(layout.block_decision_uri(0))["jobs"][0]["decided_on"] == [0, 0]
    assert store.create_json(layout.block_decision_uri(0), {"x": 1}) is False
