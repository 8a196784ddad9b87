"""A store you can trust: S3's create-if-absent under 409 conflicts, the preflight proof that a store
honours it, and a stale checkpoint's failed delete that never fails a trained configuration.

Against a real S3 endpoint on loopback (moto's server). The answers S3 gives and moto does not (409
ConditionalRequestConflict, 403 AccessDenied on DeleteObject) and an endpoint that ignores
``If-None-Match`` are made at the client's botocore layer for exactly the requests named; every other
request goes to the endpoint.
"""

from __future__ import annotations

import logging
import threading

import boto3
import pytest

from mop_airflow.errors import SpecError, StoreError
from mop_airflow.store import Store, check_create_if_absent
from tests.conftest import make_bucket

CONFLICT = (409, "ConditionalRequestConflict", "The conditional request cannot succeed due to a conflicting "
                                               "operation against this resource.")
DENIED = (403, "AccessDenied", "Access Denied")


@pytest.fixture(scope="module")
def toy_data():
    """The training tests' toy data: 100 rows, 6 features, 3 classes that depend on them."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")


def s3_store(endpoint: str, bucket: str, *, new: bool = True) -> Store:
    """A store on ``bucket``, with an S3 client of its own (``skip_instance_cache``: the answers made
    up below stay on it) and one botocore attempt per call."""
    if new:
        make_bucket(endpoint, bucket)
    return Store(f"s3://{bucket}/runs", {"key": "test", "secret": "test", "skip_instance_cache": True,
                                         "client_kwargs": {"endpoint_url": endpoint},
                                         "config_kwargs": {"retries": {"max_attempts": 1}}})


def client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                        region_name="us-east-1")


def keys(endpoint: str, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in client(endpoint).list_objects_v2(Bucket=bucket).get("Contents", []))


class Answers:
    """Answers ``operation`` requests of ``store``'s S3 client with an S3 error instead of sending them,
    while ``when(request)`` says so; records every such request it saw, answered or sent."""

    def __init__(self, store: Store, operation: str, error: tuple[int, str, str], when) -> None:
        self.error, self.when = error, when
        self.seen: list[tuple[str, bool]] = []  # (key, answered here)
        store.fs.connect()
        store.fs.s3.meta.events.register(f"before-send.s3.{operation}", self._before_send)

    def _before_send(self, request, **_):
        from aiobotocore.awsrequest import AioAWSResponse

        key = request.url.split("?")[0].split("/", 4)[-1]
        answer = self.when(request, key)
        self.seen.append((key, answer))
        if not answer:
            return None  # to the endpoint
        status, code, message = self.error
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
                f"<RequestId>made-up</RequestId></Error>").encode()

        class Body:
            async def read(self):
                return body

        return AioAWSResponse(request.url, status, {"Content-Type": "application/xml"}, Body())


def conditional(request) -> bool:
    return request.headers.get("If-None-Match") in ("*", b"*")


# -- 409 ConditionalRequestConflict ---------------------------------------------------------------------

def test_moto_honours_create_if_absent(s3_endpoint):
    store = s3_store(s3_endpoint, "trust-moto")
    uri = store.uri("d", "r", "decision.json")
    assert store.create_json(uri, {"by": "first"}) is True
    assert store.create_json(uri, {"by": "second"}) is False  # 412 PreconditionFailed: the first stays
    assert store.read_json(uri) == {"by": "first"}


def test_a_409_conflict_is_tried_again_and_the_retry_wins_when_nothing_was_written(s3_endpoint):
    store = s3_store(s3_endpoint, "trust-409-won")
    uri = store.uri("d", "r", "decision.json")
    first = Answers(store, "PutObject", CONFLICT, lambda request, key: conditional(request) and len(first.seen) == 0)
    assert store.create_json(uri, {"by": "me"}) is True
    assert first.seen == [("runs/d/r/decision.json", True), ("runs/d/r/decision.json", False)]
    assert store.read_json(uri) == {"by": "me"}


def test_a_409_conflict_is_tried_again_and_the_retry_loses_to_the_write_that_conflicted(s3_endpoint):
    store = s3_store(s3_endpoint, "trust-409-lost")
    uri = store.uri("d", "r", "decision.json")

    def conflict_with_another_writer(request, key):
        if not conditional(request) or answers.seen:
            return False
        # the concurrent conditional PUT that the 409 is about lands, on the endpoint
        client(s3_endpoint).put_object(Bucket="trust-409-lost", Key=key, Body=b'{"by": "other"}', IfNoneMatch="*")
        return True

    answers = Answers(store, "PutObject", CONFLICT, conflict_with_another_writer)
    assert store.create_json(uri, {"by": "me"}) is False  # the retry's 412 decides: the other writer won
    assert [answered for _, answered in answers.seen] == [True, False]
    assert store.read_json(uri) == {"by": "other"}


def test_two_writers_answered_409_at_once_make_exactly_one_winner(s3_endpoint):
    stores = [s3_store(s3_endpoint, "trust-409-race", new=not i) for i in range(2)]
    uri = stores[0].uri("d", "r", "decision.json")
    answers = []
    for store in stores:  # each writer's first conditional PUT is answered 409, as AWS does for a race
        answers.append(Answers(store, "PutObject", CONFLICT,
                               lambda request, key, i=len(answers): conditional(request) and len(answers[i].seen) == 0))
    barrier, won = threading.Barrier(2), {}

    def create(i):
        barrier.wait()
        won[i] = stores[i].create_json(uri, {"by": i})

    threads = [threading.Thread(target=create, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(won.values()) == [False, True]
    winner = next(i for i, w in won.items() if w)
    assert stores[0].read_json(uri) == {"by": winner}
    assert all(a.seen[0][1] and len(a.seen) == 2 for a in answers)  # each tried again once after its 409


def test_a_409_that_persists_ends_in_an_error_naming_the_endpoint_worth_a_task_retry(s3_endpoint, monkeypatch):
    import mop_airflow.store as store_module

    monkeypatch.setattr(store_module, "CONFLICT_FIRST_DELAY", 0.01)
    store = s3_store(s3_endpoint, "trust-409-stuck")
    uri = store.uri("d", "r", "decision.json")
    answers = Answers(store, "PutObject", CONFLICT, lambda request, key: conditional(request))
    with pytest.raises(StoreError, match=rf"the store at {s3_endpoint} answered 5 conditional creates of {uri} with "
                                         r"a 409 conflict: .*ConditionalRequestConflict.*Fix: ") as info:
        store.create_json(uri, {"by": "me"})
    assert info.value.transient and len(answers.seen) == store_module.CONFLICT_TRIES
    assert not store.exists(uri)


def test_other_refusals_of_a_create_are_not_taken_for_a_lost_race(s3_endpoint):
    store = s3_store(s3_endpoint, "trust-403-put")
    Answers(store, "PutObject", DENIED, lambda request, key: conditional(request))
    with pytest.raises(PermissionError):
        store.create_json(store.uri("d", "r", "decision.json"), {"by": "me"})


# -- the preflight proof --------------------------------------------------------------------------------

def test_preflight_passes_a_store_that_honours_create_if_absent_and_leaves_nothing(s3_endpoint, tmp_path):
    store = s3_store(s3_endpoint, "trust-probe-ok")
    check_create_if_absent(store, store.uri("dag", "run1"))
    assert keys(s3_endpoint, "trust-probe-ok") == []  # the probe key is gone
    local = Store(f"file://{tmp_path / 'store'}")
    check_create_if_absent(local, local.uri("dag", "run1"))
    assert [p for p in (tmp_path / "store").rglob("*") if p.is_file()] == []
    assert not (tmp_path / "store" / "dag" / "run1").exists()  # nor the run's folder it made
    (tmp_path / "store" / "dag" / "run2").mkdir(parents=True)
    check_create_if_absent(local, local.uri("dag", "run2"))
    assert (tmp_path / "store" / "dag" / "run2").is_dir()  # a folder that was there stays
    check_create_if_absent(Store("memory://trust-probe"), "memory://trust-probe/dag/run1")


def test_preflight_refuses_an_endpoint_that_ignores_if_none_match(s3_endpoint):
    store = s3_store(s3_endpoint, "trust-probe-fake")

    def drop_the_condition(params, **_):  # what such an endpoint does with the header: nothing
        params.pop("IfNoneMatch", None)

    store.fs.connect()
    store.fs.s3.meta.events.register("before-parameter-build.s3.PutObject", drop_the_condition)
    with pytest.raises(SpecError) as info:
        check_create_if_absent(store, store.uri("dag", "run1"))
    message = str(info.value)
    assert message.startswith("store.root='s3://trust-probe-fake/runs': ")
    assert f"the store at {s3_endpoint} does not honour create-if-absent" in message
    assert "two creates of the probe key s3://trust-probe-fake/runs/dag/run1/.create-probe-" in message
    assert "both creates succeeded" in message
    assert ("Fix: use an S3-compatible store that supports conditional writes (a PUT with If-None-Match: *"
            in message) and "or a file:// store" in message
    assert keys(s3_endpoint, "trust-probe-fake") == []  # cleaned up after the refusal too


def test_preflight_refuses_an_endpoint_that_does_not_implement_conditional_writes(s3_endpoint):
    store = s3_store(s3_endpoint, "trust-probe-501")
    Answers(store, "PutObject", (501, "NotImplemented", "A header you provided implies functionality that is not "
                                                        "implemented"), lambda request, key: conditional(request))
    with pytest.raises(SpecError, match=rf"store.root='s3://trust-probe-501/runs': the store at {s3_endpoint} refused "
                                        r"to create the new key .* if absent: .*not implemented.*Fix: use an "
                                        r"S3-compatible store that supports conditional writes"):
        check_create_if_absent(store, store.uri("dag", "run1"))


def test_the_preflight_task_refuses_the_store_before_anything_trains(s3_endpoint, monkeypatch, tmp_path):
    """The operator's own work: a store that fakes create-if-absent fails preflight, for good."""
    from types import SimpleNamespace

    import mop_airflow.operators.preflight as preflight
    from tests.training.toys import toy_spec

    make_bucket(s3_endpoint, "trust-preflight")
    fakes = []
    real_open = preflight.open_spec_store

    def open_faking(spec, **kwargs):
        store = real_open(spec, **kwargs)
        store.fs.connect()
        store.fs.s3.meta.events.register("before-parameter-build.s3.PutObject",
                                         lambda params, **_: params.pop("IfNoneMatch", None))
        fakes.append(store)
        return store

    monkeypatch.setattr(preflight, "open_spec_store", open_faking)
    monkeypatch.setattr(preflight.MopPreflightOperator, "_pools", lambda self, schedule: [])
    import numpy as np

    spec = toy_spec(tmp_path, np.zeros((20, 6), "float32"), np.zeros(20, "int64"))
    spec["store"] = {"root": "s3://trust-preflight/runs", "cache_dir": str(tmp_path / "cache"),
                     "storage_options": {"key": "test", "secret": "test", "skip_instance_cache": True,
                                         "client_kwargs": {"endpoint_url": s3_endpoint}}}
    task = preflight.MopPreflightOperator(task_id="preflight", spec=spec)
    context = {"run_id": "manual__1", "dag": SimpleNamespace(dag_id="trust_dag", has_task=lambda _: False),
               "dag_run": SimpleNamespace(conf={}), "params": {}}
    with pytest.raises(SpecError, match=r"does not honour create-if-absent: two creates of the probe key "
                                        r"s3://trust-preflight/runs/trust_dag/manual__1/\.create-probe-"):
        task.work(context)
    assert fakes and keys(s3_endpoint, "trust-preflight") == []
    monkeypatch.setattr(preflight, "open_spec_store", real_open)  # an honest endpoint: the run resolves
    assert task.work(context)["run_id"] == "manual__1"
    assert keys(s3_endpoint, "trust-preflight") == []


# -- a failed cleanup ------------------------------------------------------------------------------------

def test_a_delete_denied_for_good_warns_tries_again_a_bounded_number_of_times_then_leaves_it(s3_endpoint, caplog):
    from mop_airflow.training.model_hop import CLEANUP_TRIES, Cleanup

    store = s3_store(s3_endpoint, "trust-cleanup-bound")
    stale = [store.uri("d", "r", "checkpoints", "c1", f"t00{t}.npz") for t in range(2)]
    for uri in stale:
        store.write_bytes(uri, b"state")
    denied = Answers(store, "DeleteObject", DENIED, lambda request, key: True)
    cleanup = Cleanup()
    with caplog.at_level(logging.WARNING, logger="mop_airflow.training.model_hop"):
        cleanup.delete(store, stale[:1])
        assert cleanup.waiting(store) == stale[:1]
        cleanup.delete(store, stale[1:])  # the next commit: its own stale checkpoint and the one before
        assert cleanup.waiting(store) == stale
        for _ in range(CLEANUP_TRIES):
            cleanup.retry(store)
    assert cleanup.waiting(store) == []
    tried = [key.rsplit("/", 1)[1] for key, _ in denied.seen]
    assert tried == ["t000.npz", "t000.npz", "t001.npz", "t000.npz", "t001.npz", "t001.npz"]  # 3 tries each, no more
    messages = [r.getMessage() for r in caplog.records if r.name == "mop_airflow.training.model_hop"]
    assert f"could not delete the stale checkpoint {stale[0]} (PermissionError: Access Denied)" in messages[0]
    assert sum(m.startswith(f"gave up deleting the stale checkpoint {stale[0]} after 3 tries") for m in messages) == 1
    assert all(store.exists(uri) for uri in stale)  # left, unused, as the warning says


@pytest.mark.integration
def test_a_denied_delete_of_a_stale_checkpoint_never_fails_its_configuration(s3_endpoint, toy_data, tmp_path,
                                                                             caplog):
    """A whole block in one slot on S3 whose first DeleteObject is refused (403): every hop is
    recorded ok, no configuration fails, the refusal is logged, and the next commit deletes it."""
    from mop_airflow.data.shard import shard_dataset
    from mop_airflow.planning.resolve import resolve_run
    from mop_airflow.planning.schedule import deal_classes
    from mop_airflow.records import Assignment, HopRecord
    from mop_airflow.records.layout import RunLayout
    from mop_airflow.training.model_hop import CLEANUP
    from mop_airflow.planning.placement import block_hops
    from mop_airflow.slots.driver import run_slot
    from tests.training.toys import toy_spec

    make_bucket(s3_endpoint, "trust-cleanup")
    spec = toy_spec(tmp_path, *toy_data, shards=2, iterations=2)
    options = {"key": "test", "secret": "test", "skip_instance_cache": True,
               "client_kwargs": {"endpoint_url": s3_endpoint}, "config_kwargs": {"retries": {"max_attempts": 1}}}
    spec["store"] = {"root": "s3://trust-cleanup/runs", "cache_dir": str(tmp_path / "cache"),
                     "storage_options": options}
    run = resolve_run(spec, None, dag_id="d", run_id="r")
    layout = RunLayout(Store(run.store.root, options), "d", "r")
    manifest = shard_dataset(run.data, layout.store, "d", 2, run.schedule.seed)
    denied = Answers(layout.store, "DeleteObject", DENIED, lambda request, key: len(denied.seen) == 0)
    ids = [c["config_id"] for c in run.configs]
    classes = [[Assignment(cid, -1, None) for cid in members] for members in deal_classes(ids, shards=2, seed=run.schedule.seed)]
    hops = block_hops(classes, shards=2, slots=1, start=0, end=4)
    with caplog.at_level(logging.WARNING, logger="mop_airflow.training.model_hop"):
        result = run_slot(layout, run, manifest, hops, block="b0", shard=0, slot=0, mine=hops,
                          cache_dir=run.store.local_cache)
    assert not result.failed and len(result.trained) == len(hops) == 8
    assert all(HopRecord.read(layout.store, layout.hop_record_uri(cid, t)).status == "ok"
               for cid in ids for t in range(4))
    refused = denied.seen[0][0]
    assert denied.seen[0][1] and refused.endswith(".npz")
    assert f"could not delete the stale checkpoint s3://trust-cleanup/{refused} (PermissionError: Access Denied)" \
        in caplog.text
    assert (refused, False) in denied.seen[1:]  # tried again with a later commit, and deleted
    assert not layout.store.exists(f"s3://trust-cleanup/{refused}") and CLEANUP.waiting(layout.store) == []
    for cid in ids:  # what keep_checkpoints=2 keeps: the last two and the best
        best = HopRecord.read(layout.store, layout.hop_record_uri(cid, 3)).best_t
        kept = sorted(int(u.rsplit("/t", 1)[1][:3]) for u in layout.store.glob(f"{layout.run_uri}/checkpoints/{cid}/*"))
        assert kept == sorted({2, 3, best})


# -- writes fenced by try (two copies of one slot) -------------------------------------------------------

@pytest.mark.parametrize("where", ["s3", "file"])
def test_a_checkpoint_created_if_absent_is_never_replaced_and_costs_one_request(s3_endpoint, tmp_path, where):
    """A slot's commit creates its checkpoint and its record only where none is: on S3 one PUT that carries
    If-None-Match: * (seen at the endpoint's client), refused with 412 when a copy of the slot was first."""
    store = s3_store(s3_endpoint, "trust-fence") if where == "s3" else Store(f"file://{tmp_path}/runs")
    sent = []
    if where == "s3":
        Answers(store, "PutObject", DENIED, lambda request, key: sent.append(conditional(request)) and False)
    uri = store.uri("d", "r", "checkpoints", "c0", "t003.npz")
    first, second = bytes(range(256)) * 24_000, b"another copy's bytes" * 300_000  # 6 MB each: one PUT still
    assert store.create_bytes(uri, first) is True
    assert store.create_bytes(uri, second) is False
    assert store.read_bytes(uri) == first
    if where == "s3":
        assert sent == [True, True]  # two conditional PUTs, nothing else written
        assert keys(s3_endpoint, "trust-fence") == ["runs/d/r/checkpoints/c0/t003.npz"]
    else:
        assert sorted(p.name for p in (tmp_path / "runs/d/r/checkpoints/c0").iterdir()) == ["t003.npz"]
