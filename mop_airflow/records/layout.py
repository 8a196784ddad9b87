"""Where each artifact of a run lives in the store: ``<root>/<dag_id>/<run_id>/...``.

Every task and the CLI compute the same URIs from (dag_id, run_id), so a checkpoint URI in XCom,
the report and the progress display always agree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mop_airflow.records import Continuation, RunRecord
from mop_airflow.store import Store, safe_segment


@dataclass(frozen=True)
class RunLayout:
    store: Store
    dag_id: str
    run_id: str

    @property
    def run_uri(self) -> str:
        return self.store.uri(safe_segment(self.dag_id), safe_segment(self.run_id))

    def _at(self, *parts: str) -> str:
        return self.store.uri(safe_segment(self.dag_id), safe_segment(self.run_id), *parts)

    @property
    def run_record_uri(self) -> str:
        """The resolved run: effective spec and configurations (:class:`~mop_airflow.records.RunRecord`)."""
        return self._at("run.json")

    @property
    def plan_uri(self) -> str:
        return self._at("plan.json")

    @property
    def manifest_pointer_uri(self) -> str:
        """The run's copy of the (shared, reusable) shard manifest it trains on."""
        return self._at("manifest.json")

    @property
    def data_records_uri(self) -> str:
        """The folder of the records sharding leaves: the sharding plan and each slice's result."""
        return self._at("data")

    @property
    def sharding_plan_uri(self) -> str:
        """How the run's data is sliced and where its shards go (:class:`~mop_airflow.records.ShardingPlan`)."""
        return self._at("data", "sharding.json")

    def slice_result_uri(self, index: int) -> str:
        return self._at("data", f"slice-{index:05d}.json")

    def checkpoint_uri(self, config_id: str, t: int, sha256: str | None = None) -> str:
        """Where hop ``t`` of ``config_id`` leaves its checkpoint; ``sha256``: the name a copy of the hop
        takes when another copy's checkpoint holds the first name (its content's: two copies never write
        different bytes under one name, and the record names the one it took)."""
        return self._at("checkpoints", config_id, f"t{t:03d}.npz" if sha256 is None else f"t{t:03d}.{sha256[:16]}.npz")

    def hop_record_uri(self, config_id: str, t: int) -> str:
        return self._at("hops", config_id, f"t{t:03d}.json")

    @property
    def hops_glob(self) -> str:
        return self._at("hops", "*", "t*.json")

    def config_hops_glob(self, config_id: str) -> str:
        return self._at("hops", config_id, "t*.json")

    def stage_record_uri(self, shard: int) -> str:
        return self._at("stage", f"shard_{shard:02d}.json")

    def slot_status_uri(self, block: str, shard: int, slot: int) -> str:
        """What shard ``shard``'s slot ``slot`` last said in block ``block`` (:class:`~mop_airflow.records.SlotStatus`)."""
        return self._at("slots", safe_segment(block), f"shard_{shard:02d}_slot_{slot}.json")

    def slot_commits_uri(self, block: str, shard: int, slot: int) -> str:
        """The folder of empty markers a slot leaves after each hop it records, in order: what the slots
        waiting for its hops list (one listing a poll, :mod:`mop_airflow.slots.commits`)."""
        return self._at("slots", safe_segment(block), "commits", f"shard_{shard:02d}_slot_{slot}")

    def slots_glob(self, run_id: str) -> str:
        """The slot status files of the blocks DAG run ``run_id`` trains (:func:`block_name`)."""
        return self._at("slots", f"{safe_segment(run_id)}.*", "shard_*_slot_*.json")

    @property
    def stages_glob(self) -> str:
        return self._at("stage", "shard_*.json")

    def rung_decision_uri(self, bracket: int | str, rung: int | str) -> str:
        return self._at("rungs", f"bracket_{bracket}_rung_{rung}.json")

    def block_decision_uri(self, block: int | str) -> str:
        """What block ``block`` of a search decided between blocks trains (:class:`~mop_airflow.records.BlockDecision`)."""
        return self._at("blocks", f"block_{block:05d}.json" if isinstance(block, int) else f"block_{block}.json")

    @property
    def proposed_uri(self) -> str:
        """The configurations a search made between blocks (PBT's copies, TPE's proposals), in order."""
        return self._at("proposed.json")

    def report_uri(self, name: str) -> str:
        return self._at("report", name)

    @property
    def continues_uri(self) -> str:
        """In the folder of a run that continues a search: which search (:class:`~mop_airflow.records.Continuation`)."""
        return self._at("continues.json")

    @property
    def chain_uri(self) -> str:
        """In a search's first run: the runs its blocks took, first to latest (:class:`~mop_airflow.records.RunChain`)."""
        return self._at("chain.json")


def block_name(run_id: str, group: str | None) -> str:
    """What names a block in its slots' status files: the DAG run that trains it and the block's task
    group in Airflow (``bracket_1.rung_0``; a MopTaskGroup's id included), or ``hops``."""
    return safe_segment(f"{run_id}.{group or 'hops'}")


def run_folder(store: Store, dag_id: str, run_id: str) -> RunLayout:
    """The folder of the search run ``run_id`` belongs to: its own, or, for a run continuing a search
    split over several DAG runs (:mod:`mop_airflow.planning.run_chain`), the search's first run's."""
    layout = RunLayout(store, dag_id, run_id)
    if store.exists(layout.run_record_uri) or not store.exists(layout.continues_uri):
        return layout
    return RunLayout(store, dag_id, Continuation.read(store, layout.continues_uri).first_run)


def read_run(layout: RunLayout) -> RunRecord:
    """The search's run record with every configuration it has so far (:func:`with_proposed`)."""
    return with_proposed(layout, RunRecord.read(layout.store, layout.run_record_uri))


def with_proposed(layout: RunLayout, run: RunRecord) -> RunRecord:
    """``run`` with the configurations its search made between blocks after those it drew when it
    was resolved. The run record stays as resolved (written once); a decision step appends to the
    search's ``proposed.json``, and every reader of a run's configurations reads it through here."""
    store = layout.store
    if not store.exists(layout.proposed_uri):
        return run
    known = {c["config_id"] for c in run.configs}
    extra = [c for c in store.read_json(layout.proposed_uri)["configs"] if c["config_id"] not in known]
    return dataclasses.replace(run, configs=[*run.configs, *extra])
