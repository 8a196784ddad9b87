"""The trained winner as a file: rebuild it, load its final checkpoint, save it as ``.keras`` and
prove the saved file predicts the same (:func:`export_best`); load such a file as serving does."""

from __future__ import annotations

import json
import os
import platform
import tempfile
from typing import Any

from mop_airflow.planning.schedule import config_seed
from mop_airflow.records import Manifest, RunRecord
from mop_airflow.records.layout import RunLayout


def export_best(layout: RunLayout, run: RunRecord, manifest: Manifest, config_id: str, last_t: int, *,
                cache_dir: str) -> str:
    """Write ``report/best_model.keras`` (and ``best_model.json``) for ``config_id`` after hop ``last_t``."""
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    import pyarrow.parquet as pq  # noqa: PLC0415

    from mop_airflow.data.cache import cached_shard, load_table, manifest_inputs  # noqa: PLC0415
    from mop_airflow.data.decoded import DecodedShard, is_decoded  # noqa: PLC0415
    from mop_airflow.data.inputs import input_shapes  # noqa: PLC0415
    from mop_airflow.training.builder import build_model  # noqa: PLC0415
    from mop_airflow.training.checkpoint import restore_state  # noqa: PLC0415
    from mop_airflow.training.hop import export_keras  # noqa: PLC0415

    store = layout.store
    config = run.config(config_id)
    # 64 validation rows prove the export; the first row group has them (the file may be huge).
    held = cached_shard(store, manifest.validation, cache_dir, manifest=manifest)
    if is_decoded(held):
        xv, _ = DecodedShard.open(held).head(64)
    else:
        xv, _ = load_table(pq.ParquetFile(held).read_row_group(0).slice(0, 64), manifest)
    model = build_model(config, input_shapes=input_shapes(manifest_inputs(manifest)),
                        num_classes=len(manifest.classes), seed=config_seed(run.schedule.seed, config_id),
                        task=manifest.task)
    restore_state(model, store.read_bytes(layout.checkpoint_uri(config_id, last_t)))
    with tempfile.TemporaryDirectory() as tmp:
        path = export_keras(model, os.path.join(tmp, "best_model.keras"))
        reloaded = keras.models.load_model(path, safe_mode=True)  # what serving does: it must load without code
        sample = {k: v[:64] for k, v in xv.items()} if isinstance(xv, dict) else xv[:64]
        if not np.allclose(reloaded.predict(sample, verbose=0), model.predict(sample, verbose=0), atol=1e-5):
            raise RuntimeError("the exported best model predicts differently from the trained one")
        uri = layout.report_uri("best_model.keras")
        store.put_file(path, uri)
    store.write_bytes(layout.report_uri("best_model.json"),
                      json.dumps({"config": config, "features": manifest.features, "inputs": manifest.inputs,
                                  "label": manifest.label, "task": manifest.task, "classes": manifest.classes},
                                 indent=2).encode())
    return uri


def load_saved_model(store: Any, uri: str) -> Any:
    """The ``.keras`` model at ``uri`` in ``store``, loaded the way serving loads it (no custom code)."""
    import keras  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        store.get_file(uri, path)
        return keras.models.load_model(path, safe_mode=True)


def versions() -> dict[str, str]:
    """The versions of what trained and saved a model, for its report and its model card."""
    from importlib import metadata  # noqa: PLC0415

    found = {"python": platform.python_version()}
    for dist in ("mop-airflow", "apache-airflow", "tensorflow", "tensorflow-cpu", "keras", "pyarrow"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return found
