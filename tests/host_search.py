"""The demo's search on hosts that share nothing but S3, deployed as docs/how-to/celery.md says for
several machines; used by tests/test_hosts.py and benchmarks/host_faults.py.

Hosts (tests/hosts.py): ``control`` runs PostgreSQL (``initdb`` and ``postgres`` from
/usr/lib/postgresql/*/bin, as the ``postgres`` user, a plain process), ``redis-server``, the Airflow
services (api-server, scheduler, dag-processor, triggerer) and the default queue's Celery worker;
``storage`` runs moto's S3 server, the only thing the hosts share; ``shard0``..``shard3`` each run one
Celery worker on queue ``mop_shard_<s>``. ``mop-airflow celery config`` runs on the control host, as
the how-to's first step, and its environment file and preload hook are copied into each shard host's
``~/airflow`` with the DAG files: nothing else is shared. The data (``mop-airflow example-data``'s
MNIST-1D) and the store are on S3, read with the Airflow connection ``aws_default`` (added once, in the
metadata database); the bucket keeps every version of every object, so a record or checkpoint
written twice shows.

The DAG is the demo's (dags/mop_mnist1d.py: 8 configurations x 4 shards x 3 iterations, seed 42) with
its data and store moved to S3; a second one, ``mop_mnist1d_5_shards``, asks for a fifth shard whose
queue no host serves.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from tests.hosts import BIN, Host, Hosts, wait_port

REPO = Path(__file__).resolve().parents[1]
DAG_ID = "mop_mnist1d"
UNSERVED_DAG_ID = "mop_mnist1d_5_shards"
SHARDS = 4
BUCKET = "mop-hosts"
KEY, SECRET = "test", "test"
S3_PORT, PG_PORT, REDIS_PORT, API_PORT = 5000, 5432, 6379, 8080
ENV = "set -a; . ~/airflow/mop-celery.env; set +a; "  # the how-to's step 2, on every host


def host_names(replacements: int = 1) -> list[str]:
    """Every host the search may use: a name and an address each (the shared hosts file lists them)."""
    return (["control", "storage"] + [f"shard{s}" for s in range(SHARDS)]
            + [f"shard{s}new{i}" for i in range(replacements) for s in range(SHARDS)])


def dag_source(dag_id: str = DAG_ID, shards: int = SHARDS) -> str:
    """dags/mop_mnist1d.py with its data and store on S3 (and ``shards`` shards, as ``dag_id``)."""
    source = (REPO / "dags" / "mop_mnist1d.py").read_text()
    s3 = (f'"data": {{**mnist1d_data_spec("s3://{BUCKET}/data"), "conn_id": "aws_default"}},\n'
          f'    "store": {{"root": "s3://{BUCKET}/store", "conn_id": "aws_default"}},')
    changed = source.replace('"data": mnist1d_data_spec(),', s3)
    changed = changed.replace('"shards": 4,', f'"shards": {shards},').replace('dag_id="mop_mnist1d"', f'dag_id="{dag_id}"')
    if changed.count("s3://") != 2 or f'dag_id="{dag_id}"' not in changed or f'"shards": {shards},' not in changed:
        raise RuntimeError("dags/mop_mnist1d.py changed its data, shards or dag_id line: change tests/host_search.py too")
    return changed.replace('"""Example:', '"""The demo DAG with its data and store on S3. Example:', 1)


class HostSearch:
    """``with HostSearch(base) as search: search.af.trigger(DAG_ID)``: every host up, Airflow healthy."""

    def __init__(self, base: Path, log=print, replacements: int = 1):
        self.base = Path(base).absolute()
        self.log = log
        self.hosts = Hosts(self.base, host_names(replacements))
        self.shards: dict[int, Host] = {}
        self.af = None

    def __enter__(self) -> "HostSearch":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.af is not None:
            self.af.rest.close()
        self.hosts.close()

    # -- the hosts' addresses ---------------------------------------------------------------------
    @property
    def control(self) -> Host:
        return self.hosts.hosts["control"]

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.hosts.address('storage')}:{S3_PORT}"

    @property
    def api_url(self) -> str:
        return f"http://{self.hosts.address('control')}:{API_PORT}"

    def s3(self):
        import boto3  # noqa: PLC0415

        return boto3.client("s3", endpoint_url=self.s3_endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                            region_name="us-east-1")

    def store(self):
        from mop_airflow.store import Store  # noqa: PLC0415

        return Store(f"s3://{BUCKET}/store", {"key": KEY, "secret": SECRET,
                                              "client_kwargs": {"endpoint_url": self.s3_endpoint}})

    # -- bring-up ---------------------------------------------------------------------------------
    def start(self) -> None:
        started = time.time()
        self.hosts.open()
        storage, control = self.hosts.add("storage"), self.hosts.add("control")
        ctl = self.hosts.address("control")
        moto = storage.spawn("s3", f"{BIN / 'moto_server'} -H {storage.address} -p {S3_PORT}")
        [pg_bin] = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1:]
        control.run(f"runuser -u postgres -- {pg_bin}/initdb -D /tmp/pgdata -U postgres -A trust --no-sync -E UTF8")
        control.run(f"echo 'host all all {self.hosts.subnet}.0/24 trust' >> /tmp/pgdata/pg_hba.conf")
        postgres = control.spawn("postgres", f"runuser -u postgres -- {pg_bin}/postgres -D /tmp/pgdata "
                                             f"-c listen_addresses={ctl} -c unix_socket_directories=/tmp -c fsync=off")
        redis = control.spawn("redis", f"redis-server --bind {ctl} --port {REDIS_PORT} --save '' --appendonly no "
                                       f"--protected-mode no --dir /tmp")
        wait_port(ctl, PG_PORT, proc=postgres, log=control.log("postgres"))
        wait_port(ctl, REDIS_PORT, proc=redis, log=control.log("redis"))
        wait_port(storage.address, S3_PORT, proc=moto, log=storage.log("s3"))
        control.run(f"psql -h {ctl} -U postgres -c 'CREATE DATABASE airflow'")
        # the how-to's steps 1 and 2, on the control host, with its defaults (~/airflow, ~/mop_airflow)
        control.run(f"mop-airflow celery config --broker redis://{ctl}:{REDIS_PORT}/0 "
                    f"--database postgresql+psycopg2://postgres@{ctl}:{PG_PORT}/airflow --api-url {self.api_url}")
        dags = control.home / "airflow" / "dags"
        (dags / f"{DAG_ID}.py").write_text(dag_source())
        (dags / f"{UNSERVED_DAG_ID}.py").write_text(dag_source(UNSERVED_DAG_ID, SHARDS + 1))
        control.run(ENV + "airflow db migrate", timeout=600)
        for service in ("api-server", "scheduler", "dag-processor", "triggerer"):
            control.spawn(service, f"airflow {service}", setup=ENV)
        control.spawn("worker", "airflow celery worker --queues default --concurrency 2", setup=ENV)
        for shard in range(SHARDS):
            self.add_shard_host(shard, f"shard{shard}")
        self.put_data()
        control.run(ENV + "airflow connections add aws_default --conn-type aws "
                    f"--conn-login {KEY} --conn-password {SECRET} "
                    f"--conn-extra '{json.dumps({'endpoint_url': self.s3_endpoint})}'")
        control.run(ENV + f"mop-airflow pools sync --shards {SHARDS} --slots 1")
        from mop_airflow.deployment.celery_config import read_env_file  # noqa: PLC0415
        from mop_airflow.deployment.local import LocalAirflow  # noqa: PLC0415

        # a client of the control host's API from this machine (the root namespace): nothing is started
        self.af = LocalAirflow(self.base / "client", self.base / "client" / "dags", log=self.log,
                               extra_env=read_env_file(control.home / "airflow" / "mop-celery.env"))
        self.af.wait_api(timeout=300)
        self.af.wait_healthy(timeout=300)
        self.af.wait_for_dag(DAG_ID)
        self.af.wait_for_dag(UNSERVED_DAG_ID)
        self.wait_worker_ready(control, "worker")
        for shard, host in self.shards.items():
            self.wait_worker_ready(host, "worker")
        self.log(f"hosts up in {time.time() - started:.0f} s: control {ctl}, storage {storage.address}, "
                 + ", ".join(f"{h.name} {h.address}" for h in self.shards.values()))

    def add_shard_host(self, shard: int, name: str) -> Host:
        """A new machine for shard ``shard``: the how-to's files copied into its ``~/airflow``, and one
        Celery worker on ``mop_shard_<shard>``."""
        host = self.hosts.add(name)
        source, target = self.control.home / "airflow", host.home / "airflow"
        target.mkdir(parents=True)
        shutil.copy2(source / "mop-celery.env", target / "mop-celery.env")
        shutil.copytree(source / "config", target / "config")
        shutil.copytree(source / "dags", target / "dags")
        host.spawn("worker", f"airflow celery worker --queues mop_shard_{shard} --concurrency 1", setup=ENV)
        self.shards[shard] = host
        return host

    def wait_worker_ready(self, host: Host, label: str, timeout: float = 300) -> None:
        log, deadline = host.log(label), time.time() + timeout
        while time.time() < deadline:
            proc = host.processes.get(label)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{host.name}'s worker exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            if log.exists() and re.search(rf"@{host.name} ready", log.read_text(errors="replace")):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{host.name}'s worker did not say ready in {timeout}s; see {log}")

    def put_data(self) -> None:
        """The demo's data (MNIST-1D as ``mop-airflow example-data`` writes it) in the bucket, which keeps
        every version of every object."""
        from mop_airflow.examples.mnist1d_data import write_mnist1d  # noqa: PLC0415

        data = self.base / "data"
        write_mnist1d(str(data))
        s3 = self.s3()
        s3.create_bucket(Bucket=BUCKET)
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
        for name in ("mnist1d_train.parquet", "mnist1d_test.parquet"):
            s3.upload_file(str(data / name), BUCKET, f"data/{name}")

    # -- what a run left --------------------------------------------------------------------------
    def leaderboard(self, run_id: str, dag_id: str = DAG_ID) -> dict[str, Any]:
        from mop_airflow.records.layout import RunLayout  # noqa: PLC0415

        store = self.store()
        return store.read_json(RunLayout(store, dag_id, run_id).report_uri("leaderboard.json"))

    def written_twice(self, run_id: str, dag_id: str = DAG_ID) -> dict[str, Any]:
        """What a run wrote more than once, and the hops whose markers and records disagree:
        ``checkpoints`` and ``records`` (S3 keys with more than one version), ``rewritten`` (hops whose
        record a later try wrote after a try had marked them committed), ``unmarked`` (hop records no
        marker names) and ``hops`` (how many records)."""
        from mop_airflow.records.layout import RunLayout  # noqa: PLC0415
        from mop_airflow.slots.commits import rewritten_after_marked  # noqa: PLC0415

        store = self.store()
        layout = RunLayout(store, dag_id, run_id)
        prefix = layout.run_uri.removeprefix(f"s3://{BUCKET}/")
        versions: dict[str, int] = {}
        for page in self.s3().get_paginator("list_object_versions").paginate(Bucket=BUCKET, Prefix=prefix):
            for version in page.get("Versions", []):
                versions[version["Key"]] = versions.get(version["Key"], 0) + 1
        marks = {name.split(".", 2)[2] for folder in store.glob(f"{layout.run_uri}/slots/*/commits/*")
                 for name in store.names_after(folder)}
        records = {f"{r['config_id']}.{r['t']}" for r in map(store.read_json, store.glob(layout.hops_glob))}
        return {"checkpoints": sorted(k for k, n in versions.items() if "/checkpoints/" in k and n > 1),
                "records": sorted(k for k, n in versions.items() if "/hops/" in k and n > 1),
                "rewritten": rewritten_after_marked(layout), "unmarked": sorted(records - marks),
                "hops": len(records)}

    def shard_cache(self, host: Host) -> list[str]:
        """The files in a shard host's cache (``~/mop_airflow/cache``)."""
        folder = host.home / "mop_airflow" / "cache"
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def wait_mid_block(af, run_id: str, shard: int, *, trained_s: float = 3, timeout: float = 600) -> dict:
    """The train task on ``shard``'s queue once it has run ``trained_s`` seconds (its shard staged, a hop
    under way): a block's middle."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for ti in af.task_instances(DAG_ID, run_id):
            if (ti["queue"] == f"mop_shard_{shard}" and ti["state"] == "running" and "train" in ti["task_id"]
                    and time.time() - dt.datetime.fromisoformat(ti["start_date"]).timestamp() >= trained_s):
                return ti
        state = af.run_state(DAG_ID, run_id)
        if state in ("success", "failed"):
            raise RuntimeError(f"the run ended ({state}) before shard {shard} trained for {trained_s} s")
        time.sleep(0.5)
    raise TimeoutError(f"no train task ran on mop_shard_{shard} within {timeout}s")


def main() -> int:  # a manual check: bring the hosts up, run the demo once, print the leaderboard
    import tempfile  # noqa: PLC0415

    base = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="mop-hosts-"))
    with HostSearch(base) as search:
        run_id = search.af.trigger(DAG_ID)
        print(search.af.wait_for_run(DAG_ID, run_id, timeout=900))
        print(json.dumps(search.leaderboard(run_id), indent=1)[:2000])
        print(search.written_twice(run_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
