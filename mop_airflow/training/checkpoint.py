"""The training state that hops between shards, as one ``.npz`` byte string.

A hop must carry everything that makes the next hop continue the same SGD run: every model
variable (trainable and non-trainable weights such as BatchNorm statistics, plus the dropout seed
generator states so dropout masks continue rather than repeat) and every optimizer variable
(step counter, learning rate, moments). Variables are matched by position: Keras names them
after the model's auto-numbered name ("sequential_3/..."), which differs between two builds of
the same configuration in one process, while the order is fixed by the builder.

The archive is uncompressed: trained float32 weights and Adam moments compress by only ~8 %, while
``savez_compressed`` was 6-60x slower to save (2.1 M parameters: 0.8 s instead of 12 ms) and 2-4x
slower to load. Nothing is pickled: the meta dict travels as UTF-8 JSON and ``allow_pickle`` is off.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from mop_airflow.errors import TrainingError
from mop_airflow.records.checkpoint_file import FORMAT as _FORMAT
from mop_airflow.records.checkpoint_file import META_KEY as _META_KEY

if TYPE_CHECKING:
    import keras


def _variables(model: keras.Model) -> dict[str, list[Any]]:
    if model.optimizer is None:
        raise TrainingError("the model has no optimizer: build it with mop_airflow.training.builder.build_model")
    return {"model": list(model.variables), "optimizer": list(model.optimizer.variables)}


def state_to_bytes(model: keras.Model, meta: Mapping[str, Any]) -> bytes:
    """All model and optimizer variables plus ``meta`` (JSON-able) as ``.npz`` bytes."""
    return pack_state(take_state(model), meta)


def take_state(model: keras.Model) -> dict[str, list[Any]]:
    """The values of every model and optimizer variable as they are now (by group), for :func:`pack_state`
    to pack later, on another thread, while the model goes on to train another configuration.

    On the JAX backend a value is an immutable device array: it is kept as it is (no device-to-host
    copy on the training thread) and the variable gets a new array when it is next assigned or
    trained. The shard loop never trains a model before it overwrites all of these variables (a
    checkpoint restored, or a fresh build's initial state), so a training step that donates its
    input arrays never gets one of these (:func:`pack_state` checks). Elsewhere (TensorFlow's
    variables change in place) each value is copied to the host here.
    """
    import keras  # noqa: PLC0415

    if keras.config.backend() == "jax":
        return {group: [v.value for v in variables] for group, variables in _variables(model).items()}
    return {group: [np.array(v.numpy()) for v in variables] for group, variables in _variables(model).items()}


def pack_state(values: Mapping[str, list[Any]], meta: Mapping[str, Any]) -> bytes:
    """:func:`take_state`'s values plus ``meta`` (JSON-able) as the ``.npz`` bytes :func:`restore_state` reads."""
    flat = [value for group in values.values() for value in group]
    if any(getattr(value, "is_deleted", lambda: False)() for value in flat):
        raise TrainingError("the training state was taken from a model that trained again before it was saved "
                            "(a training step took its arrays). Fix: report this as a mop_airflow bug")
    if not all(isinstance(value, np.ndarray) for value in flat):
        import jax  # noqa: PLC0415 - only JAX's values are kept on their device

        on_host = jax.device_get(dict(values))  # one transfer for all of them, not one per variable
        values = {group: on_host[group] for group in values}  # in the groups' order (a pytree's is sorted)
    arrays: dict[str, np.ndarray] = {}
    for group, group_values in values.items():
        for index, value in enumerate(group_values):
            arrays[f"{group}/{index:05d}"] = np.asarray(value)
    header = {"format": _FORMAT, "meta": dict(meta)}
    arrays[_META_KEY] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def restore_state(model: keras.Model, data: bytes, expect: Mapping[str, Any] | None = None, *,
                  optimizer: bool = True, verify: Callable[[], None] | None = None) -> dict[str, Any]:
    """Assign a :func:`state_to_bytes` archive to ``model`` (built by ``build_model``); return its meta.

    ``expect`` holds meta values the checkpoint must have (its configuration id and hop): two
    configurations of one builder have the same shapes, so only the meta tells their states apart.
    Every check runs before anything is assigned, so a mismatch leaves the model untouched.

    ``optimizer=False`` restores the model's weights only: a warm start under other optimizer
    settings keeps the model's own optimizer as built (its learning rate, no moments, step 0). The
    optimizer's variables include the learning rate, so restoring them would bring the old one back.

    ``verify()`` raises when ``data`` are not the bytes their hop wrote (a hop's input: their sha256
    differs from the one it recorded; the shard loop computes it on another thread meanwhile). It is
    called after the archive is decoded and checked, and before anything is assigned. With it the
    arrays are read where they lie in one copy of ``data`` (:func:`arrays_in_place`) instead of
    through ``np.load``, whose CRC-32 check of every array the digest makes redundant.
    """
    try:
        put = _accelerator_put()
        if verify is not None:
            arrays = arrays_in_place(data, copy=put is None)
        else:
            with np.load(io.BytesIO(data), allow_pickle=False) as archive:
                arrays = {key: archive[key] for key in archive.files}
        header = json.loads(arrays.pop(_META_KEY).tobytes().decode())
    except (OSError, ValueError, KeyError, UnicodeDecodeError, zipfile.BadZipFile) as exc:
        raise TrainingError(f"checkpoint is not a readable mop_airflow checkpoint ({exc}). "
                            "Fix: check that the store object is complete and was written by mop_airflow") from exc
    if header.get("format") != _FORMAT:
        raise TrainingError(f"checkpoint format {header.get('format')!r} is not {_FORMAT!r}. "
                            "Fix: restart the configuration from scratch or use the matching mop_airflow version")
    meta = header.get("meta") or {}
    wrong = {key: meta.get(key) for key, value in (expect or {}).items() if meta.get(key) != value}
    if wrong:
        raise TrainingError(f"checkpoint holds the state of {_describe(meta)}, not of {_describe(expect or {})}. "
                            "Fix: clear the hop that wrote it (and the hops after it) so it is written again")
    assignments = []
    for group, variables in _variables(model).items():
        if group == "optimizer" and not optimizer:
            continue
        saved = sorted(key for key in arrays if key.startswith(f"{group}/"))
        if len(saved) != len(variables):
            raise TrainingError(f"checkpoint holds {len(saved)} {group} variables but the model has "
                                f"{len(variables)}. Fix: restore into a model built from the same configuration")
        for index, (key, variable) in enumerate(zip(saved, variables)):
            value = arrays[key]
            if tuple(value.shape) != tuple(variable.shape):
                raise TrainingError(f"{group} variable #{index} {variable.path!r}: checkpoint has shape "
                                    f"{tuple(value.shape)}, model has shape {tuple(variable.shape)}. "
                                    "Fix: restore into a model built from the same configuration")
            assignments.append((variable, value))
    values = [value for _, value in assignments]
    if put is not None and values:
        values = put(values)  # on their way to the device while the digest is checked, all in one call
    if verify is not None:
        verify()
    for (variable, _), value in zip(assignments, values):
        variable.assign(value)
    return header["meta"]


def _accelerator_put() -> Callable[[list[np.ndarray]], list[Any]] | None:
    """On JAX with an accelerator, ``jax.device_put``: a restore sends every value to its memory in one
    call, the transfers running together in the background. Elsewhere None: each assign converts its own
    value (JAX's CPU backend may keep the host memory it is given instead of copying it)."""
    from mop_airflow.training.steps import jax_accelerator  # noqa: PLC0415

    if not jax_accelerator():
        return None
    import jax  # noqa: PLC0415

    return jax.device_put


def arrays_in_place(data: bytes, *, copy: bool = True) -> dict[str, np.ndarray]:
    """The arrays of a :func:`pack_state` archive (an uncompressed ``.npz``) as views into ``data``: the
    zip's directory and each ``.npy`` header are parsed; the values are neither copied nor CRC-checked.
    Only for bytes whose digest is checked. ``copy``: views into one writable copy of ``data``, arrays
    that own their memory as np.load's do (needed where a backend may keep that memory as a variable's);
    without it they are read-only views into ``data`` (for values copied to a device at once)."""
    buffer = bytearray(data) if copy else data
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise ValueError(f"{info.filename} is not a stored .npy entry")
            local = info.header_offset
            if data[local:local + 4] != b"PK\x03\x04":
                raise zipfile.BadZipFile(f"no local header for {info.filename}")
            name_length = int.from_bytes(data[local + 26:local + 28], "little")
            extra_length = int.from_bytes(data[local + 28:local + 30], "little")
            start = local + 30 + name_length + extra_length
            version = tuple(data[start + 6:start + 8])
            if data[start:start + 6] != b"\x93NUMPY" or version not in ((1, 0), (2, 0)):
                raise ValueError(f"{info.filename} is not a .npy array of format 1.0 or 2.0")
            size = 2 if version == (1, 0) else 4  # the header's length field
            header_end = start + 8 + size + int.from_bytes(data[start + 8:start + 8 + size], "little")
            npy = io.BytesIO(data[start:header_end])
            np.lib.format.read_magic(npy)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read_header(npy)
            if dtype.hasobject:
                raise ValueError(f"{info.filename} holds Python objects")
            count = int(np.prod(shape, dtype=np.int64))
            if npy.tell() + count * dtype.itemsize != info.file_size:
                raise ValueError(f"{info.filename}: {info.file_size} bytes do not hold {shape} of {dtype}")
            array = np.frombuffer(buffer, dtype=dtype, count=count, offset=start + npy.tell())
            arrays[info.filename[:-len(".npy")]] = array.reshape(shape, order="F" if fortran else "C")
    return arrays


def _describe(meta: Mapping[str, Any]) -> str:
    return f"{meta.get('config_id')} after hop {meta.get('t')}"
