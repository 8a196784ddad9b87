"""The store over local disk and over a real S3 endpoint on loopback (moto's server mode)."""

import json
import os

import pytest

from mop_airflow.errors import StoreError
from mop_airflow.records.layout import RunLayout
from mop_airflow.hooks.connections import open_spec_store
from mop_airflow.config import StoreSpec
from mop_airflow.store import Store, safe_segment
from tests.conftest import make_bucket


def test_local_writes_are_atomic_and_leave_no_temp_files(tmp_path):
    store = Store(f"file://{tmp_path}")
    uri = store.uri("dag", "run", "a.json")
    store.write_json(uri, {"x": 1})
    store.write_json(uri, {"x": 2})
    assert store.read_json(uri) == {"x": 2}
    assert sorted(p.name for p in (tmp_path / "dag" / "run").iterdir()) == ["a.json"]
    assert store.bytes_written > 0 and store.bytes_read > 0
    with pytest.raises(StoreError, match="not found"):
        store.read_bytes(store.uri("dag", "missing.json"))
    with pytest.raises(StoreError, match="full URI"):
        store.uri("file:///elsewhere")


def test_run_layout_is_path_safe(tmp_path):
    layout = RunLayout(Store(f"file://{tmp_path}"), "my_dag", "manual__2026-01-01T00:00:00+00:00")
    assert layout.checkpoint_uri("c001-abc", 7).endswith("/my_dag/manual__2026-01-01T00_00_00_00_00/checkpoints/c001-abc/t007.npz")
    assert safe_segment("a/b:c") == "a_b_c"
    # a run id of dots only would name the folder above the run's: it cannot
    assert [safe_segment(v) for v in ("..", ".", "", "v1.2")] == ["__", "_", "_", "v1.2"]
    assert RunLayout(Store(f"file://{tmp_path}"), "dag", "..").run_uri == f"file://{tmp_path}/dag/__"


def test_s3_store_with_fsspec_options(s3_endpoint, tmp_path):
    make_bucket(s3_endpoint, "mop-options")
    store = Store("s3://mop-options/prefix", {"key": "test", "secret": "test",
                                              "client_kwargs": {"endpoint_url": s3_endpoint}})
    uri = store.uri("dag", "run", "checkpoints", "c1", "t000.npz")
    store.write_bytes(uri, b"\x00" * 1000)
    assert store.exists(uri) and store.read_bytes(uri) == b"\x00" * 1000
    assert store.glob(store.uri("dag", "run", "checkpoints", "*", "t*.npz")) == [uri]
    local = tmp_path / "copy.bin"
    store.get_file(uri, str(local))
    assert local.read_bytes() == b"\x00" * 1000
    assert store.local_path(uri) is None


def test_s3_store_with_an_airflow_connection(s3_endpoint, monkeypatch):
    make_bucket(s3_endpoint, "mop-conn")
    conn = {"conn_type": "aws", "login": "test", "password": "test", "extra": {"endpoint_url": s3_endpoint}}
    monkeypatch.setenv("AIRFLOW_CONN_MOP_S3", json.dumps(conn))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    store = open_spec_store(StoreSpec(root="s3://mop-conn", conn_id="mop_s3"))
    store.write_json(store.uri("x.json"), {"ok": True})
    assert store.read_json(store.uri("x.json")) == {"ok": True}
    assert os.environ.get("AWS_ACCESS_KEY_ID") is None  # credentials went to s3fs, not the environment


def _s3_store(endpoint, bucket, **kwargs):
    make_bucket(endpoint, bucket)
    # one botocore attempt per store call: the store's own retries are what is under test
    return Store(f"s3://{bucket}/runs", {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint},
                                         "config_kwargs": {"retries": {"max_attempts": 1}}}, **kwargs)


def test_an_s3_endpoint_away_for_a_few_seconds_is_waited_for_and_nothing_is_lost(restartable_s3, caplog):
    store = _s3_store(restartable_s3.endpoint, "mop-outage")
    before = store.uri("dag", "run", "before.bin")
    store.write_bytes(before, b"written before" * 1000)
    comeback = restartable_s3.outage(3.0)
    after = store.uri("dag", "run", "after.bin")
    with caplog.at_level("WARNING", logger="mop_airflow.store"):
        store.write_bytes(after, b"written during" * 1000)  # waits for the endpoint, then one whole PUT
    comeback.join()
    assert any(f"the store at {restartable_s3.endpoint} did not answer while writing {after}" in r.getMessage()
               for r in caplog.records)
    assert store.read_bytes(before) == b"written before" * 1000
    assert store.read_bytes(after) == b"written during" * 1000
    assert store.glob(store.uri("dag", "run", "*")) == [after, before]


def test_a_longer_outage_fails_naming_the_endpoint_and_a_later_try_recovers(restartable_s3):
    store = _s3_store(restartable_s3.endpoint, "mop-long-outage", retry_seconds=1.0)
    uri = store.uri("dag", "run", "state.bin")
    store.write_bytes(uri, b"state")
    restartable_s3.stop()
    with pytest.raises(StoreError, match=rf"the store at {restartable_s3.endpoint} did not answer for \d+ s "
                                         rf"\(\d+ tries\) while reading {uri}: EndpointConnectionError: .*"
                                         r"Fix: check that the endpoint is up") as info:
        store.read_bytes(uri)
    assert info.value.transient
    restartable_s3.start()  # what Airflow's task retry sees a little later
    assert store.read_bytes(uri) == b"state"


def test_a_missing_object_is_not_waited_for(tmp_path):
    store = Store(f"file://{tmp_path}", retry_seconds=30)
    with pytest.raises(StoreError, match="not found in the store") as info:
        store.read_bytes(store.uri("missing.bin"))
    assert not info.value.transient


def test_a_full_disk_counts_as_worth_a_retry_not_as_a_refusal():
    import errno

    from mop_airflow.store import transient

    assert transient(OSError(errno.ENOSPC, "No space left on device"))
    assert not transient(PermissionError(errno.EACCES, "Permission denied"))
    assert not transient(ValueError("units=200 is too wide"))
