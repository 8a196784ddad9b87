"""What a run records: typed records written once to the store (:mod:`.schema`), where each lives
(:mod:`.layout`), and which model selection they belong to (:mod:`.selection`). No Airflow, no TensorFlow."""

from mop_airflow.records.schema import (  # noqa: F401 - the package's names
    Record, RunRecord, Plan, Assignment, ShardEntry, SourceFile, SourceListing,
    DataSlice, ShardingPlan, SliceResult, Manifest, HopRecord, RungDecision, BlockDecision, StageRecord, Continuation,
    RunChain, SlotStatus,
)
