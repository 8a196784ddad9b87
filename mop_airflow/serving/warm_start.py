"""Which configurations of a run start from an earlier run's weights, and from which checkpoint.

Resolved once, by the run's first task, into ``RunRecord.warm_start``: ``{config_id: source}``
where a source names the earlier run and configuration, the checkpoint of that configuration's
last hop with its sha256 (from the hop record that wrote it), and whether the optimizer state comes
along. It does only when the optimizer settings are the same: a new learning rate, optimizer or
optimizer parameter means the new configuration's optimizer starts afresh (moments, step counter,
learning rate), and only the model's weights are restored.

The earlier run is the DAG's latest reported run, a named one, or the run of its published champion
(:mod:`mop_airflow.serving.champion`), whose winner is the champion.

Matching: ``matching`` pairs configurations of the same content (the hash part of their ids);
``winner`` and ``top_k`` give every new configuration with the same model and hparams as one of the
earlier run's best ``k`` the weights of the best-ranked such one. Configurations without a source
start from random weights, as always.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from mop_airflow.serving.champion import current_champion
from mop_airflow.errors import SpecError
from mop_airflow.records import RunRecord
from mop_airflow.records.layout import RunLayout, run_folder
from mop_airflow.results.runs import last_saved_hop, latest_reported_run
from mop_airflow.store import Store

FINISHED = "finished"


def content_key(config: Mapping[str, Any]) -> str:
    """The content hash part of a configuration id (``c003-e000a6`` -> ``e000a6``)."""
    return config["config_id"].split("-", 1)[-1]


def architecture(config: Mapping[str, Any]) -> str:
    return json.dumps([config["model"], config.get("hparams") or {}], sort_keys=True)


def optimizer_settings(config: Mapping[str, Any]) -> str:
    return json.dumps([config["optimizer"], config.get("optimizer_params") or {}], sort_keys=True)


def source_run(store: Store, dag_id: str, wanted: str, *, exclude: str) -> RunLayout | None:
    """The run to start from: ``wanted`` (a run id); with ``latest`` the newest run of ``dag_id`` that
    wrote a report, other than ``exclude``; with ``champion`` the run of the DAG's published champion.
    None when ``latest`` or ``champion`` finds none (a DAG's first run)."""
    if wanted == "champion":
        champion = current_champion(store, dag_id)
        return None if champion is None else RunLayout(store, champion["dag_id"], champion["run_id"])
    if wanted != "latest":
        layout = run_folder(store, dag_id, wanted)
        if not store.exists(layout.report_uri("leaderboard.json")):
            raise SpecError("search.warm_start.from", wanted, f"run {wanted!r} of DAG {dag_id!r} has no report in "
                            f"the store at {store.root}", "name a run that finished, or use 'latest'")
        return layout
    newest = latest_reported_run(store, dag_id, exclude=exclude)
    return None if newest is None else RunLayout(store, dag_id, newest)


def plan_warm_start(configs: Sequence[Mapping[str, Any]], source: RunLayout, select: str,
                    k: int) -> dict[str, dict[str, Any]]:
    """``{new config_id: source}`` for the configurations that start from ``source``'s weights."""
    store = source.store
    board = store.read_json(source.report_uri("leaderboard.json"))["leaderboard"]
    source_configs = {c["config_id"]: c for c in store.read_json(source.run_record_uri)["configs"]}
    ranked = [source_configs[row["config_id"]] for row in board
              if row.get("status", FINISHED) == FINISHED and row["config_id"] in source_configs]
    pairs: dict[str, Mapping[str, Any]] = {}
    if select == "matching":
        by_content = {content_key(c): c for c in ranked}
        pairs = {c["config_id"]: by_content[content_key(c)] for c in configs if content_key(c) in by_content}
    else:
        lenders = ranked[:1 if select == "winner" else k]
        for config in configs:
            lender = next((c for c in lenders if architecture(c) == architecture(config)), None)
            if lender is not None:
                pairs[config["config_id"]] = lender
    out: dict[str, dict[str, Any]] = {}
    for config_id, lender in pairs.items():
        record = last_saved_hop(source, lender["config_id"])
        if record is None:
            continue  # its checkpoints are gone: this configuration starts fresh
        new = next(c for c in configs if c["config_id"] == config_id)
        out[config_id] = {"run_id": source.run_id, "dag_id": source.dag_id, "config_id": lender["config_id"],
                          "t": record.t, "checkpoint": record.checkpoint, "checkpoint_sha256": record.checkpoint_sha256,
                          "optimizer": optimizer_settings(new) == optimizer_settings(lender)}
    return out


def resolve_warm_start(store: Store, dag_id: str, run_id: str, configs: Sequence[Mapping[str, Any]],
                       spec: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The run's warm starts from ``search.warm_start`` (empty without one, or when no earlier run exists)."""
    if not spec:
        return {}
    source = source_run(store, spec.get("dag_id") or dag_id, spec["from"], exclude=run_id)
    if source is None:
        return {}
    return plan_warm_start(configs, source, spec["select"], spec["k"])


def with_warm_start(run: RunRecord, store: Store) -> RunRecord:
    """``run`` with the earlier run's checkpoints in ``store`` (the run's own) its configurations start
    from (``search.warm_start``)."""
    wanted = run.spec["search"].get("warm_start")
    if not wanted:
        return run
    found = resolve_warm_start(store, run.dag_id, run.run_id, run.configs, wanted)
    return dataclasses.replace(run, warm_start=found)
