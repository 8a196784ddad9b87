"""Champion and challenger: which model a DAG serves, and whether a run's winner replaces it.

Every model a DAG publishes is an entry of its registry, ``<store>/<dag_id>/registry.json``, newest
last; the last entry is the champion. After a run's report, :func:`challenge` evaluates the run's
winner (the challenger) and the champion on this run's validation shard, with the same code and
batch size, and decides: publish only if the challenger is better by more than ``publish.margin``
in the ranking metric's direction. The decision and its reason go to ``report/challenge.json`` and
the summary; the publish task then appends the entry (:func:`publish`) and emits the
``mop://<dag_id>/champion`` Asset event whose extra is :func:`asset_extra`, or is skipped.

A rollback re-publishes an earlier entry (:func:`republish`): a new entry naming the earlier run,
so the history keeps every change of champion in order.

Nothing here imports Airflow; Keras loads only in :func:`challenge`.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Mapping

from mop_airflow.errors import SpecError, StoreError
from mop_airflow.records.layout import RunLayout, read_run, run_folder
from mop_airflow.records import Manifest, RunRecord
from mop_airflow.store import Store, safe_segment

EVAL_BATCH = 256  # both models are evaluated with it, so their metrics are comparable to the last digit


def champion_asset_uri(dag_id: str) -> str:
    """The Asset a DAG's publish task emits an event on whenever its champion changes."""
    return f"mop://{dag_id}/champion"


def registry_uri(store: Store, dag_id: str) -> str:
    return store.uri(safe_segment(dag_id), "registry.json")


def read_registry(store: Store, dag_id: str) -> list[dict[str, Any]]:
    """Every entry the DAG ever published, oldest first ([] before the first)."""
    uri = registry_uri(store, dag_id)
    return list(store.read_json(uri)["history"]) if store.exists(uri) else []


def current_champion(store: Store, dag_id: str) -> dict[str, Any] | None:
    history = read_registry(store, dag_id)
    return history[-1] if history else None


def run_entry(layout: RunLayout) -> dict[str, Any]:
    """What publishing a reported run's winner records: its configuration, metric, model and data."""
    store = layout.store
    summary_uri = layout.report_uri("summary.json")
    if not store.exists(summary_uri):
        raise StoreError(f"run {layout.run_id} of {layout.dag_id} has no report in {layout.run_uri}: only a run "
                         "whose report task finished can be published. Fix: pick a run from `mop-airflow champion "
                         "list` or one that finished")
    return entry_of(layout, store.read_json(summary_uri), read_run(layout),
                    Manifest.read(store, layout.manifest_pointer_uri))


def entry_of(layout: RunLayout, summary: Mapping[str, Any], run: RunRecord, manifest: Manifest) -> dict[str, Any]:
    """:func:`run_entry` from the run's records already read."""
    best = summary["best"]
    return {"dag_id": layout.dag_id, "run_id": layout.run_id, "config_id": best["config_id"],
            "metric": run.metric, "direction": run.direction, "value": best[run.metric],
            "model_uri": summary["best_model_uri"], "report_uri": layout.report_uri(""),
            "data_fingerprint": manifest.fingerprint, "configuration": run.config(best["config_id"]),
            "checkpoint_sha256": summary.get("best_checkpoint_sha256")}


def better(challenger: float, champion: float, direction: str, margin: float) -> bool:
    """Whether ``challenger`` beats ``champion`` by more than ``margin`` (a tie never does)."""
    gain = champion - challenger if direction == "min" else challenger - champion
    return math.isfinite(challenger) and (not math.isfinite(champion) or gain > margin)


def incompatible(champion: Manifest, manifest: Manifest) -> str | None:
    """Why the champion's model cannot score this run's data, or None when it can."""
    for name in ("task", "label", "classes", "inputs"):
        if getattr(champion, name) != getattr(manifest, name):
            return (f"its data had other {name} ({_short(getattr(champion, name))}, this run's: "
                    f"{_short(getattr(manifest, name))})")
    return None


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."


def challenge(layout: RunLayout, run: RunRecord, summary: Mapping[str, Any], *, cache_dir: str) -> dict[str, Any]:
    """Decide whether the run's winner replaces the DAG's champion; write ``report/challenge.json`` and
    the decision into ``report/summary.json``. Returns the decision."""
    store = layout.store
    metric, direction, margin = run.metric, run.direction, run.publish.margin
    manifest = Manifest.read(store, layout.manifest_pointer_uri)
    entry = entry_of(layout, summary, run, manifest)
    decision: dict[str, Any] = {"metric": metric, "direction": direction, "margin": margin, "publish": False,
                                "decided_at": dt.datetime.now(dt.timezone.utc).isoformat(),
                                "challenger": {k: entry[k] for k in ("run_id", "config_id", "model_uri")},
                                "champion": None, "entry": entry}
    champion = current_champion(store, run.dag_id)
    if not run.publish.enabled:
        decision["reason"] = "publishing is off for this DAG (publish.enabled is false): the champion stays"
        return _record(layout, summary, decision)
    if champion is not None and champion["run_id"] == run.run_id and champion["config_id"] == entry["config_id"]:
        decision.update(champion=champion, reason=f"{entry['config_id']} of this run is already the champion "
                        f"(version {champion['version']})")
        return _record(layout, summary, decision)

    if champion is None:  # nothing to compare with: its leaderboard value, from the same validation data
        decision["challenger"]["value"] = entry["value"]
        decision.update(publish=True, reason=f"first champion of {run.dag_id}: {entry['config_id']} with "
                        f"{metric}={entry['value']:.6g}")
        return _record(layout, summary, decision)
    weights = entry.get("checkpoint_sha256")
    if weights and champion.get("checkpoint_sha256") == weights and champion.get("data_fingerprint") == manifest.fingerprint:
        # The champion's very weights, on the data it was chosen on (a retrain over unchanged data
        # repeats its run): both evaluations would give one value, and a tie never replaces it.
        decision["challenger"]["value"] = champion["value"]
        decision["champion"] = {**{k: champion[k] for k in ("version", "run_id", "config_id", "model_uri")},
                                "recorded_value": champion["value"], "value": champion["value"]}
        decision.update(gain=0.0, reason=(
            f"the winner {entry['config_id']} has the very weights of the champion (version {champion['version']}, "
            f"{champion['config_id']} of run {champion['run_id']}: checkpoint sha256 {weights[:12]}) on the same data "
            f"({manifest.fingerprint}), so {metric}={champion['value']:.6g} for both: a tie; the champion stays"))
        return _record(layout, summary, decision)
    challenger_value = evaluate_model(store, entry["model_uri"], metric, manifest, run, cache_dir)
    entry["value"] = challenger_value
    decision["challenger"]["value"] = challenger_value

    decision["champion"] = {k: champion[k] for k in ("version", "run_id", "config_id", "model_uri")}
    decision["champion"]["recorded_value"] = champion["value"]
    why_not = champion_unusable(store, champion, manifest)
    if why_not is None:
        try:
            champion_value = evaluate_model(store, champion["model_uri"], metric, manifest, run, cache_dir)
        except KeyError:
            why_not = f"its model reports no {metric}"
    if why_not is not None:
        decision.update(publish=True, reason=f"the champion (version {champion['version']}, run "
                        f"{champion['run_id']}) cannot be evaluated on this run's validation data: {why_not}; "
                        f"the winner {entry['config_id']} ({metric}={challenger_value:.6g}) replaces it")
        return _record(layout, summary, decision)
    decision["champion"]["value"] = champion_value
    gain = champion_value - challenger_value if direction == "min" else challenger_value - champion_value
    decision["gain"] = gain
    said = (f"on this run's validation data the winner {entry['config_id']} has {metric}={challenger_value:.6g} "
            f"and the champion (version {champion['version']}, {champion['config_id']} of run "
            f"{champion['run_id']}) {champion_value:.6g}")
    if better(challenger_value, champion_value, direction, margin):
        decision.update(publish=True, reason=f"{said}: better by {gain:.6g}, more than the margin {margin:g}")
    else:
        decision["reason"] = (f"{said}: {'better by only' if gain > 0 else 'not better, a gain of'} {gain:.6g}, "
                              f"which does not exceed the margin {margin:g}; the champion stays")
    return _record(layout, summary, decision)


def _record(layout: RunLayout, summary: Mapping[str, Any], decision: dict[str, Any]) -> dict[str, Any]:
    layout.store.write_json(layout.report_uri("challenge.json"), decision)
    layout.store.write_json(layout.report_uri("summary.json"),
                            {**summary, "challenge": {k: v for k, v in decision.items() if k != "entry"}})
    return decision


def champion_unusable(store: Store, champion: Mapping[str, Any], manifest: Manifest) -> str | None:
    """Why the champion cannot be evaluated here (its model or run is gone, other inputs), or None."""
    if not store.exists(champion["model_uri"]):
        return f"its model {champion['model_uri']} is no longer in the store"
    source = RunLayout(store, champion["dag_id"], champion["run_id"])
    if not store.exists(source.manifest_pointer_uri):
        return f"its run's manifest {source.manifest_pointer_uri} is no longer in the store"
    return incompatible(Manifest.read(store, source.manifest_pointer_uri), manifest)


def evaluate_model(store: Store, model_uri: str, metric: str, manifest: Manifest, run: RunRecord,
                   cache_dir: str) -> float:
    """``metric`` of the saved ``.keras`` model at ``model_uri`` on the run's validation shard."""
    from mop_airflow.training.best_model import load_saved_model  # noqa: PLC0415 - Keras loads here
    from mop_airflow.training.model_hop import evaluate_validation  # noqa: PLC0415

    model = load_saved_model(store, model_uri)
    return float(evaluate_validation(model, store, manifest, run, cache_dir, batch_size=EVAL_BATCH)[metric])


def publish(store: Store, dag_id: str, entry: Mapping[str, Any], *, reason: str, by: str = "run") -> dict[str, Any]:
    """Append ``entry`` to the registry as the new champion and return it with its version.

    Publishing the model that is already the champion (a retried publish task, a rollback to the
    current entry) appends nothing and returns the current entry.
    """
    history = read_registry(store, dag_id)
    last = history[-1] if history else None
    if last is not None and (last["dag_id"], last["run_id"], last["config_id"]) == (
            entry["dag_id"], entry["run_id"], entry["config_id"]):
        return last
    published = {**{k: v for k, v in entry.items() if k not in ("version", "published_at", "reason", "published_by")},
                 "version": len(history) + 1, "published_at": dt.datetime.now(dt.timezone.utc).isoformat(),
                 "published_by": by, "reason": reason}
    store.write_json(registry_uri(store, dag_id), {"dag_id": dag_id, "history": [*history, published]})
    return published


def republish(store: Store, dag_id: str, which: str) -> dict[str, Any]:
    """Roll back (or forward): make ``which`` (a registry version number, or a reported run's id; a
    number that is a version is the version) the champion again, as a new registry entry. Returns
    that entry, or the current one when ``which`` already is the champion."""
    history = read_registry(store, dag_id)
    by_version = {str(e["version"]): e for e in history}
    if which in by_version:
        entry, what = by_version[which], f"version {which}"
    elif which.isdigit() and not store.exists(run_folder(store, dag_id, which).report_uri("summary.json")):
        raise SpecError("version", which, f"is not a version in {dag_id}'s registry "
                        f"({', '.join(by_version) or 'it is empty'})", "pick one from `mop-airflow champion list`")
    else:
        earlier = next((e for e in reversed(history) if e["run_id"] == which), None)
        entry = earlier if earlier is not None else run_entry(run_folder(store, dag_id, which))
        what = f"run {which}"
    if not store.exists(entry["model_uri"]):
        raise StoreError(f"the model of {what} ({entry['model_uri']}) is no longer in the store: it cannot serve "
                         "again. Fix: pick another entry from `mop-airflow champion list`")
    current = history[-1] if history else None
    reason = (f"re-published {what} by hand" + (f", replacing version {current['version']}" if current else ""))
    return publish(store, dag_id, entry, reason=reason, by="cli")


def asset_extra(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The champion Asset event's extra: what a deployment DAG needs to load and describe the model."""
    return {"dag_id": entry["dag_id"], "run_id": entry["run_id"], "config_id": entry["config_id"],
            "version": entry["version"], "metric": entry["metric"], "value": entry["value"],
            "direction": entry["direction"], "model_uri": entry["model_uri"],
            "data_fingerprint": entry["data_fingerprint"], "configuration": entry["configuration"]}
