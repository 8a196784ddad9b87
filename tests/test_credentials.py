"""Credentials come only from Airflow connections and never leave them.

A run with its data and store on S3, whose connection's secret key is a marker string, trains to
the end (so the secret was used); then every object in the bucket, every file the run left on
local disk (cache, DAG files, the metadata database with its XComs, logs) and everything printed
or logged is searched for the marker.
"""

import json
import os
import subprocess
import sys
import uuid

import pytest

from mop_airflow.records.layout import RunLayout
from mop_airflow.hooks.connections import open_spec_store
from mop_airflow.config import StoreSpec
from mop_airflow.store import Store
from tests.conftest import _SESSION, make_bucket, write_dag_file
from tests.test_end_to_end import tiny_spec, write_digits

pytestmark = pytest.mark.integration


def test_a_connection_secret_appears_in_no_artifact_log_or_xcom(airflow_db, tmp_path, s3_endpoint, monkeypatch):
    marker = f"SECRET-MARKER-{uuid.uuid4().hex}"
    make_bucket(s3_endpoint, "mop-secret")
    conn = {"conn_type": "aws", "login": "mop-key-id", "password": marker, "extra": {"endpoint_url": s3_endpoint}}
    monkeypatch.setenv("AIRFLOW_CONN_MOP_SECRET", json.dumps(conn))
    write_digits(tmp_path / "digits.parquet")
    store = open_spec_store(StoreSpec(root="s3://mop-secret/runs", conn_id="mop_secret"))
    store.put_file(str(tmp_path / "digits.parquet"), "s3://mop-secret/data/digits.parquet")
    spec = tiny_spec("s3://mop-secret/data/digits.parquet", "s3://mop-secret/runs", iterations=1)
    spec["data"]["conn_id"] = spec["store"]["conn_id"] = "mop_secret"
    spec["store"]["cache_dir"] = str(tmp_path / "cache")
    write_dag_file("mop_secret", spec)
    # run in a process of its own, so everything it prints and logs is in one place to search
    run = subprocess.run([sys.executable, "-c", "import runpy, sys\n"
                          f"run = runpy.run_path({str(_SESSION / 'dags' / 'mop_secret.py')!r})['dag'].test()\n"
                          "print('RUN STATE', run.state, run.run_id)"],
                         capture_output=True, text=True, env=os.environ.copy(), timeout=600)
    output = run.stdout + run.stderr
    assert "RUN STATE success" in output, output[-3000:]
    run_id = output.rsplit("RUN STATE success ", 1)[1].split()[0]
    layout = RunLayout(store, "mop_secret", run_id)
    assert store.exists(layout.report_uri("summary.json"))  # the secret was used: the run read and wrote S3
    assert "hop t=" in output  # the task logs are in the output searched below

    found = []
    for uri in store.glob("s3://mop-secret/**"):
        if not uri.endswith("/") and store.exists(uri):
            try:
                data = store.read_bytes(uri)
            except Exception:  # a "folder"
                continue
            if marker.encode() in data:
                found.append(uri)
    xcom_seen = False
    for folder in (tmp_path, _SESSION):  # _SESSION holds the metadata database: XComs, rendered fields
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                xcom_seen |= b'"plan_uri"' in data  # the plan task's return value, as its XCom holds it
                if marker.encode() in data:
                    found.append(str(path))
    assert xcom_seen  # the search did reach the XComs
    if marker in output:
        found.append("task logs / output")
    assert found == []
