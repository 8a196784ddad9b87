"""One hop of a bundle of configurations on one shard: the MOP training operator.

Each bundle's hops are a chain of plain tasks in its offset class's task group: a hop waits only
for its chain's previous hop and a slot of its shard's pool. A chain's first hop picks its bundle
from the list its class's stage (or deal) task returned; later hops get it from the hop before. The work is
:func:`mop_airflow.training.bundle_hop.run_bundle_hop`, which trains the bundle's configurations
one after another; this operator maps Airflow's context onto it and its outcome onto task states.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from mop_airflow.errors import StoreError
from mop_airflow.store import transient
from mop_airflow.records import BundleAssignment, Manifest

from mop_airflow.operators.base import MopBaseOperator


# Failures of the infrastructure, not of a configuration: they fail the task, which retries (and
# the retry skips the configurations whose hop is already committed).
RETRIED = (StoreError, AirflowException)


class MopTrainHopOperator(MopBaseOperator):
    template_fields = ("bundle",)
    ui_color = "#fbe3e0"

    def __init__(self, *, bundle: Any, t: int, shard: int, rung_end: bool = False, pick: int | None = None,
                 relative: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bundle = bundle  # a BundleAssignment as a dict, or (with ``pick``) the class's list of them
        self.pick = pick
        self.t = t
        self.shard = shard
        self.rung_end = rung_end  # an adaptive rung ends here: always evaluate, promotion needs the metric
        # a block of a search decided between blocks: step t of the block, each configuration its own next hop
        self.relative = relative

    def picked(self) -> Mapping[str, Any] | None:
        """This chain's bundle, or None when the run gave its class fewer bundles than it has chains."""
        if self.pick is None:
            return self.bundle
        listed = self.bundle or []
        return listed[self.pick] if self.pick < len(listed) else None

    @property
    def bundle_name(self) -> str:
        """What Airflow shows beside the task instance: ``b2: c001-6e7014, c005-0c54d0``."""
        try:
            picked = self.picked()
        except (TypeError, KeyError, IndexError):  # not rendered yet
            return ""
        return picked.get("name", "") if isinstance(picked, Mapping) else ""

    def work(self, context: Any) -> dict[str, Any]:
        # This hop's slot and GPU, before TensorFlow starts its devices in this task process (a CPU
        # worker, without MOP_GPUS or CUDA_VISIBLE_DEVICES, is left exactly as it is).
        from mop_airflow.training.devices import place_this_process  # noqa: PLC0415

        placement = place_this_process()
        if placement is not None and placement.gpu is not None:
            self.log.info("hop slot %d on GPU %s (%d slot(s) share it%s)", placement.slot, placement.gpu,
                          placement.slots_sharing, ", memory grows on demand" if placement.memory_growth else "")

        from mop_airflow.training.bundle_hop import run_bundle_hop  # noqa: PLC0415
        from mop_airflow.training.model_hop import Where  # noqa: PLC0415

        picked = self.picked()
        if picked is None:  # the stage task skips such chains; this is the guard if it could not
            raise AirflowSkipException(f"this run has no bundle for chain {self.pick} of this class")
        layout = self.layout(context)
        run = self.run_record(layout)
        bundle = BundleAssignment.from_dict(picked)
        if not bundle.assignments:  # every configuration of it failed in an earlier block of the search
            raise AirflowSkipException(f"bundle {bundle.bundle} has no configuration left to train")
        continuing = self.continuation(context)
        # this task's hop in the whole search: a continuing run renders the same tasks for a later block
        t = None if self.relative else self.t + (continuing.start if continuing else 0)
        ti = context["ti"]
        opened: list[str] = []

        def section(cid: str) -> None:
            # Airflow's log view folds each ::group:: section: one per configuration of the bundle
            if opened:
                self.log.info("::endgroup::")
            self.log.info("::group::%s: hop %s on shard %d", cid, "+1" if t is None else t, self.shard)
            opened.append(cid)

        where = Where(task_id=self.task_id, host=getattr(ti, "hostname", None), queue=self.queue, pool=self.pool,
                      map_index=getattr(ti, "map_index", -1), try_number=getattr(ti, "try_number", 1),
                      started_at=ti.start_date.timestamp() if getattr(ti, "start_date", None) else None)
        done = run_bundle_hop(
            layout, run, Manifest.read(layout.store, layout.manifest_pointer_uri), bundle, t=t, shard=self.shard,
            rung_end=self.rung_end, cache_dir=self.store_spec(context).local_cache, where=where,
            # the store or Airflow itself, search.fail_fast, or a worker going away: the task fails and retries
            fatal=lambda exc: isinstance(exc, RETRIED) or run.fail_fast or transient(exc),
            section=section)
        if opened:
            self.log.info("::endgroup::")
        self.log.info("bundle %s: %d trained, %d already committed, %d failed at hop %s", bundle.name,
                      len(done.records) - len(done.skipped), len(done.skipped), len(done.failed),
                      f"{self.t} of the block" if t is None else t)
        if not done.out.assignments:
            # Every configuration of the bundle failed: the rest of its chain is skipped.
            raise AirflowSkipException(f"every configuration of {bundle.name} failed: "
                                       + "; ".join(f"{r.config_id} {r.status}: {r.error}" for r in done.failed))
        return done.out.to_dict()
