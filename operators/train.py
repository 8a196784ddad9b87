"""One hop (sub-epoch) of one configuration on one shard: the MOP training operator.

Instances are mapped over the group that arrives at this shard: each configuration gets its own
task instance and log. A hop loads the configuration's checkpoint (weights and optimizer state)
from the store, trains on the locally cached shard for ``epochs_per_hop`` passes, evaluates on the
validation set when the iteration ends, saves the new checkpoint atomically and pushes only its URI
and a few numbers to XCom. A hop record with timings lands in the store for the report and the
benchmark.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Mapping

from airflow.sdk.exceptions import AirflowSkipException

from mop_airflow.schedule import config_seed

from mop_airflow.operators.base import MopBaseOperator


class MopTrainHopOperator(MopBaseOperator):
    template_fields = ("assignment",)
    ui_color = "#fbe3e0"

    def __init__(self, *, assignment: Mapping[str, Any], t: int, shard: int, rung_end: bool = False,
                 prune_failures: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.assignment = assignment
        self.t = t
        self.shard = shard
        self.rung_end = rung_end  # an adaptive rung ends here: always evaluate, promotion needs the metric
        self.prune_failures = prune_failures  # adaptive search: a failing configuration is pruned, not fatal

    def execute(self, context: Any) -> dict[str, Any]:
        assignment = dict(self.assignment)
        if assignment.get("pruned"):
            raise AirflowSkipException(f"{assignment['config_id']} was pruned: {assignment['pruned']}")
        if not self.prune_failures:
            return self._hop(context, assignment)
        try:
            return self._hop(context, assignment)
        except Exception as exc:  # noqa: BLE001 - recorded, then the configuration is pruned
            spec = self.effective_spec(context)
            layout = self.layout(context, spec)
            iteration, hop = divmod(self.t, spec.schedule.shards)
            status = "diverged" if "diverged" in str(exc) else "failed"
            layout.store.write_json(layout.hop_record_uri(assignment["config_id"], self.t), {
                "config_id": assignment["config_id"], "t": self.t, "iteration": iteration, "hop": hop,
                "shard": self.shard, "status": status, "error": f"{type(exc).__name__}: {exc}"[:1000]})
            self.log.exception("%s %s at hop %d; it will be pruned", assignment["config_id"], status, self.t)
            raise AirflowSkipException(f"{assignment['config_id']} {status}: {exc}") from exc

    def _hop(self, context: Any, assignment: dict[str, Any]) -> dict[str, Any]:
        entered = time.time()
        ti = context["ti"]
        started = ti.start_date.timestamp() if getattr(ti, "start_date", None) else entered
        spec = self.effective_spec(context)
        layout = self.layout(context, spec)
        config, cid = assignment["config"], assignment["config_id"]
        if assignment["t"] != self.t - 1:
            raise RuntimeError(f"{cid} arrives from hop {assignment['t']} but this is hop {self.t}: "
                               "the DAG and the plan disagree; re-parse the DAG file")
        p = spec.schedule.shards
        iteration, hop = divmod(self.t, p)
        manifest = layout.store.read_json(layout.manifest_pointer_uri)

        from mop_airflow.data.cache import cached_shard, load_xy  # noqa: PLC0415

        def load(entry: Mapping[str, Any]) -> tuple[Any, Any]:
            path = cached_shard(layout.store, entry, spec.store.local_cache)
            return load_xy(path, manifest["features"], manifest["label"], manifest["classes"])

        metadata_bytes = layout.store.bytes_read
        x, y = load(manifest["shards"][self.shard])
        shard_bytes = layout.store.bytes_read - metadata_bytes  # 0 once the shard is in this worker's cache
        shard_read = time.time()

        from mop_airflow.training.builder import build_model  # noqa: PLC0415 - TensorFlow loads here
        from mop_airflow.training.checkpoint import restore_state, state_to_bytes  # noqa: PLC0415
        from mop_airflow.training.hop import evaluate, train_on_shard  # noqa: PLC0415

        imported = time.time()
        seed = config_seed(spec.schedule.seed, cid)
        model = build_model(config, input_dim=x.shape[1], num_classes=len(manifest["classes"]), seed=seed)
        built = time.time()
        checkpoint_bytes = 0
        if assignment["checkpoint"]:
            state_in = layout.store.read_bytes(assignment["checkpoint"])
            checkpoint_bytes = len(state_in)
            restore_state(model, state_in)
        loaded = time.time()
        train = train_on_shard(model, x, y, batch_size=config["batch_size"], epochs=config["epochs_per_hop"],
                               seed=seed, iteration=iteration, shard=self.shard)
        trained = time.time()
        val = None
        if self.rung_end or (hop == p - 1 and spec.schedule.evaluates_after(iteration)):
            before = layout.store.bytes_read
            xv, yv = load(manifest["validation"])
            shard_bytes += layout.store.bytes_read - before
            val = evaluate(model, xv, yv, batch_size=max(config["batch_size"], 256))
        evaluated = time.time()
        out_uri = layout.checkpoint_uri(cid, self.t)
        meta = {"config_id": cid, "t": self.t, "iteration": iteration, "hop": hop, "shard": self.shard}
        state = state_to_bytes(model, meta)
        layout.store.write_bytes(out_uri, state)
        saved = time.time()
        record = {
            **meta, "status": "ok",
            "host": getattr(ti, "hostname", None) or socket.getfqdn(), "pid": os.getpid(), "queue": self.queue, "pool": self.pool,
            "map_index": getattr(ti, "map_index", -1), "try_number": getattr(ti, "try_number", 1),
            "started_at": started, "execute_at": entered, "train_begin": loaded, "train_end": trained,
            "saved_at": saved,
            "timings": {"startup": entered - started, "shard_read": shard_read - entered,
                        "imports": imported - shard_read, "build": built - imported,
                        "checkpoint_load": loaded - built, "train": trained - loaded,
                        "evaluate": evaluated - trained, "save": saved - evaluated},
            "train_metrics": train, "val_metrics": val,
            "checkpoint": out_uri, "checkpoint_bytes": len(state),
            "bytes_read": {"metadata": metadata_bytes, "data": shard_bytes, "checkpoint": checkpoint_bytes},
        }
        layout.store.write_json(layout.hop_record_uri(cid, self.t), record)
        self.log.info("%s hop t=%d (iteration %d, hop %d) on shard %d: loss %.4f%s; %.2fs training of %.2fs",
                      cid, self.t, iteration, hop, self.shard, train["loss"],
                      f", val {val}" if val else "", train["train_seconds"], saved - started)
        return {"config_id": cid, "config": config, "checkpoint": out_uri, "t": self.t,
                "loss": train["loss"], "val": val}
