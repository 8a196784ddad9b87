"""Reading runs from the store: a run's hop records and rung decisions, and a DAG's runs as the
store alone knows them (for the commands that work while Airflow is stopped).

Every file a run writes is in the store, but its Airflow state is not, so the state comes from the
files and says no more than they do: the report task, a run's last, writes ``report/summary.json``,
so a run with one **finished**; a run with a run record but no report is **unfinished**: still
training, stopped, or failed before its report, which only Airflow can tell apart.

Nothing here imports Airflow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from collections import defaultdict
from typing import Any, Mapping, Sequence

from mop_airflow.errors import StoreError
from mop_airflow.records.layout import RunLayout, read_run, run_folder
from mop_airflow.records import BlockDecision, HopRecord, RunRecord, RungDecision
from mop_airflow.records.selection import SEPARATOR, whole_first
from mop_airflow.search.jobs import Completion
from mop_airflow.search.promotion import promote
from mop_airflow.store import Store, safe_segment

def load_hop_records(layout: RunLayout) -> list[HopRecord]:
    """Records of the hops that trained (a failed hop leaves a failure record: see :func:`load_all_hops`)."""
    return load_all_hops(layout)[0]


def load_all_hops(layout: RunLayout) -> tuple[list[HopRecord], dict[str, HopRecord]]:
    """The records of the hops that trained, and per configuration that failed the record of the hop
    where it failed and why; every record is read once."""
    records = [HopRecord.read(layout.store, uri) for uri in layout.store.glob(layout.hops_glob)]
    failed = sorted((r for r in records if r.status != "ok"), key=lambda r: r.t, reverse=True)
    return [r for r in records if r.status == "ok"], {r.config_id: r for r in failed}  # the earliest failure wins


def visit_order(records: Sequence[HopRecord]) -> dict[str, list[int]]:
    """The shard each configuration trained on at each of its hops, as it actually ran."""
    order: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in records:
        order[r.config_id].append((r.t, r.shard))
    return {cid: [shard for _, shard in sorted(hops)] for cid, hops in sorted(order.items())}


def latest_reported_run(store: Store, dag_id: str, *, exclude: str | None = None) -> str | None:
    """The run id of ``dag_id``'s run whose report was written last (other than ``exclude``), or None."""
    newest: tuple[str, str] | None = None
    for uri in store.glob(store.uri(safe_segment(dag_id), "*", "report", "summary.json")):
        summary = store.read_json(uri)
        if summary.get("run_id") == exclude or summary.get("dag_id", dag_id) != dag_id:
            continue
        key = (summary.get("report_written_at") or "", summary["run_id"])
        newest = key if newest is None or key > newest else newest
    return None if newest is None else newest[1]


def last_saved_hop(layout: RunLayout, config_id: str) -> HopRecord | None:
    """The record of the configuration's last trained hop whose checkpoint is still in the store."""
    records = sorted((HopRecord.read(layout.store, u) for u in layout.store.glob(layout.config_hops_glob(config_id))),
                     key=lambda r: r.t, reverse=True)
    return next((r for r in records if r.status == "ok" and r.checkpoint and layout.store.exists(r.checkpoint)), None)


def load_rung_decisions(layout: RunLayout, plan: Any = None, run: RunRecord | None = None) -> list[RungDecision]:
    """Every rung a Hyperband or successive-halving search has ranked: the rung decisions of a run
    drawn into one DAG (before blocks trained to the next decision), or those its block decisions took
    (:func:`rungs_of_blocks`, given the ``plan`` and ``run``)."""
    drawn = [RungDecision.read(layout.store, uri) for uri in layout.store.glob(layout.rung_decision_uri("*", "*"))]
    if drawn or plan is None or run is None or not plan.brackets:
        return drawn
    return rungs_of_blocks(load_block_decisions(layout), plan, run)


def rungs_of_blocks(blocks: Sequence[BlockDecision], plan: Any, run: RunRecord) -> list[RungDecision]:
    """The rungs the block decisions of a Hyperband or successive-halving search ranked, each as the
    rung's decision (:class:`RungDecision`): a rung is decided once every configuration that entered it
    completed it (or failed), and its best ``keep`` are the ones the decisions promoted."""
    if not blocks:
        return []
    done: dict[tuple[int, int], list[Completion]] = {}
    for c in blocks[-1].completions:  # every decision carries all completions so far
        done.setdefault((c["bracket"], c["rung"]), []).append(Completion(**c))
    out = []
    for bracket in plan.adaptive.get("brackets", [plan.adaptive]):
        s, rungs = bracket["s"], bracket["rungs"]
        entered = list(plan.brackets.get(str(s), []))
        for i, rung in enumerate(rungs[:-1]):
            results = [c.result() for c in done.get((s, i), [])]
            if not entered or len(results) < len(entered):
                break  # still training: the bracket waits here
            promoted, pruned = promote(results, keep=rung["keep"], direction=run.direction)
            out.append(RungDecision(
                bracket=s, rung=i, metric=run.metric, direction=run.direction, keep=rung["keep"],
                iterations_done=int(rung["hops_i"]) // plan.shards, results=results, promoted=promoted,
                pruned=[{**e, "rung": i, "bracket": s, "iterations_done": int(rung["hops_i"]) // plan.shards}
                        for e in pruned]))
            entered = promoted
    return out


def load_block_decisions(layout: RunLayout) -> list[BlockDecision]:
    """A search decided between blocks: every block's decision, first to last."""
    found = [BlockDecision.read(layout.store, uri) for uri in layout.store.glob(layout.block_decision_uri("*"))]
    return sorted(found, key=lambda d: d.block)


FINISHED, UNFINISHED = "finished", "unfinished"
UNFINISHED_NOTE = "no report yet: training, stopped, or failed before its report; only Airflow can tell which"


def open_store(store_root: str, *, options: Mapping[str, Any] | None = None) -> Store:
    """The store at ``store_root``: a URI, or a local folder (made absolute, as ``file://``)."""
    if "://" not in store_root:
        store_root = "file://" + os.path.abspath(os.path.expanduser(store_root))
    return Store(store_root, options)


def run_layout(store_root: str, dag_id: str, run_id: str | None = None, *,
               options: Mapping[str, Any] | None = None) -> RunLayout:
    """The run folder ``<store_root>/<dag_id>/<run_id>/`` without asking Airflow.

    Without ``run_id``: the DAG's run whose report was written last. :class:`StoreError` when the
    run (or any reported run) is not there.
    """
    store = open_store(store_root, options=options)
    if run_id is not None:
        return stored_run(store, dag_id, run_id).layout
    latest = latest_reported_run(store, dag_id)
    if latest is None:
        raise StoreError(f"no reported run of DAG {dag_id!r} in the store {store.root}. Fix: check the DAG id and "
                         "--store, or wait for a run's report task")
    return RunLayout(store, dag_id, latest)


@dataclass(frozen=True)
class StoredRun:
    layout: RunLayout
    record: RunRecord
    summary: dict[str, Any] | None  # report/summary.json, once the report task wrote it

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def state(self) -> str:
        return FINISHED if self.summary is not None else UNFINISHED

    @property
    def state_line(self) -> str:
        """The state with what it means, for a person reading it."""
        return FINISHED if self.summary is not None else f"{UNFINISHED} ({UNFINISHED_NOTE})"

    @property
    def winner(self) -> tuple[str, str, float] | None:
        """(configuration, metric, value) of the report's best configuration; None before the report."""
        if self.summary is None:
            return None
        best = self.summary["best"]
        return best["config_id"], self.record.metric, best.get(self.record.metric)


def read_stored_run(layout: RunLayout) -> StoredRun:
    store = layout.store
    summary_uri = layout.report_uri("summary.json")
    return StoredRun(layout, read_run(layout),
                     store.read_json(summary_uri) if store.exists(summary_uri) else None)


def stored_run(store: Store, dag_id: str, run_id: str) -> StoredRun:
    """The named run; :class:`StoreError` naming the file looked for when it is not in the store."""
    layout = run_folder(store, dag_id, run_id)  # a run that continued a search: that search's folder
    if not store.exists(layout.run_record_uri):
        raise StoreError(f"no run {run_id!r} of DAG {dag_id!r} in the store {store.root} (looked for "
                         f"{layout.run_record_uri}). Fix: check the ids and --store")
    return read_stored_run(layout)


def stored_runs(store: Store, dag_id: str) -> list[StoredRun]:
    """Every run of ``dag_id`` that recorded itself in the store, newest first (by when it was resolved)."""
    runs = []
    for uri in store.glob(store.uri(safe_segment(dag_id), "*", "run.json")):
        record = RunRecord.read(store, uri)
        if record.dag_id == dag_id:  # two DAG ids may share a folder name (safe_segment)
            runs.append(read_stored_run(RunLayout(store, dag_id, record.run_id)))
    return sorted(runs, key=lambda r: (r.record.created_at, r.run_id), reverse=True)


def find_stored_run(store: Store, dag_id: str, run_id: str | None = None) -> StoredRun:
    """The named run, or without ``run_id`` the DAG's newest, as Airflow's "latest run" would be."""
    if run_id is not None:
        return stored_run(store, dag_id, run_id)
    runs = stored_runs(store, dag_id)
    if not runs:
        raise StoreError(f"no run of DAG {dag_id!r} in the store {store.root} (no {dag_id}/*/run.json). Fix: check "
                         "the DAG id and --store (the store root the DAG's spec names)")
    return runs[0]


def stored_selections(store: Store, dag_id: str) -> list[str | None]:
    """The model selections of ``dag_id`` with runs in the store: None for the whole DAG (runs under
    ``<dag_id>/``), and each group id with runs under ``<dag_id>.<group>/`` (:mod:`mop_airflow.records.selection`).

    A DAG id with a dot in it (``etl.v2``) names a folder as a group of ``etl`` would: the store alone
    cannot tell them apart, so such a DAG is listed as a group of ``etl`` too."""
    found: set[str | None] = set()
    if store.glob(store.uri(safe_segment(dag_id), "*", "run.json")):
        found.add(None)
    prefix = safe_segment(dag_id) + SEPARATOR
    for uri in store.glob(store.uri(prefix + "*", "*", "run.json")):
        found.add(uri.rstrip("/").split("/")[-3][len(prefix):])
    return whole_first(found)
