"""Model inputs: which columns feed which input, with what shape, and turning rows into arrays.

``data.features`` is resolved once against the source's schema into :class:`InputSpec` records
(kept in the manifest). Shards keep the columns as they came (numbers, lists, encoded images);
tensors are reshaped and images decoded on the worker, in the input pipeline, by :func:`to_arrays`.
The same checks that validation runs per batch (:func:`check_tensor`) guard the decoding, so a
row that slipped through fails with the same sentence.
"""

from __future__ import annotations

import fnmatch
import io
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import numpy as np

from mop_airflow.errors import DataValidationError

SCALAR_INPUT = "features"  # the input name of a plain list or glob of scalar columns


@dataclass(frozen=True)
class Problem:
    """Rows of one column that break one rule; ``text`` words it given the count and the rows' names.

    Validation merges the problems of every batch by (column, rule) into one sentence.
    """

    column: str
    rule: str
    rows: tuple[int, ...]  # row numbers in the batch's file (all of them, or the first few)
    count: int
    text: str  # with {count} and {rows} to fill in

    def sentence(self, rows: str | None = None, count: int | None = None) -> str:
        return self.text.format(count=self.count if count is None else count,
                                rows=rows if rows is not None else _first(np.asarray(self.rows)))


def _problem(column: str, rule: str, rows: Any, first_row: int, text: str) -> Problem:
    rows = np.asarray(rows, dtype=np.int64)
    return Problem(column, rule, tuple(int(r) + first_row for r in rows[:5]), int(rows.size), text)


@dataclass(frozen=True)
class InputSpec:
    """One model input: scalar ``columns`` stacked, or one list / image column reshaped to ``shape``."""

    name: str
    kind: str  # "columns", "tensor" or "image"
    columns: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str = "float32"
    # How shards store a tensor column: None = as the source's list; else the element dtype of a
    # fixed-size binary column holding each row's values back to back (fast to write and read).
    stored: str | None = None
    # Images: decode to this [height, width] with Keras's interpolation name, and convert to the
    # color_mode (rgb, grayscale, rgba); without color_mode an image must have the declared channels.
    resize: tuple[int, int] | None = None
    interpolation: str = "bilinear"
    color_mode: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "columns": list(self.columns), "shape": list(self.shape)}
        # Left out unless set, so the shards of sources without them keep their fingerprint.
        if self.resize is None:
            out.pop("resize"), out.pop("interpolation")
        else:
            out["resize"] = list(self.resize)
        if self.color_mode is None:
            out.pop("color_mode")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "InputSpec":
        return cls(name=data["name"], kind=data["kind"], columns=tuple(data["columns"]),
                   shape=tuple(int(d) for d in data["shape"]), dtype=data.get("dtype", "float32"),
                   stored=data.get("stored"), resize=tuple(data["resize"]) if data.get("resize") else None,
                   interpolation=data.get("interpolation", "bilinear"), color_mode=data.get("color_mode"))

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def resolve_inputs(columns: list[str], features: Any, label: str) -> list[InputSpec]:
    """``data.features`` against the source's columns (the label excluded from globs)."""
    candidates = [c for c in columns if c != label]
    if isinstance(features, Mapping):
        out = []
        for name, spec in features.items():
            if "columns" in spec:
                names = resolve_columns(candidates, spec["columns"], f"data.features.{name}.columns")
                out.append(InputSpec(name, "columns", tuple(names), (len(names),)))
            else:
                kind = "image" if spec.get("decode") == "image" else "tensor"
                out.append(InputSpec(name, kind, (spec.get("column", name),), tuple(spec["shape"]),
                                     spec.get("dtype", "float32"),
                                     resize=tuple(spec["resize"]) if spec.get("resize") else None,
                                     interpolation=spec.get("interpolation", "bilinear"),
                                     color_mode=spec.get("color_mode")))
        return out
    names = resolve_columns(candidates, features, "data.features")
    return [InputSpec(SCALAR_INPUT, "columns", tuple(names), (len(names),))]


def resolve_columns(columns: list[str], features: tuple[str, ...] | list[str] | str, field: str) -> list[str]:
    """A glob (fnmatch) keeps ``columns``' order; a list is taken as is."""
    if not isinstance(features, str):
        return list(features)
    matched = [column for column in columns if fnmatch.fnmatchcase(column, features)]
    if not matched:
        shown = ", ".join(repr(c) for c in columns[:12]) + (f", ... ({len(columns)} in all)" if len(columns) > 12
                                                            else "")
        raise DataValidationError(f"{field}={features!r}", [
            f"the glob {features!r} matches none of the columns ({shown}); "
            f"fix the pattern in {field} or list the feature columns by name"])
    return matched


def input_columns(inputs: list[InputSpec]) -> list[str]:
    return [c for spec in inputs for c in spec.columns]


def input_shapes(inputs: list[InputSpec]) -> dict[str, tuple[int, ...]]:
    return {spec.name: spec.shape for spec in inputs}


def to_arrays(table: Any, inputs: list[InputSpec], *, where: str = "",
              name_rows: Callable[[tuple[int, ...], int], str] | None = None) -> Any:
    """The model's input for ``table``'s rows: one array for one input, else a dict by input name.

    ``name_rows(rows, count)`` words the rows a problem names (an image source names its files).
    """
    arrays = {spec.name: _input_array(table, spec, where, name_rows) for spec in inputs}
    return arrays[inputs[0].name] if len(inputs) == 1 else arrays


def _sentences(problems: list[Problem], name_rows: Callable[[tuple[int, ...], int], str] | None) -> list[str]:
    return [p.sentence(rows=name_rows(p.rows, p.count) if name_rows else None) for p in problems]


def _input_array(table: Any, spec: InputSpec, where: str,
                 name_rows: Callable[[tuple[int, ...], int], str] | None = None) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if spec.kind == "columns":
        x = np.empty((table.num_rows, len(spec.columns)), dtype=np.float32)
        for j, name in enumerate(spec.columns):
            x[:, j] = table[name].to_numpy()
        return x
    column = table[spec.columns[0]]
    if spec.kind == "tensor" and spec.stored:
        return packed_values(column, spec).reshape((table.num_rows, *spec.shape)).astype(dtype, copy=False)
    if spec.kind == "tensor":
        flat, problems = tensor_values(column, spec)
        if problems:
            raise DataValidationError(where or spec.columns[0], _sentences(problems, name_rows))
        return flat.reshape((table.num_rows, *spec.shape)).astype(dtype, copy=False)
    images, problems = decode_images(column, spec)
    if problems:
        raise DataValidationError(where or spec.columns[0], _sentences(problems, name_rows))
    return images.astype(dtype, copy=False)


# -- tensors -----------------------------------------------------------------------------------
def tensor_values(column: Any, spec: InputSpec, first_row: int = 0, *,
                  values: bool = True) -> tuple[np.ndarray, list[Problem]]:
    """The flat float values of a list column and the problems found (type, null, wrong length, NaN/inf).

    ``values=False`` only checks (validation): no float copy of the values is made, which for uint8
    images would be four times the batch.
    """
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    name = spec.columns[0]
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    none = np.empty(0, np.float32)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
            or pa.types.is_fixed_size_list(column.type)):
        return none, [_problem(name, "tensor_type", np.arange(len(column)), first_row,
                               f"column {name!r}: type {column.type} is not a list of numbers, but input "
                               f"{spec.name!r} declares shape {list(spec.shape)}; store each row's tensor as a list, "
                               "or drop 'shape' for a scalar column")]
    value_type = column.type.value_type
    if not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)):
        return none, [_problem(name, "tensor_type", np.arange(len(column)), first_row,
                               f"column {name!r}: list of {value_type} is not numeric; store numbers in the "
                               "tensor column")]
    if column.null_count:
        return none, [_problem(name, "tensor_null", np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)),
                               first_row, f"column {name!r}: {{count}} row(s) have no tensor (null) ({{rows}}); "
                               "remove them")]
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != spec.size)
    if wrong.size:
        seen = sorted(set(lengths[wrong[:5]].tolist()))
        return none, [_problem(name, "tensor_length", wrong, first_row,
                               f"column {name!r}: {{count}} row(s) hold a tensor of the wrong length ({{rows}}; "
                               f"lengths such as {seen}); shape {list(spec.shape)} needs {spec.size} values: fix "
                               "the rows or the declared shape")]
    # Only the values rows reference: a sliced list array still carries its parent's values buffer.
    flat = pc.list_flatten(column)
    if not values:
        if pa.types.is_integer(flat.type) and not flat.null_count:
            return none, []  # integers without nulls are always finite
        ok = pc.fill_null(pc.is_finite(flat) if pa.types.is_floating(flat.type) else pc.is_valid(flat), False)
        finite = ok.to_numpy(zero_copy_only=False)
    else:
        out = flat.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        finite = np.isfinite(out)
    if not finite.all():
        bad_rows = np.unique(np.flatnonzero(~finite) // spec.size)
        return (out if values else none), [_problem(
            name, "tensor_finite", bad_rows, first_row, f"column {name!r}: {{count}} row(s) hold NaN, inf or null "
            "values inside the tensor ({rows}); remove or impute them")]
    return (out if values else none), []


def pack_tensor(column: Any, dtype: str | None = None) -> tuple[Any, str]:
    """A validated list column as fixed-size binary rows of its values (cast to ``dtype`` if given),
    and the values' dtype.

    Nested lists are slow to write and read in Parquet (levels per value); flat binary rows are not.
    """
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    values = np.ascontiguousarray(values if dtype is None else values.astype(dtype, copy=False))
    rows = len(column)
    width = values.nbytes // max(1, rows)
    packed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(max(1, width)), rows, [None, pa.py_buffer(values)])
    return packed, values.dtype.name


def packed_values(column: Any, spec: InputSpec) -> np.ndarray:
    """The values of a column written by :func:`pack_tensor`, flat, in ``spec.stored`` dtype."""
    import pyarrow as pa  # noqa: PLC0415

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    width = column.type.byte_width
    raw = np.frombuffer(column.buffers()[1], dtype=np.uint8)[column.offset * width:(column.offset + len(column)) * width]
    return raw.view(np.dtype(spec.stored))


# -- images ------------------------------------------------------------------------------------
MODE_OF_CHANNELS = {1: "L", 3: "RGB", 4: "RGBA"}
COLOR_MODE_MODES = {"grayscale": "L", "rgb": "RGB", "rgba": "RGBA"}
# Keras's interpolation names as Pillow filters ("area" averages the covered pixels: Pillow's box).
RESAMPLING = {"nearest": 0, "bilinear": 2, "bicubic": 3, "area": 4, "lanczos3": 1}


def decode_images(column: Any, spec: InputSpec, first_row: int = 0) -> tuple[np.ndarray, list[Problem]]:
    """Decode encoded images (JPEG, PNG, BMP, GIF's first frame, WebP; or the ``{bytes, path}``
    struct of dataset exports) to ``spec.shape``, resized and converted as the spec says.

    Pillow decodes: on small images it beats TensorFlow's decoders, whose per-call cost is larger
    than the decoding itself, and a scatter task need not import TensorFlow (README, "Data at scale").
    """
    import pyarrow as pa  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    name = spec.columns[0]
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_struct(column.type) and column.type.get_field_index("bytes") >= 0:
        column = column.field("bytes")
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        return np.empty(0, np.uint8), [_problem(
            name, "image_type", np.arange(len(column)), first_row,
            f"column {name!r}: type {column.type} is not encoded image bytes, but input {spec.name!r} declares "
            "decode='image'; store PNG/JPEG bytes (or a {{bytes, path}} struct), or use 'shape' without 'decode' "
            "for a list column")]
    height, width, channels = spec.shape
    mode = COLOR_MODE_MODES[spec.color_mode] if spec.color_mode else MODE_OF_CHANNELS.get(channels)
    out = np.empty((len(column), height, width, channels), dtype=np.uint8)
    undecodable, wrong_size, sizes, wrong_channels, found_channels = [], [], [], [], []
    for i, raw in enumerate(column.to_pylist()):
        if raw is None:
            undecodable.append(i)
            continue
        try:
            with Image.open(io.BytesIO(raw)) as image:
                if spec.color_mode is None and channels not in _channels(image):
                    wrong_channels.append(i)
                    found_channels.append(min(_channels(image)))
                    continue
                if spec.resize is None and image.size != (width, height):
                    wrong_size.append(i)
                    sizes.append(f"{image.size[1]}x{image.size[0]}")
                    continue
                decoded = image.convert(mode) if mode and image.mode != mode else image
                if spec.resize is not None and decoded.size != (width, height):
                    decoded = decoded.resize((width, height), RESAMPLING[spec.interpolation])
                pixels = np.asarray(decoded)
        except Exception:  # noqa: BLE001 - any decoder error means the bytes are not an image
            undecodable.append(i)
            continue
        out[i] = pixels.reshape(height, width, channels)
    problems = []
    if undecodable:
        problems.append(_problem(name, "image_decode", undecodable, first_row,
                                 f"column {name!r}: {{count}} image(s) cannot be decoded: not an image, or "
                                 "truncated ({rows}); replace or remove them"))
    if wrong_size:
        problems.append(_problem(name, "image_size", wrong_size, first_row,
                                 f"column {name!r}: {{count}} image(s) are not {height}x{width} (height x width) as "
                                 f"declared in shape {list(spec.shape)} ({{rows}}; sizes such as "
                                 f"{', '.join(sorted(set(sizes))[:3])}); resize them, add \"resize\": "
                                 f"[{height}, {width}] to the input to resize while decoding, or fix the shape"))
    if wrong_channels:
        problems.append(_problem(name, "image_channels", wrong_channels, first_row,
                                 f"column {name!r}: {{count}} image(s) have {_counts(found_channels)} channel(s), "
                                 f"not the {channels} declared in shape {list(spec.shape)} ({{rows}}); convert "
                                 "them, or add \"color_mode\": \"" + {1: "grayscale", 3: "rgb", 4: "rgba"}.get(
                                     channels, "rgb") + "\" to the input to convert while decoding"))
    return out, problems


def _channels(image: Any) -> set[int]:
    """The channel counts an image decodes to as it is: a palette image takes any of 1, 3 or 4."""
    if image.mode == "P":
        return {1, 3, 4}
    return {len(image.getbands())}


def _counts(values: list[int]) -> str:
    return " or ".join(str(v) for v in sorted(set(values)))


def _first(rows: np.ndarray, offset: int = 0, limit: int = 5) -> str:
    shown = ", ".join(str(int(r) + offset) for r in rows[:limit])
    more = ", ..." if len(rows) > limit else ""
    return f"row{'s' if len(rows) != 1 else ''} {shown}{more}, counted from 0"
