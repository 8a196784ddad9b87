"""The checkpoint file's format, without Keras: an uncompressed ``.npz`` of every model and optimizer
variable (``model/00000``..., ``optimizer/00000``...) plus ``meta``, a UTF-8 JSON header
``{"format": FORMAT, "meta": {...}}``. :mod:`mop_airflow.training.checkpoint` writes and restores
it into a Keras model; a decision step between blocks (population-based training's copy) only
re-labels one with :func:`retag_state`. NumPy only.
"""

from __future__ import annotations

import io
import json
from typing import Any, Mapping

import numpy as np

from mop_airflow.errors import TrainingError

FORMAT = "mop_airflow.checkpoint/1"
META_KEY = "meta"


def retag_state(data: bytes, meta: Mapping[str, Any]) -> bytes:
    """The same state under new meta: population-based training's copy of another configuration's
    checkpoint becomes the copy's own (its id, and ``copied_from`` naming the source)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    header = json.loads(arrays.pop(META_KEY).tobytes().decode())
    if header.get("format") != FORMAT:
        raise TrainingError(f"checkpoint format {header.get('format')!r} is not {FORMAT!r}. "
                            "Fix: restart the configuration from scratch or use the matching mop_airflow version")
    arrays[META_KEY] = np.frombuffer(json.dumps({"format": FORMAT, "meta": dict(meta)}).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()
