"""What Airflow knows about a MOP run, asked through its REST API: for ``mop-airflow status`` and ``report``.

The store a run writes to is in its resolved run record, which the run's first task returns as its
XCom; so a run is found from (dag_id, run_id) alone, whatever store its DAG file configured.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from mop_airflow.airflow.rest import AirflowAPI
from mop_airflow.errors import AirflowApiError
from mop_airflow.layout import RunLayout
from mop_airflow.records import RunRecord
from mop_airflow.store import Store
from mop_airflow.task_plan import shard_pool

FINISHED = ("success", "failed")


@dataclass(frozen=True)
class RunRef:
    dag_id: str
    run_id: str
    state: str
    record: RunRecord | None  # None until the run's first task (preflight) has resolved it

    def layout(self, store_root: str | None = None) -> RunLayout | None:
        """Where the run's files are; ``store_root`` overrides the recorded store (same credentials)."""
        if self.record is None:
            return None
        spec = self.record.store
        if store_root:
            spec = dataclasses.replace(spec, root=store_root)
        return RunLayout(Store.from_spec(spec), self.dag_id, self.run_id)


def find_run(api: AirflowAPI, dag_id: str, run_id: str | None = None, *, record: RunRecord | None = None) -> RunRef:
    """The named run, or the DAG's latest; :class:`AirflowApiError` (status 404) when there is none.

    ``record``: the run record already read (it never changes once resolved), so only the state is asked."""
    if run_id is None:
        runs = api.get(f"/dags/{dag_id}/dagRuns", order_by="-run_after", limit=1)["dag_runs"]
        if not runs:
            raise AirflowApiError(f"DAG {dag_id} has no runs yet: trigger one first", status=404)
        run = runs[0]
    else:
        run = api.get(f"/dags/{dag_id}/dagRuns/{run_id}")
    run_id = run["dag_run_id"]
    if record is not None and record.run_id == run_id:
        return RunRef(dag_id, run_id, run["state"], record)
    try:
        entry = api.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/preflight/xcomEntries/return_value")
    except AirflowApiError as exc:
        if exc.status != 404:
            raise
        return RunRef(dag_id, run_id, run["state"], None)
    value = entry["value"]
    record = RunRecord.from_dict(json.loads(value) if isinstance(value, str) else value)
    return RunRef(dag_id, run_id, run["state"], record)


def busy_shards(api: AirflowAPI, ref: RunRef, shards: int) -> dict[int, list[str]]:
    """Shard -> the bundles whose hops are running on its pool now, each named with its configurations
    (``b2: c001-6e7014, c005-0c54d0``)."""
    pools = {shard_pool(s): s for s in range(shards)}
    busy: dict[int, list[str]] = {}
    for ti in api.paged(f"/dags/{ref.dag_id}/dagRuns/{ref.run_id}/taskInstances", "task_instances",
                        state=["running"]):
        shard = pools.get(ti.get("pool"))
        if shard is not None:
            busy.setdefault(shard, []).append(ti.get("rendered_map_index") or ti["task_id"])
    return busy


def failed_tasks(api: AirflowAPI, ref: RunRef) -> list[dict[str, Any]]:
    return [ti for ti in api.paged(f"/dags/{ref.dag_id}/dagRuns/{ref.run_id}/taskInstances", "task_instances",
                                   state=["failed"])]
