"""First task of a run: resolve the run once and check what would otherwise fail late.

Applies the trigger conf, expands the search space, finds every model builder's module, proves that
the store honours create-if-absent (:func:`~mop_airflow.store.check_create_if_absent`) and makes
sure the shard pools exist (Airflow never schedules a task whose pool is missing). The resolved
run record goes to XCom; the plan task writes it to the store once the data has passed validation,
so a run with bad input leaves nothing in the store.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mop_airflow.hooks.pools import POOL_MODES, check_parallelism, check_queues_served, ensure_pools, required_pools
from mop_airflow.errors import SpecError
from mop_airflow.hooks.connections import open_spec_store
from mop_airflow.planning.resolve import resolve_run
from mop_airflow.serving.warm_start import with_warm_start
from mop_airflow.planning.run_chain import CONF_KEY
from mop_airflow.planning.task_plan import CONTINUING_SKIPS
from mop_airflow.records.layout import RunLayout
from mop_airflow.records.selection import conf_of
from mop_airflow.store import check_create_if_absent

from mop_airflow.operators.base import MopBaseOperator


def running_in_dag_test() -> bool:
    """True inside ``dag.test()`` / ``airflow dags test``: tasks run one by one in that process and
    no scheduler, hence no pool, ever holds them back; there may be no REST API to ask either."""
    try:
        from airflow.sdk.execution_time import task_runner  # noqa: PLC0415
        from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms  # noqa: PLC0415
    except ImportError:  # another Airflow layout: assume a real deployment and check
        return False
    return isinstance(getattr(task_runner, "SUPERVISOR_COMMS", None), InProcessSupervisorComms)


# data.source and data.validation may be Jinja templates (an upstream task's XCom, a date), rendered
# when the run starts; a MopTaskGroup turns an XComArg there into such a template.
TEMPLATED_DATA = ("source", "validation")


class MopPreflightOperator(MopBaseOperator):
    template_fields = ("data_templates",)

    def __init__(self, *, spec: Mapping[str, Any], pools: str = "create",
                 builder_modules: Sequence[str] | None = None, **kwargs: Any) -> None:
        super().__init__(store=spec["store"], **kwargs)
        data = spec.get("data") or {}
        self.data_templates = {key: data[key] for key in TEMPLATED_DATA
                               if isinstance(data.get(key), str) and "{{" in data[key]}
        if pools not in POOL_MODES:
            raise SpecError("pools", pools, f"must be one of {list(POOL_MODES)}",
                            "pass build_mop_dag(pools='create'), 'check' or 'off'")
        self.spec = dict(spec)
        self.pools = pools
        self.builder_modules = None if builder_modules is None else list(builder_modules)

    def work(self, context: Any) -> dict[str, Any]:
        # The trigger conf as given (the form sends its sections, the REST API and CLI what they name);
        # params would also hold the DAG's defaults and hide a misspelt section.
        continuing = self.continuation(context)
        if continuing is not None:
            # The search was resolved once, by its first run: this run trains its next block.
            layout = self.layout(context)
            if not layout.store.exists(layout.run_record_uri):
                raise SpecError(f"conf.{CONF_KEY}.first_run", continuing.first_run,
                                f"names no search of this DAG: {layout.run_record_uri} is not in the store",
                                f"trigger without {CONF_KEY} to start a new search")
            run = self.run_record(layout)
            self.log.info("continues the search of run %s: block %d, from hop %d", continuing.first_run,
                          continuing.block, continuing.start)
            self._pools(run.schedule)
            from airflow.sdk.exceptions import DownstreamTasksSkipped  # noqa: PLC0415

            # Sharded and planned by the search's first run: straight on to staging this block. The
            # record is still this task's result: the results page and `mop-airflow status` read it.
            context["ti"].xcom_push(key="return_value", value=run.to_dict())
            raise DownstreamTasksSkipped(tasks=list(CONTINUING_SKIPS))
        self._check_one_run_suffices(context)
        conf = conf_of(getattr(context.get("dag_run"), "conf", None), self.selection)
        run = resolve_run(self.rendered_spec(), conf, dag_id=self.selection_id(context), run_id=context["run_id"],
                          allowed_modules=self.builder_modules)
        store = open_spec_store(run.store)
        # decisions taken inside the shard slots rely on an atomic create: refused here if the store fakes it
        check_create_if_absent(store, RunLayout(store, run.dag_id, run.run_id).run_uri)
        run = with_warm_start(run, store)
        if run.warm_start:
            sources = sorted({f"{w['run_id']}/{w['config_id']}" for w in run.warm_start.values()})
            self.log.info("%d of %d configurations start warm from %s", len(run.warm_start), len(run.configs),
                          ", ".join(sources))
        schedule = run.schedule
        pools = self._pools(schedule)
        # an adaptive search's iterations are its rungs' (search.adaptive), not schedule.iterations
        length = (f"search.adaptive {dict(run.adaptive)}" if run.adaptive
                  else f"{schedule.iterations} iterations")
        self.log.info("%d configurations, %d shards, %s; pools %s", len(run.configs), schedule.shards, length,
                      ", ".join(pools))
        return run.to_dict()

    def _check_one_run_suffices(self, context: Any) -> None:
        """``dag.test()`` runs one DAG run: a search split over several (a ``next_run`` task) would
        train its first block and stop, so it is refused before anything trains."""
        dag = context.get("dag")
        if self.selection is not None or dag is None or not running_in_dag_test():
            return
        if dag.has_task("decide") and not getattr(dag.get_task("decide"), "whole", False):  # not all in one run
            search = self.spec["search"]
            if search.get("adaptive") is None:  # a model-based random search: proposals wait for results
                raise SpecError("search.space.sampler", "tpe", "proposes configurations between blocks of hops, "
                                "one block a DAG run, and dag.test() runs only one",
                                "run it on Airflow (mop-airflow up, then trigger it), or test a copy with the "
                                "random sampler")
            method = search["adaptive"]["method"]
            raise SpecError("search.adaptive.method", method, "is decided between blocks of hops, one "
                            "block a DAG run (their number is not known up front), and dag.test() runs only one",
                            "run it on Airflow (mop-airflow up, then trigger it)"
                            + (", or give ASHA a budget" if method == "asha" else ""))
        if not dag.has_task("next_run"):
            return
        following = dag.get_task("next_run")
        runs = following.hops // following.hops_per_run
        raise SpecError("schedule.iterations_per_run", self.spec["schedule"]["iterations_per_run"],
                        f"splits this search over {runs} DAG runs of {following.hops_per_run} hop(s) each, and dag.test() "
                        "runs only one", "run it on Airflow (mop-airflow up, then trigger it), or test a copy with "
                        "schedule.iterations_per_run equal to schedule.iterations")

    def _pools(self, schedule: Any) -> list[str]:
        """The shard pools, made sure of (created, checked or left alone as ``pools`` says)."""
        pools = required_pools(schedule.shards)
        if running_in_dag_test():
            self.log.info("dag.test(): tasks run one at a time in this process (each block's first train task "
                          "trains every shard's hops); pools are not used; not checked")
            return pools
        # a block's train tasks wait for each other's hops: all of them must be able to run at once
        check_parallelism(schedule.shards, schedule.slots_per_shard)
        # ... so under Celery a worker must listen on each shard's queue (a task there waits for ever else)
        try:
            check_queues_served(pools, slots=schedule.slots_per_shard)
        except ImportError:  # a CeleryExecutor named without its provider: the scheduler says so itself
            pass
        if self.pools != "off":
            created = ensure_pools(pools, shards=schedule.shards, slots=schedule.slots_per_shard, mode=self.pools)
            if created:
                self.log.info("created pools %s with %d slot(s) each", ", ".join(created), schedule.slots_per_shard)
        return pools

    def rendered_spec(self) -> dict[str, Any]:
        """The spec with its data templates as this run rendered them; one that renders to nothing fails here."""
        if not self.data_templates:
            return self.spec
        data = dict(self.spec["data"])
        for key, value in self.data_templates.items():
            template = self.spec["data"][key]
            if value is None or not str(value).strip() or str(value).strip() in ("None", "[]", "{}"):
                raise SpecError(f"data.{key}", template, f"rendered to no data ({value!r}) for this run",
                                "make the upstream task return the path or URI of its data (a non-empty string), "
                                "or check the task id the template pulls from")
            data[key] = str(value).strip()
        return {**self.spec, "data": data}
