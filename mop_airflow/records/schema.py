"""Typed run records: written once to the store, read by every later step. One schema, one place.

A run is resolved once: the first task freezes the effective spec (the DAG's spec with the trigger
conf applied) and the configurations into a :class:`RunRecord`; the plan task adds the hop plan
(:class:`Plan`); the shard task the data :class:`Manifest`. Later tasks read these records and
never re-expand the search space or re-derive the plan. Every hop leaves a :class:`HopRecord`,
every decision of an adaptive search a :class:`BlockDecision` (searches recorded before blocks ran to
the next decision hold a :class:`RungDecision` per rung), every shard's staging a :class:`StageRecord`. Each record is a
dataclass with a JSON round trip (``to_dict`` / ``from_dict``, ``write`` / ``read``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

if TYPE_CHECKING:
    from mop_airflow.config import DataSpec, PublishSpec, ScheduleSpec, StoreSpec
    from mop_airflow.store import Store

R = TypeVar("R", bound="Record")


class Record:
    """JSON round trip for the dataclasses below; unknown keys in stored JSON are ignored."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        return cls(**_known(cls, data))

    def write(self, store: Store, uri: str) -> str:
        return store.write_json(uri, self.to_dict())

    def create(self, store: Store, uri: str) -> bool:
        """Write it at ``uri`` only if no record is there (:meth:`~mop_airflow.store.Store.create_bytes`):
        True when this call wrote it, False when another writer's stays."""
        return store.create_json(uri, self.to_dict())

    @classmethod
    def read(cls: type[R], store: Store, uri: str) -> R:
        return cls.from_dict(store.read_json(uri))


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class RunRecord(Record):
    """The run as resolved by its first task: effective spec and every configuration."""

    dag_id: str
    run_id: str
    created_at: str
    spec: dict[str, Any]          # MopSpec.to_dict() with the trigger conf applied
    configs: list[dict[str, Any]]  # the expanded search space, each with its config_id
    # config_id -> the earlier run's checkpoint it starts from (mop_airflow.serving.warm_start); {} = all fresh
    warm_start: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def metric(self) -> str:
        return self.spec["search"]["metric"]

    @property
    def direction(self) -> str:
        return self.spec["search"]["direction"]

    @property
    def schedule(self) -> ScheduleSpec:
        from mop_airflow.config import ScheduleSpec  # noqa: PLC0415

        # runs recorded before bundle_size was retired carry it
        return ScheduleSpec(**{k: v for k, v in self.spec["schedule"].items() if k != "bundle_size"})

    @property
    def data(self) -> DataSpec:
        from mop_airflow.config import DataSpec  # noqa: PLC0415

        return DataSpec(**self.spec["data"])

    @property
    def store(self) -> StoreSpec:
        from mop_airflow.config import StoreSpec  # noqa: PLC0415

        return StoreSpec(**self.spec["store"])

    @property
    def adaptive(self) -> dict[str, Any] | None:
        """``search.adaptive``, or the one-rung ASHA a model-based random search runs as."""
        from mop_airflow.search.adaptive import effective_adaptive  # noqa: PLC0415

        search = self.spec["search"]
        return effective_adaptive(search.get("adaptive"), search["space"], self.spec["schedule"]["iterations"])

    @property
    def publish(self) -> PublishSpec:
        from mop_airflow.config import PublishSpec  # noqa: PLC0415

        return PublishSpec(**self.spec.get("publish", {}))  # runs resolved before publishing existed: defaults

    @property
    def fail_fast(self) -> bool:
        """Whether one failing configuration fails the run (else it is marked failed and the rest go on)."""
        return bool(self.spec["search"].get("fail_fast", False))

    @property
    def max_batch_size(self) -> int:
        return max(c["batch_size"] for c in self.configs)

    def config(self, config_id: str) -> dict[str, Any]:
        for config in self.configs:
            if config["config_id"] == config_id:
                return config
        raise KeyError(f"configuration {config_id!r} is not in run {self.run_id}")


@dataclass(frozen=True)
class Plan(Record):
    """The hop plan: which shard each configuration starts on and in which order the shard slots
    take them (plain search), or each bracket's configurations (adaptive: each block's
    :class:`BlockDecision` says what trains).

    ``classes[o]`` lists the configurations that start on shard ``o`` (offset class ``o``): one trains
    on shard ``(o + t) mod shards`` at global hop ``t``. ``lineup[o]`` is the same configurations in
    the order the shard slots take them (:func:`mop_airflow.planning.lineup.line_up`).
    """

    shards: int
    iterations: int
    seed: int
    priority: str
    model_hops_total: int
    classes: list[list[str]] = field(default_factory=list)
    brackets: dict[str, list[str]] = field(default_factory=dict)
    adaptive: dict[str, Any] | None = None
    visit_order: dict[str, list[int]] = field(default_factory=dict)
    lineup: list[list[str]] = field(default_factory=list)
    shard_rows: int | None = None  # a shard's rows, which the deal's cost estimate used

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        return cls(**_known(cls, data), **_lineup_of(data))

    @property
    def decided_between_blocks(self) -> bool:
        """An adaptive search whose every block's step decides what trains (ASHA, a large Hyperband):
        no classes up front; each block's :class:`BlockDecision` holds them."""
        return bool(self.adaptive) and self.adaptive.get("decided") == "blocks"

    @property
    def decided_in_slots(self) -> bool:
        """An ASHA search whose shard slots decide what trains next (:mod:`mop_airflow.planning.asha_slots`):
        one block, no decision before it."""
        return bool(self.adaptive) and bool(self.adaptive.get("in_slots"))

    def class_lineup(self) -> list[list[str]]:
        """Each offset class of a plain search in the order its shard slots take it."""
        return self.lineup or [list(members) for members in self.classes]


@dataclass(frozen=True)
class Assignment(Record):
    """What travels through XCom from one hop of a configuration to its next: ids and a URI only."""

    config_id: str
    t: int                 # the last global hop done; -1 before the first
    checkpoint: str | None  # state after hop t, or None to start from the builder's initial weights
    checkpoint_sha256: str | None = None  # checked before the state is restored
    best_t: int | None = None  # the evaluated hop with the best metric so far: its checkpoint is kept
    best_metric: float | None = None


def _lineup_of(data: Mapping[str, Any]) -> dict[str, Any]:
    """``lineup`` from a record written while each offset class was listed as ``bundles`` (one bundle
    a class since bundles stopped being task units; several before): their configurations in order."""
    if "lineup" in data or not data.get("bundles"):
        return {}
    return {"lineup": [[cid for bundle in per_class for cid in bundle] for per_class in data["bundles"]]}


@dataclass(frozen=True)
class ShardEntry(Record):
    """One shard (or the validation set): a single file, or the parts its slices scattered.

    For a shard of several parts, ``uri`` names the shard and ``sha256`` hashes the parts' hashes;
    the stage task gathers the parts, in slice order, into one file in the worker's cache.
    """

    uri: str
    rows: int
    sha256: str
    bytes: int
    index: int | None = None
    parts: list["ShardEntry"] = field(default_factory=list)

    @property
    def files(self) -> list["ShardEntry"]:
        """The stored files that make up this entry, in row order."""
        return self.parts or [self]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ShardEntry":
        fields = _known(cls, data)
        fields["parts"] = [cls.from_dict(p) for p in data.get("parts") or []]
        return cls(**fields)


@dataclass(frozen=True)
class SourceFile(Record):
    """One file of a source: its size and version (ETag or mtime) stand in for its bytes' hash."""

    uri: str
    rows: int
    bytes: int
    version: str = ""


@dataclass(frozen=True)
class SourceListing(Record):
    """A source resolved into files (a file, folder, glob or prefix) with the schema they share."""

    uri: str
    format: str  # "parquet", "csv" or "images" (one file per row: mop_airflow.data.images)
    files: list[SourceFile]
    schema: dict[str, str]
    partitions: list[str] = field(default_factory=list)  # hive keys, e.g. ["year"]
    base: str | None = None  # the folder hive partitions (or image paths) are read below
    images: dict[str, Any] | None = None  # an image folder's layout, labels file and layout problems

    @property
    def total_rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def columns(self) -> list[str]:
        return [*self.schema, *[k for k in self.partitions if k not in self.schema]]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SourceListing":
        fields = _known(cls, data)
        fields["files"] = [SourceFile.from_dict(f) for f in data["files"]]
        return cls(**fields)


@dataclass(frozen=True)
class DataSlice(Record):
    """Files ``start``..``end - 1`` of one listing (the source's, or a separate validation source's),
    validated and scattered by one task."""

    index: int
    role: str  # "source" or "validation"
    start: int
    end: int
    rows: int
    bytes: int


@dataclass(frozen=True)
class ShardingPlan(Record):
    """How this run's data is split: the listings, the shard folder, and the slices that scatter it.

    Written once by the ``list_data`` task; every ``scatter`` task and the ``shard`` task read it.
    """

    fingerprint: str
    folder: str  # store URI of the shard folder (shared by every run with the same fingerprint)
    listing: SourceListing
    held: SourceListing | None  # the separate validation source, if any
    slices: list[DataSlice]
    inputs: list[dict[str, Any]]  # resolved InputSpec dicts; empty when the features do not resolve
    classes: list[Any]  # declared classes (found ones are merged by the shard task)
    shards: int
    seed: int
    reused: bool  # complete shards for this fingerprint exist: nothing is scattered
    schema: str | None = None  # the stored rows' Arrow schema (base64 IPC); None when unresolvable

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ShardingPlan":
        fields = _known(cls, data)
        fields["listing"] = SourceListing.from_dict(data["listing"])
        fields["held"] = SourceListing.from_dict(data["held"]) if data.get("held") else None
        fields["slices"] = [DataSlice.from_dict(s) for s in data["slices"]]
        return cls(**fields)


@dataclass(frozen=True)
class SliceResult(Record):
    """What one ``scatter`` task found and wrote: its validation state and its part of each shard."""

    index: int
    findings: dict[str, Any]  # mergeable validation state (see mop_airflow.data.validate)
    parts: list[ShardEntry | None]  # per shard, then validation; None where the slice had no rows for it
    wrote: bool  # False when shards were reused or the slice failed validation
    labels: list[list[Any]] = field(default_factory=list)  # [label, count] of its source rows, for found classes

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SliceResult":
        fields = _known(cls, data)
        fields["parts"] = [ShardEntry.from_dict(p) if p else None for p in data.get("parts") or []]
        return cls(**fields)


@dataclass(frozen=True)
class Manifest(Record):
    """The sharded data set: where each shard is, its size and checksum; reused for the same input."""

    fingerprint: str
    source: str
    features: list[str]
    label: str
    classes: list[Any]
    seed: int
    schema: dict[str, str]
    shards: list[ShardEntry]
    validation: ShardEntry
    total_rows: int
    created_at: str
    reused: bool = False
    task: str = "classification"  # or "regression": then ``classes`` is empty
    # One entry per model input (see mop_airflow.data.inputs.InputSpec); empty in manifests written
    # before inputs existed, which read as one input of the scalar ``features`` columns.
    inputs: list[dict[str, Any]] = field(default_factory=list)
    shuffle: str = "rows"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Manifest":
        fields = _known(cls, data)
        fields["shards"] = [ShardEntry.from_dict(s) for s in data["shards"]]
        fields["validation"] = ShardEntry.from_dict(data["validation"])
        return cls(**fields)


@dataclass(frozen=True)
class HopRecord(Record):
    """One model-hop: where and when it ran, its metrics, and what it read and wrote."""

    config_id: str
    t: int
    iteration: int
    hop: int
    shard: int
    status: str = "ok"  # "ok", or "failed" / "diverged" (adaptive search prunes such a configuration)
    task_id: str | None = None
    error: str | None = None
    host: str | None = None
    pid: int | None = None
    queue: str | None = None
    pool: str | None = None
    map_index: int = -1
    try_number: int = 1
    started_at: float | None = None
    execute_at: float | None = None
    train_begin: float | None = None
    train_end: float | None = None
    saved_at: float | None = None
    # when the process was done with the hop and free for its next one: its commit (saved_at) may end
    # later, on a writer thread, while the next hop trains (None in records written before that)
    released_at: float | None = None
    timings: dict[str, float] = field(default_factory=dict)
    train_metrics: dict[str, float] = field(default_factory=dict)
    val_metrics: dict[str, float] | None = None
    checkpoint: str | None = None
    checkpoint_bytes: int = 0
    bytes_read: dict[str, int] = field(default_factory=dict)
    checkpoint_sha256: str | None = None
    best_t: int | None = None  # as in Assignment: the configuration's best evaluated hop so far
    best_metric: float | None = None
    threads: int | None = None  # the backend's intra-op threads in that task (None on JAX): CPU results depend on it
    model_reused: bool = False  # trained in a compiled model another configuration of the slot built
    fused: int = 1  # configurations trained as one compiled program in this hop, this one included (schedule.fuse)
    # the sha256 of the checkpoint the hop started from (None: the builder's initial weights): a
    # retried slot skips a configuration's hop only when its record started from the same state
    input_sha256: str | None = None
    # a hop that never trained because its configuration failed at hop ``dropped_after`` (this record
    # then repeats that failure's status and error): written where the hop was due, so the slot that
    # waits for it learns of the failure instead of waiting for a hop that never comes
    dropped_after: int | None = None


@dataclass(frozen=True)
class RungDecision(Record):
    """The ranking at the end of a rung: who was promoted, who was pruned and why, and the next
    rung's offset classes."""

    bracket: int
    rung: int
    metric: str
    direction: str
    keep: int
    iterations_done: int
    results: list[dict[str, Any]]
    promoted: list[str]
    pruned: list[dict[str, Any]]
    next_classes: list[list[str]] = field(default_factory=list)


@dataclass(frozen=True)
class BlockDecision(Record):
    """What block ``block`` of a search decided between blocks trains, and why: written by the step
    before it (the plan task for block 0). ``jobs``: what the method handed out here, with what it
    saw (``completions``, in the order they happened); ``training``: every configuration of the
    block with the hops it had trained; ``offsets``: each one's rotation (hop ``t`` on shard
    ``(offset + t) mod shards``); ``lineup[o]``: offset class ``o`` in the order the slots take it. ``finished``: nothing
    is left to train, and this block's run reports. ``proposed``: the configurations this decision
    made (their full records are in the search's ``proposed.json``)."""

    block: int
    capacity: int
    jobs: list[dict[str, Any]] = field(default_factory=list)
    completions: list[dict[str, Any]] = field(default_factory=list)
    training: dict[str, int] = field(default_factory=dict)
    offsets: dict[str, int] = field(default_factory=dict)
    lineup: list[list[str]] = field(default_factory=list)
    finished: bool = False
    # Population-based training: each member's configuration now, and the copies made at this
    # decision (mop_airflow.search.pbt.Exploit, with the copied checkpoint's uri and sha256).
    members: list[str] = field(default_factory=list)
    copies: list[dict[str, Any]] = field(default_factory=list)
    proposed: list[str] = field(default_factory=list)  # configurations made here (copies, model-based proposals)
    # The block trains every configuration ``hops`` hops, from the search's hop ``start``: to the next
    # decision point, where the earliest of its jobs ends (a rung's end, PBT's next boundary). ``ends``:
    # the configurations whose job ends there (their last hop of the block evaluates for the decision).
    # Decisions written before blocks ran to the next decision were one iteration long (hops 0: shards).
    hops: int = 0
    start: int = 0
    ends: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BlockDecision":
        return cls(**_known(cls, data), **_lineup_of(data))

    def length(self, shards: int) -> int:
        """The hops every configuration of the block trains."""
        return self.hops or shards


@dataclass(frozen=True)
class StageRecord(Record):
    """A shard's worker copied its shard (and the validation set) into its local cache."""

    shard: int
    host: str
    queue: str | None
    cache_dir: str
    data_bytes_read: int
    cache_bytes: int = 0  # the worker's whole shard cache after staging (bounded by store.cache_max_gb)


@dataclass(frozen=True)
class SlotStatus(Record):
    """A shard slot's task in one block, as it last said: what the slots it waits for read.

    ``state``: "running" (``heartbeat`` is refreshed every few seconds while the process lives),
    "done", "yielded" (it gave its pool slot back and comes again), or "failed" (``final``: no retry
    follows, so hops that wait for this slot never come). A try never writes "running" after its
    own final state, and the readers ignore a status of a try older than one they have seen.
    ``last_try``: no retry follows this try, so a "running" whose heartbeat stopped for the wait bound
    is a try that died (killed by its watchdog, its worker lost) and will never say more.
    """

    block: str
    shard: int
    slot: int
    state: str
    heartbeat: float
    try_number: int = 1
    final: bool = False
    host: str | None = None
    pid: int | None = None
    task_id: str | None = None
    trained: int = 0     # hops this try trained
    committed: int = 0   # hops an earlier try had committed, not trained again
    left: int = 0        # hops of this slot still to train
    training: str | None = None  # the hop on the slot now: "c003-e000a6 t=5"
    error: str | None = None
    # the process's training count (batches, commits, looks for hops): the slots waiting for this one
    # judge it by this moving, since a hung process may still heartbeat
    progress: int = 0
    last_try: bool = False
    # when this try first gave its pool slot back ("yielded"), if it did: its next start yields no longer
    # than the wait bound in all from then
    yielding_since: float | None = None


@dataclass(frozen=True)
class Continuation(Record):
    """A continuing run of a search: the search's first run, which block this run trains (0 is the
    first run's), and the global hop its block starts at. The continuing run's conf holds it, and
    its folder a copy (``continues.json``)."""

    first_run: str
    block: int
    start: int


@dataclass(frozen=True)
class RunChain(Record):
    """The runs a search took, first to latest; kept in the first run's folder (``chain.json``)."""

    runs: list[str] = field(default_factory=list)

    def with_run(self, run_id: str) -> "RunChain":
        return self if run_id in self.runs else RunChain([*self.runs, run_id])
