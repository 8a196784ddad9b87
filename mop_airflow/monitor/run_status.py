"""What Airflow knows about a MOP run, asked through its REST API: for ``mop-airflow status`` and ``report``.

The store a run writes to is in its resolved run record, which the run's first task returns as its
XCom; so a run is found from (dag_id, run_id) alone, whatever store its DAG file configured. A
MopTaskGroup's selection is found the same way through its own prefixed tasks
(``<group>.preflight``), and only its own tasks count as its work (:mod:`mop_airflow.records.selection`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from mop_airflow.hooks.rest import AirflowAPI
from mop_airflow.errors import AirflowApiError
from mop_airflow.records.layout import RunLayout
from mop_airflow.records import RunRecord
from mop_airflow.records import RunChain
from mop_airflow.planning.run_chain import continuation_of
from mop_airflow.records.selection import selection_id, selections_of, task_id_in
from mop_airflow.hooks.connections import open_spec_store
from mop_airflow.planning.task_plan import shard_pool
from mop_airflow.results.progress import Waiting

FINISHED = ("success", "failed")


@dataclass(frozen=True)
class RunRef:
    dag_id: str
    run_id: str
    state: str
    record: RunRecord | None  # None until the run's first task (preflight) has resolved it
    group: str | None = None  # the MopTaskGroup whose selection this is; None: the whole MOP DAG
    # the run whose folder holds the search: this one, or the first run of a search split over DAG runs
    search_run: str | None = None

    @property
    def selection_id(self) -> str:
        """What names the run's folder: the DAG id, or ``<dag_id>.<group>``."""
        return selection_id(self.dag_id, self.group)

    def owns(self, task_id: str) -> bool:
        """Whether ``task_id`` is one of this selection's tasks (a group's carry its prefix)."""
        return self.group is None or task_id.startswith(task_id_in(self.group, ""))

    def layout(self, store_root: str | None = None) -> RunLayout | None:
        """Where the run's files are; ``store_root`` overrides the recorded store (same credentials)."""
        if self.record is None:
            return None
        spec = self.record.store
        if store_root:
            spec = dataclasses.replace(spec, root=store_root)
        return RunLayout(open_spec_store(spec), self.selection_id, self.search_run or self.run_id)


def dag_selections(api: AirflowAPI, dag_id: str) -> list[str | None]:
    """The model selections the DAG holds, from its tasks' ids: None for a whole MOP DAG (a ``preflight``
    task), each group id for a MopTaskGroup (``<group>.preflight``); empty for any other DAG."""
    return selections_of(task["task_id"] for task in api.get(f"/dags/{dag_id}/tasks")["tasks"])


def find_run(api: AirflowAPI, dag_id: str, run_id: str | None = None, *, group: str | None = None,
             record: RunRecord | None = None) -> RunRef:
    """The named run, or the DAG's latest; :class:`AirflowApiError` (status 404) when there is none.
    ``group``: the MopTaskGroup whose selection to read (its preflight is ``<group>.preflight``).

    ``record``: the run record already read (it never changes once resolved), so only the state is asked."""
    if run_id is None:
        runs = api.get(f"/dags/{dag_id}/dagRuns", order_by="-run_after", limit=1)["dag_runs"]
        if not runs:
            raise AirflowApiError(f"DAG {dag_id} has no runs yet: trigger one first", status=404)
        run = runs[0]
    else:
        run = api.get(f"/dags/{dag_id}/dagRuns/{run_id}")
    run_id = run["dag_run_id"]
    # a run continuing a search split over DAG runs: the search was resolved by its first run
    continuing = continuation_of(run.get("conf")) if group is None else None
    resolved_by = continuing.first_run if continuing else run_id
    if record is not None and record.run_id == resolved_by:
        return _latest_block(api, RunRef(dag_id, run_id, run["state"], record, group, resolved_by))
    preflight = task_id_in(group, "preflight")
    try:
        entry = api.get(f"/dags/{dag_id}/dagRuns/{resolved_by}/taskInstances/{preflight}/xcomEntries/return_value")
    except AirflowApiError as exc:
        if exc.status != 404:
            raise
        return RunRef(dag_id, run_id, run["state"], None, group, resolved_by)
    value = entry["value"]
    record = RunRecord.from_dict(json.loads(value) if isinstance(value, str) else value)
    return _latest_block(api, RunRef(dag_id, run_id, run["state"], record, group, resolved_by))


def _latest_block(api: AirflowAPI, ref: RunRef) -> RunRef:
    """For a search split over several DAG runs (:mod:`mop_airflow.planning.run_chain`) whose run ``ref`` has
    finished its block, the run training the search's latest block: its state is the search's."""
    if ref.state != "success" or ref.record is None:
        return ref
    layout = ref.layout()
    if layout is None or not layout.store.exists(layout.chain_uri):
        return ref
    chain = RunChain.read(layout.store, layout.chain_uri)
    if ref.run_id not in chain.runs or chain.runs[-1] == ref.run_id:
        return ref
    latest = chain.runs[-1]
    try:
        state = api.get(f"/dags/{ref.dag_id}/dagRuns/{latest}")["state"]
    except AirflowApiError as exc:
        if exc.status != 404:
            raise
        state = "queued"  # its pointer is written just before it is triggered
    return dataclasses.replace(ref, run_id=latest, state=state)


def busy_shards(api: AirflowAPI, ref: RunRef, shards: int, training: Mapping[str, str] | None = None
                ) -> dict[int, list[str]]:
    """Shard -> what this selection's tasks on its pool do now: each train task named by the hop it
    trains (``training``, :func:`mop_airflow.results.progress.training_now`)."""
    running = api.paged(f"/dags/{ref.dag_id}/dagRuns/{ref.run_id}/taskInstances", "task_instances", state=["running"])
    return busy_of(running, ref, shards, training)


def busy_of(task_instances: Iterable[Mapping[str, Any]], ref: RunRef, shards: int,
            training: Mapping[str, str] | None = None) -> dict[int, list[str]]:
    """:func:`busy_shards` from the task instances the REST API listed: the selection's own tasks on
    a shard pool (another group of the same DAG shares the pools but not the selection)."""
    pools = {shard_pool(s): s for s in range(shards)}
    busy: dict[int, list[str]] = {}
    for ti in task_instances:
        shard = pools.get(ti.get("pool"))
        if shard is not None and ref.owns(ti["task_id"]):
            name = (training or {}).get(ti["task_id"]) or ti.get("rendered_map_index") or ti["task_id"]
            busy.setdefault(shard, []).append(name)
    return busy


# A task queued longer than this has no worker taking it (a normal hand-off takes a few seconds): a lost
# worker, none serving its queue, or all of the queue's busy.
WAITING_AFTER_S = 15.0


def waiting_for_worker(api: AirflowAPI, ref: RunRef, now: float | None = None) -> tuple[Waiting, ...]:
    """This selection's tasks queued for more than :data:`WAITING_AFTER_S`, longest first."""
    queued = api.paged(f"/dags/{ref.dag_id}/dagRuns/{ref.run_id}/taskInstances", "task_instances", state=["queued"])
    return waiting_of(queued, ref, time.time() if now is None else now)


def waiting_of(task_instances: Iterable[Mapping[str, Any]], ref: RunRef, now: float) -> tuple[Waiting, ...]:
    """:func:`waiting_for_worker` from the task instances the REST API listed."""
    out = []
    for ti in task_instances:
        when = ti.get("queued_when")
        if ti.get("state") == "queued" and when and ref.owns(ti["task_id"]):
            since = dt.datetime.fromisoformat(when).timestamp()
            if now - since > WAITING_AFTER_S:
                out.append(Waiting(ti["task_id"], ti.get("queue") or "default", since))
    return tuple(sorted(out, key=lambda w: w.since))


def failed_tasks(api: AirflowAPI, ref: RunRef) -> list[dict[str, Any]]:
    return [ti for ti in api.paged(f"/dags/{ref.dag_id}/dagRuns/{ref.run_id}/taskInstances", "task_instances",
                                   state=["failed"])]
