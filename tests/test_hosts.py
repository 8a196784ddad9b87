"""The demo's search across hosts that share nothing but S3, and what a host fault does to it.

The hosts are network namespaces on this machine (tests/hosts.py), deployed as docs/how-to/celery.md
says for several machines (tests/host_search.py): a control host (PostgreSQL, Redis, the Airflow
services, the default queue's worker), a storage host (moto's S3 server, the only thing shared) and
four shard hosts, one Celery worker each on ``mop_shard_<s>``, configured by the environment file
and preload hook ``mop-airflow celery config`` wrote on the control host, copied. The demo's grid
(8 configurations x 4 shards x 3 iterations) with its data and store on S3. One control plane for
every test here, in this order:

- clean: the leaderboard of ``mop-airflow demo`` (the embedded Airflow, run beside it) to every digit,
  and every shard task's log read through the control host's API (the log servers on the shard
  hosts check the API server's ``[api] secret_key``, which the environment file shares);
- shard host 1 cut off the network (its veth down) for 60 s while it trains, then back;
- shard host 2 lost for good (every process killed, its folder removed) while it trains, and a new,
  empty host on its queue 20 s later: its shard is staged again from S3;
- a shard queue no host serves (the same DAG asking for a fifth shard).

Where a run succeeds: the same leaderboard, no hop record or checkpoint with two versions in the
bucket (it keeps every version), every hop record marked committed and none rewritten by a later try.

Needs root (namespaces, mounts) and is run by ``make test-hosts`` (``MOP_TEST_HOSTS=1``); ``make
test`` skips it. Several minutes: ``benchmarks/host_faults.py`` times the same scenarios.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.host_search import DAG_ID, SHARDS, UNSERVED_DAG_ID, HostSearch, wait_mid_block
from tests.hosts import can_make_hosts

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.slow]

RUN_TIMEOUT_S = 900
CUT_OFF_S = 60
REPLACE_AFTER_S = 20
# A queue no worker serves: refused before training, or failed within this bound naming the queue.
NO_WORKER_BOUND_S = 180
LOG_ERRORS = ("secret_key", "Could not read served logs", "Failed to fetch log file")


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    if not os.environ.get("MOP_TEST_HOSTS"):
        pytest.skip("makes network namespaces as root and runs for minutes: `make test-hosts` runs it")
    why = can_make_hosts()
    if why:
        pytest.fail(f"cannot make hosts here: {why} (MOP_TEST_HOSTS is set, so this test must run)")
    with HostSearch(tmp_path_factory.mktemp("hosts")) as made:
        yield made


@pytest.fixture(scope="module")
def demo_board(tmp_path_factory, search):
    """The leaderboard `mop-airflow demo` gives (the embedded Airflow, on this machine's loopback), read
    when a test first compares with it: the demo runs while the first search on the hosts does."""
    from tests.test_celery_howto import run_demo  # noqa: PLC0415

    with run_demo(tmp_path_factory.mktemp("demo")) as board:
        yield board


def finish(search: HostSearch, run_id: str) -> list[dict]:
    from tests.conftest import failed_logs  # noqa: PLC0415

    state = search.af.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT_S)
    assert state == "success", failed_logs(search.af, DAG_ID, run_id)
    return search.af.task_instances(DAG_ID, run_id)


def assert_written_once(search: HostSearch, run_id: str) -> None:
    twice = search.written_twice(run_id)
    assert twice["hops"] == 8 * SHARDS * 3, twice  # every configuration's hop on every shard, every iteration
    assert (twice["checkpoints"], twice["records"], twice["rewritten"], twice["unmarked"]) == ([], [], [], []), twice


def test_the_demo_on_hosts_gives_its_leaderboard_and_every_shard_log_reads_from_the_control_host(search, demo_board):
    af = search.af
    run_id = af.trigger(DAG_ID)
    tis = finish(search, run_id)
    assert search.leaderboard(run_id) == demo_board()  # every configuration's rank and metrics, to every digit
    assert_written_once(search, run_id)
    on_shards = [ti for ti in tis if ti["queue"].startswith("mop_shard_") and ti["state"] == "success"]
    assert {ti["queue"] for ti in on_shards} == {f"mop_shard_{s}" for s in range(SHARDS)}
    for ti in on_shards:
        assert ti["hostname"] == f"shard{ti['queue'].rsplit('_', 1)[1]}", ti  # each shard's tasks on its host
        log = af.task_log(DAG_ID, run_id, ti["task_id"], ti["try_number"], ti["map_index"])
        assert not any(error in log for error in LOG_ERRORS), (ti["task_id"], ti["map_index"], log[-2000:])
        # read from the shard host's log server, the task's own lines in it
        assert f"http://{ti['hostname']}:8793/log/" in log and f'"task_id": "{ti["task_id"]}"' in log, log[-2000:]


def test_a_shard_host_cut_off_for_a_minute_mid_block_costs_time_not_results(search, demo_board):
    af, host = search.af, search.shards[1]
    run_id = af.trigger(DAG_ID)
    wait_mid_block(af, run_id, 1)
    host.cut()
    try:
        time.sleep(CUT_OFF_S)
    finally:
        host.restore()
    finish(search, run_id)
    assert search.leaderboard(run_id) == demo_board()
    assert_written_once(search, run_id)  # the cut-off try came back while its retry ran: fenced


def test_a_shard_host_lost_and_replaced_by_an_empty_one_stages_its_shard_again(search, demo_board):
    from mop_airflow.records import Manifest  # noqa: PLC0415
    from mop_airflow.records.layout import RunLayout  # noqa: PLC0415

    af, shard = search.af, 2
    run_id = af.trigger(DAG_ID)
    wait_mid_block(af, run_id, shard)
    search.shards[shard].lose()
    time.sleep(REPLACE_AFTER_S)
    new = search.add_shard_host(shard, f"shard{shard}new0")
    assert search.shard_cache(new) == []  # an empty machine
    tis = finish(search, run_id)
    assert search.leaderboard(run_id) == demo_board()
    assert_written_once(search, run_id)
    store = search.store()
    manifest = Manifest.read(store, RunLayout(store, DAG_ID, run_id).manifest_pointer_uri)
    # the new host read its shard (and the validation set) from S3, the only thing the hosts share
    cached = search.shard_cache(new)
    assert any(name.startswith(manifest.shards[shard].sha256) for name in cached), cached
    retried = [ti for ti in tis if ti["queue"] == f"mop_shard_{shard}" and ti["try_number"] > 1]
    assert retried and all(ti["hostname"] == new.name for ti in retried), retried


def test_a_shard_queue_no_host_serves_is_refused_or_fails_in_bound_naming_it(search):
    from tests.conftest import failed_logs  # noqa: PLC0415

    af = search.af
    run_id = af.trigger(UNSERVED_DAG_ID)
    began, state = time.time(), "queued"
    try:
        while time.time() - began < NO_WORKER_BOUND_S and state not in ("success", "failed"):
            time.sleep(3)
            state = af.run_state(UNSERVED_DAG_ID, run_id)
    finally:
        if state not in ("success", "failed"):  # stop it: nothing serves its queue
            af.api("PATCH", f"/dags/{UNSERVED_DAG_ID}/dagRuns/{run_id}", json={"state": "failed"})
    assert state == "failed", f"the run was still {state} after {NO_WORKER_BOUND_S} s"
    tis = af.task_instances(UNSERVED_DAG_ID, run_id)
    assert not any("train" in ti["task_id"] and ti["state"] == "success" for ti in tis)  # refused before training
    assert "mop_shard_4" in failed_logs(af, UNSERVED_DAG_ID, run_id)
