"""Typed, validated configuration of a model-selection job.

A :class:`MopSpec` is plain data: it is built when the DAG file is parsed (cheap, no TensorFlow),
travels to tasks as a dict (``to_dict`` / ``from_dict``) and can be overridden per run through the
trigger conf. Every rule is checked in ``__post_init__`` and a broken rule raises
:class:`~mop_airflow.errors.SpecError` naming the field, the value, the rule and the fix.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from mop_airflow.errors import SpecError, unknown_key
from mop_airflow.search.space import SearchSpace

# Metric names whose smaller value is better; anything else named here is larger-is-better.
_LOWER_IS_BETTER = ("loss", "error", "mse", "mae", "mape", "crossentropy", "hinge")
_HIGHER_IS_BETTER = ("accuracy", "auc", "precision", "recall", "f1")
SPEC_SECTIONS = ("data", "search", "schedule", "store", "publish")  # what a trigger conf may override


def default_home() -> str:
    """Project home folder: ``$MOP_HOME`` or ``~/mop_airflow`` (:mod:`mop_airflow.config.environment`)."""
    from mop_airflow.config.environment import project_home  # noqa: PLC0415

    return project_home()


def metric_direction(metric: str, direction: str | None = None) -> str:
    """'min' or 'max' for a ranking metric; explicit ``direction`` wins over the name."""
    if direction is not None:
        if direction not in ("min", "max"):
            raise SpecError("search.direction", direction, "must be 'min' or 'max'",
                            "use 'min' for losses and errors, 'max' for accuracy-like metrics")
        return direction
    name = metric.lower()
    if any(word in name for word in _LOWER_IS_BETTER):
        return "min"
    if any(word in name for word in _HIGHER_IS_BETTER):
        return "max"
    raise SpecError("search.metric", metric, "its direction cannot be told from its name",
                    "set search.direction to 'min' or 'max'")


def _options(name: str, value: Any) -> dict[str, Any]:
    """A mapping of keyword options (storage_options), or a SpecError."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise SpecError(name, value, "must be a mapping of option names to values",
                        "pass e.g. {'anon': False} or leave it out")
    return dict(value)


def _optional_name(name: str, value: Any) -> None:
    """An optional identifier such as an Airflow connection id."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise SpecError(name, value, "must be a name (a string) or left out",
                        "name an Airflow connection, e.g. 'aws_default'")


def _positive_int(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(name, value, f"must be an integer >= {minimum}",
                        f"set {name} to a whole number of at least {minimum}")


@dataclass(frozen=True)
class DataSpec:
    """Where the training data is and what its columns mean.

    Credentials never go into the spec, which is written to the store with the results: an ``s3://``
    source names an Airflow connection in ``conn_id`` instead.

    Attributes:
        source: Required. A Parquet (``.parquet``, ``.pq``) or CSV file, a folder of them (read
            recursively; ``key=value`` folders are hive partitions), a glob or an ``s3://`` prefix; or a
            folder, glob or prefix of image files (:mod:`mop_airflow.data.images`), one folder per class
            or beside a ``labels`` file. Must be a non-empty string: an absolute path, a path under
            ``~/`` or a URI (a relative path is refused: each task would resolve it against its own
            working folder); a path ending in a file of another format is refused.
        label: Required. The label column: a class or, with ``task="regression"``, a numeric target.
            Must be a non-empty column name.
        features: Required. A list of numeric columns (``["x0", "x1"]``), one glob (``"x*"``), or a dict
            of named model inputs: ``{"image": {"shape": [32, 32, 3]}}`` (a list column reshaped per
            row), ``{"photo": {"shape": [32, 32, 3], "decode": "image"}}`` (PNG/JPEG bytes decoded on
            the worker; ``resize``, ``interpolation`` and ``color_mode`` as in Keras) or
            ``{"tabular": {"columns": "x*"}}`` (scalar columns stacked). An input may add ``column``
            and ``dtype`` (float32, float16, uint8 or int32). Never the label column.
        classes: The label values, at least two, none repeated; left empty, validation finds them
            (sorted). A regression target has none.
        validation: A fraction of ``source`` held out (seeded), strictly between 0 and 1, or a
            separate source of any of the forms ``source`` takes.
        storage_options: Options passed to fsspec as they are (a mapping of option names to values).
        conn_id: An Airflow AWS connection for an ``s3://`` source (key, secret, ``endpoint_url``),
            or left out.
        task: ``"classification"`` (integer or string labels) or ``"regression"`` (a numeric target).
        shuffle: ``"rows"``: every shard is a seeded, uniform random sample of rows. ``"files"``:
            whole files are dealt to the shards, for data already shuffled across files.
        batch_mb: The record batch, in MB, a validating or sharding task holds at once: from 1 to 16384.
        slice_mb: About how much of the source, in MB, one sharding task reads (whole files: more
            files, more tasks in parallel). A positive number.
        labels: Image folders only: the labels file beside the images, ``"labels.csv"`` (or a
            Parquet file) whose ``file`` column holds each image's path relative to the source, or
            ``{"path": ..., "file_column": ...}`` to name another column.
    """

    source: str
    label: str
    features: tuple[str, ...] | str | Mapping[str, Any]
    classes: tuple[Any, ...] = ()
    validation: float | str = 0.2
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    conn_id: str | None = None
    task: str = "classification"
    shuffle: str = "rows"
    batch_mb: float = 128.0
    slice_mb: float = 1024.0
    # Image folders only: "labels.csv" (file column "file"), or {"path": ..., "file_column": ...}.
    labels: str | Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise SpecError("data.source", self.source, "must be a non-empty path or URI",
                            "point data.source at a Parquet or CSV file, a folder or glob of them, or an "
                            "s3:// prefix, e.g. 's3://bucket/train/'")
        _check_source_form("data.source", self.source)
        if not isinstance(self.label, str) or not self.label:
            raise SpecError("data.label", self.label, "must be a column name",
                            "set data.label to the name of the label column")
        object.__setattr__(self, "features", _check_features(self.features, self.label))
        if self.task not in ("classification", "regression"):
            raise SpecError("data.task", self.task, "must be 'classification' or 'regression'",
                            "use 'regression' for a numeric target, 'classification' for labels")
        classes = tuple(self.classes or ())
        if self.task == "regression" and classes:
            raise SpecError("data.classes", self.classes, "a regression target has no classes",
                            "remove data.classes, or set data.task to 'classification'")
        if classes and len(classes) < 2:
            raise SpecError("data.classes", self.classes, "must declare at least two classes",
                            "list every label value, e.g. list(range(10)), or leave it out to find them in the data")
        if len(set(classes)) != len(classes):
            raise SpecError("data.classes", self.classes, "must not repeat a class",
                            "list each label value once")
        object.__setattr__(self, "classes", classes)
        if isinstance(self.validation, str):
            if not self.validation.strip():
                raise SpecError("data.validation", self.validation, "must be a fraction or a path/URI",
                                "use e.g. 0.2 or '/data/valid.parquet'")
            _check_source_form("data.validation", self.validation)
        elif isinstance(self.validation, bool) or not isinstance(self.validation, (int, float)) \
                or not 0.0 < float(self.validation) < 1.0:
            raise SpecError("data.validation", self.validation, "a fraction must be between 0 and 1 (exclusive)",
                            "use e.g. 0.2 to hold out 20% of the rows, or the path of a separate validation file")
        if self.shuffle not in ("rows", "files"):
            raise SpecError("data.shuffle", self.shuffle, "must be 'rows' or 'files'",
                            "use 'rows' (a seeded random sample of rows per shard) or 'files' (whole files "
                            "dealt to shards, for data that is already shuffled)")
        if isinstance(self.batch_mb, bool) or not isinstance(self.batch_mb, (int, float)) \
                or not 1 <= self.batch_mb <= 16384:
            raise SpecError("data.batch_mb", self.batch_mb, "must be a number of MB between 1 and 16384",
                            "use e.g. 128; a task holds a few batches of this size at once")
        if isinstance(self.slice_mb, bool) or not isinstance(self.slice_mb, (int, float)) or self.slice_mb <= 0:
            raise SpecError("data.slice_mb", self.slice_mb, "must be a positive number of MB",
                            "use e.g. 1024: each sharding task reads about this much of the source")
        object.__setattr__(self, "storage_options", _options("data.storage_options", self.storage_options))
        _optional_name("data.conn_id", self.conn_id)
        if self.labels is not None:
            object.__setattr__(self, "labels", _check_labels(self.labels))


_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")
_KNOWN_SUFFIXES = (".parquet", ".pq", ".csv", *_IMAGE_SUFFIXES)
_FEATURE_KEYS = {"column", "columns", "shape", "decode", "dtype", "resize", "interpolation", "color_mode"}
# Keras's names (image_dataset_from_directory); Pillow has no lanczos5, gaussian or mitchellcubic filter.
INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "area", "lanczos3")
COLOR_MODES = {"grayscale": 1, "rgb": 3, "rgba": 4}


def _check_labels(labels: Any) -> dict[str, str]:
    """``data.labels`` as ``{"path": ..., "file_column": ...}``, from a path or such a dict."""
    fix = ("set data.labels to the labels file beside the images, e.g. 'labels.csv', or "
           "{'path': 'labels.csv', 'file_column': 'filename'}")
    if isinstance(labels, str):
        labels = {"path": labels}
    if not isinstance(labels, Mapping) or set(labels) - {"path", "file_column"}:
        raise SpecError("data.labels", labels, "must be a path or a dict with 'path' and 'file_column'", fix)
    path, column = labels.get("path"), labels.get("file_column", "file")
    if not isinstance(path, str) or not path.lower().split("?")[0].endswith((".csv", ".parquet", ".pq")):
        raise SpecError("data.labels", labels.get("path"), "must name a .csv, .parquet or .pq file", fix)
    if not isinstance(column, str) or not column:
        raise SpecError("data.labels.file_column", column, "must be a column name",
                        "name the labels file's column of image paths, e.g. 'file'")
    return {"path": path, "file_column": column}



def _refuse_relative(name: str, path: str, example: str) -> None:
    """A local path must be absolute (or under ``~/``): every process that reads the spec, a task or the DAG
    processor, would resolve a relative one against its own working folder, which Airflow does not fix."""
    if "://" not in path and not os.path.isabs(os.path.expanduser(path)):
        raise SpecError(name, path, "is a relative path, which every task would resolve against its own working "
                        "folder (Airflow sets none that a spec can rely on)",
                        f"give the absolute path (from the folder you are in: {os.path.abspath(path)!r}), a path "
                        f"under ~/, or a URI such as {example!r}")


def _check_source_form(name: str, uri: str) -> None:
    """Reject a relative path, and a path whose last part is a file of another format; folders, globs and
    prefixes pass."""
    if "{{" not in uri:  # a template is checked once rendered
        # `mop-airflow check` run from the data's folder would find it; the tasks would not
        _refuse_relative(name, uri, "s3://bucket/train/")
    last = uri.lower().split("?")[0].rstrip("/").rsplit("/", 1)[-1]
    if "." in last and not any(ch in last for ch in "*?[") and not last.endswith(_KNOWN_SUFFIXES) \
            and last.rsplit(".", 1)[-1].isalpha() and not uri.endswith("/"):
        raise SpecError(name, uri, "must be a .parquet, .pq or .csv file, an image file (.jpg, .jpeg, .png, .bmp, "
                        ".gif, .webp), a folder or glob of them, or a prefix",
                        "convert the data to Parquet or CSV, or rename the file with its format's extension")


def _check_image_options(field_name: str, column_spec: dict) -> None:
    """``resize``, ``interpolation`` and ``color_mode``, with Keras's names and meanings, on images only."""
    options = [key for key in ("resize", "interpolation", "color_mode") if key in column_spec]
    if not options:
        return
    shape = column_spec["shape"]
    if column_spec.get("decode") != "image":
        raise SpecError(f"{field_name}.{options[0]}", column_spec[options[0]], "applies to images only",
                        "add decode='image' for encoded image bytes, or remove the option")
    resize = column_spec.get("resize")
    if resize is not None:
        if (not isinstance(resize, (list, tuple)) or len(resize) != 2
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in resize)):
            raise SpecError(f"{field_name}.resize", resize, "must be [height, width] in pixels",
                            f"use the shape's height and width, e.g. {shape[:2]}")
        if list(resize) != list(shape[:2]):
            raise SpecError(f"{field_name}.resize", resize, f"must match the height and width of shape {shape}",
                            f"set resize to {shape[:2]}, the size the model takes")
        column_spec["resize"] = list(resize)
    if "interpolation" in column_spec:
        if resize is None:
            raise SpecError(f"{field_name}.interpolation", column_spec["interpolation"], "only applies with resize",
                            f"add resize: {shape[:2]} or remove interpolation")
        if column_spec["interpolation"] not in INTERPOLATIONS:
            raise SpecError(f"{field_name}.interpolation", column_spec["interpolation"],
                            f"must be one of {', '.join(INTERPOLATIONS)}", "use 'bilinear' (Keras's default)")
    mode = column_spec.get("color_mode")
    if mode is not None:
        if mode not in COLOR_MODES:
            raise SpecError(f"{field_name}.color_mode", mode, f"must be one of {', '.join(COLOR_MODES)}",
                            "use 'rgb' for 3 channels, 'grayscale' for 1 or 'rgba' for 4")
        if COLOR_MODES[mode] != shape[-1]:
            raise SpecError(f"{field_name}.color_mode", mode, f"gives {COLOR_MODES[mode]} channel(s), but shape "
                            f"{shape} declares {shape[-1]}", f"make the shape's last entry {COLOR_MODES[mode]}, "
                            "or pick the color_mode of the declared channels")


def _check_features(features: Any, label: str) -> Any:
    """Features as a glob string, a tuple of column names, or a dict of named model inputs."""
    if isinstance(features, str):
        if not features:
            raise SpecError("data.features", features, "must not be empty",
                            "list the feature columns or give a glob such as 'x*'")
        return features
    if isinstance(features, Mapping):
        if not features:
            raise SpecError("data.features", dict(features), "must name at least one input",
                            "e.g. {'image': {'shape': [32, 32, 3]}}")
        out = {}
        for name, column_spec in features.items():
            field_name = f"data.features.{name}"
            column_spec = {} if column_spec is None else column_spec
            if not isinstance(name, str) or not name or not isinstance(column_spec, Mapping):
                raise SpecError(field_name, column_spec, "must map an input name to a dict",
                                "e.g. {'image': {'shape': [32, 32, 3]}} or {'tabular': {'columns': 'x*'}}")
            unknown_key(field_name, column_spec, _FEATURE_KEYS)
            column_spec = dict(column_spec)
            if "columns" in column_spec:
                if set(column_spec) - {"columns"}:
                    raise SpecError(field_name, column_spec, "an input of scalar columns takes only 'columns'",
                                    "give tensor and image columns their own input with 'shape'")
                column_spec["columns"] = _check_features(column_spec["columns"], label)
                if not isinstance(column_spec["columns"], str):
                    column_spec["columns"] = list(column_spec["columns"])
            else:
                shape = column_spec.get("shape")
                if not isinstance(shape, (list, tuple)) or not shape or not all(
                        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
                    raise SpecError(f"{field_name}.shape", shape, "must be a list of positive integers",
                                    "declare the tensor's shape per row, e.g. [32, 32, 3] or [8, 8, 1]")
                column_spec["shape"] = list(shape)
                if column_spec.get("decode", None) not in (None, "image"):
                    raise SpecError(f"{field_name}.decode", column_spec["decode"], "must be 'image'",
                                    "use decode='image' for PNG/JPEG bytes, or leave it out for a list column")
                if column_spec.get("decode") == "image" and len(shape) != 3:
                    raise SpecError(f"{field_name}.shape", shape, "an image's shape is [height, width, channels]",
                                    "e.g. [32, 32, 3] for RGB or [28, 28, 1] for grey images")
                _check_image_options(field_name, column_spec)
                if column_spec.get("dtype", "float32") not in ("float32", "float16", "uint8", "int32"):
                    raise SpecError(f"{field_name}.dtype", column_spec["dtype"],
                                    "must be float32, float16, uint8 or int32", "leave it out for float32")
                column = column_spec.get("column", name)
                if not isinstance(column, str) or not column:
                    raise SpecError(f"{field_name}.column", column, "must be a column name",
                                    "leave it out when the column is named like the input")
                if column == label:
                    raise SpecError(f"{field_name}.column", column, f"must not be the label column {label!r}",
                                    "use another column")
            out[name] = column_spec
        return out
    features = tuple(features)
    if not features or not all(isinstance(c, str) and c for c in features):
        raise SpecError("data.features", features, "must be a non-empty list of column names",
                        "list the numeric feature columns, e.g. ['x0', 'x1'] or the glob 'x*'")
    if label in features:
        raise SpecError("data.features", features, f"must not contain the label column {label!r}",
                        "remove the label from data.features")
    return features


# What replaced schedule.bundle_size: a block's hops on a shard slot are trained by one warm task.
RETIRED_BUNDLE_SIZE = ("no longer exists: a block is one train task per shard slot, which trains every hop on its "
                       "shard as soon as the configuration's previous hop is committed, so no configurations are "
                       "bundled into a task any more (docs: concepts/shard-slots.md)")


def check_fuse(value: Any) -> None:
    """``schedule.fuse``'s rule: an integer >= 1, ``"auto"``, ``"off"`` or ``false``."""
    if value is False or (isinstance(value, str) and value in ("off", "auto")):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError("schedule.fuse", value, 'must be an integer >= 1, "auto" or "off"',
                        'leave schedule.fuse out ("off": every configuration trains alone), set the most '
                        'configurations one compiled step may train together such as 8, or "auto"')


@dataclass(frozen=True)
class ScheduleSpec:
    """The MOP schedule: infrastructure parameters that decide the DAG's shape.

    ``schedule.shards``, ``schedule.iterations``, ``schedule.iterations_per_run``,
    ``schedule.slots_per_shard`` and ``search.adaptive`` shape the DAG and are fixed when the DAG file
    is parsed; every other field may change per run. One iteration = every configuration visits every shard once
    for ``epochs_per_hop`` passes.

    Attributes:
        shards: How many shards the data is split into: one Airflow pool and queue each. An integer
            from 1 to 256.
        iterations: How many times every configuration visits every shard. An integer >= 1.
        epochs_per_hop: Passes over the shard per visit (a hop). Total passes over the data =
            ``iterations`` x ``epochs_per_hop``. An integer >= 1.
        slots_per_shard: Models a shard trains at once: its GPUs. An integer >= 1.
        metrics_every: Evaluate on the validation set every this many iterations, and always after
            the last one. An integer >= 1.
        seed: Seeds the split into shards, the deal of configurations into offset classes (their
            visit order), each configuration's initial weights and its batch order. A random search
            draws with ``search.space.seed``. An integer >= 0.
        threads_per_hop: TensorFlow's intra-op thread count in a train task. Results on the CPU depend
            on it, so every hop record says which it used. An integer >= 1 pins it; the default, 1,
            gives the same numbers on every executor and machine (the embedded Airflow's, Celery's).
            ``"auto"`` divides the worker's cores among the train tasks that share it
            (``MOP_HOPS_PER_WORKER``, else ``slots_per_shard``): faster hops on a worker with
            spare cores, but a leaderboard that depends on the deployment.
        iterations_per_run: How many iterations one DAG run trains; a longer plain search goes on in
            the DAG's next runs (:mod:`mop_airflow.planning.run_chain`). ``"auto"`` keeps the whole
            search in one run (its train tasks are one per shard slot, however many hops); an
            integer >= 1 must divide ``iterations``. An adaptive search decided between blocks: how
            many blocks (each to the next decision point) one run holds; ``"auto"`` takes the whole
            search when its number of blocks is known (Hyperband, successive halving, PBT, TPE) and
            their tasks fit 2,000, else one.
        fuse: How many configurations of one shard slot may train as one compiled step on Keras's JAX
            backend (same model, hparams, optimizer and its settings but the learning rate and weight
            decay, loss, metrics, batch size and passes per hop; docs: concepts/fused-configurations.md):
            an integer >= 1, ``"auto"`` (8, measured on the CPU) or ``"off"`` (or ``false``: every
            configuration alone, the default). A fused configuration learns what it learns alone up to
            float rounding, which a high learning rate amplifies (measured on the demo's CNN: validation
            accuracy within 0.0015 at learning rates 1e-3 and 3e-3, but 0.015 and 0.0265 apart at 1e-2 and
            3e-2), so turning it on may change a leaderboard; every run records it.
            The plan deals each group whole into one offset class and slot; the slot trains it as one.
    """

    shards: int = 4
    iterations: int = 3
    epochs_per_hop: int = 1
    slots_per_shard: int = 1
    metrics_every: int = 1
    seed: int = 0
    threads_per_hop: int | str = 1  # "auto": faster on spare cores, results depend on the worker
    iterations_per_run: int | str = "auto"
    fuse: int | str | bool = "off"  # off: every configuration trains alone, the same numbers as before

    def __post_init__(self) -> None:
        check_fuse(self.fuse)
        for name in ("threads_per_hop", "iterations_per_run"):
            value = getattr(self, name)
            if name == "iterations_per_run" and isinstance(value, float):
                raise SpecError("schedule.iterations_per_run", value, "no longer takes a fraction of an iteration: "
                                "a run renders one train task per shard slot however many hops it trains, so a run "
                                "holds whole iterations (or, in an adaptive search, whole blocks)",
                                'leave schedule.iterations_per_run out ("auto": one run), or set a whole number')
            if value != "auto":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    fix = (f'leave schedule.{name} out (or "auto"), or set a whole number such as 2'
                           if name != "threads_per_hop" else
                           'leave schedule.threads_per_hop out (1 thread: the same results on every machine), '
                           'set a whole number such as 2, or "auto" (the worker\'s cores shared by its hops: '
                           'faster, but results then depend on the worker)')
                    raise SpecError(f"schedule.{name}", value, 'must be "auto" or an integer >= 1', fix)
        _positive_int("schedule.shards", self.shards)
        _positive_int("schedule.iterations", self.iterations)
        _positive_int("schedule.epochs_per_hop", self.epochs_per_hop)
        _positive_int("schedule.slots_per_shard", self.slots_per_shard)
        _positive_int("schedule.metrics_every", self.metrics_every)
        _positive_int("schedule.seed", self.seed, minimum=0)
        if self.shards > 256:
            raise SpecError("schedule.shards", self.shards, "must be at most 256 (one Airflow pool and queue each)",
                            "use fewer, larger shards")

    def evaluates_after(self, iteration: int) -> bool:
        """Validation runs every ``metrics_every`` iterations and always after the last one."""
        return (iteration + 1) % self.metrics_every == 0 or iteration == self.iterations - 1


@dataclass(frozen=True)
class StoreSpec:
    """Where shards, checkpoints and reports live: ``file://`` (default) or ``s3://``.

    Attributes:
        root: The store's root: an absolute local folder (or one under ``~/``), ``file://``,
            ``s3://bucket/prefix`` or ``memory://``; a relative folder is refused. Left out: ``file://``
            under ``$MOP_HOME/store`` (``~/mop_airflow/store`` when ``MOP_HOME`` is unset).
        conn_id: An Airflow AWS connection for an ``s3://`` store: its login and password become the
            key and secret, its ``endpoint_url`` extra the endpoint (MinIO and other S3-compatible
            stores). Left out: s3fs's own credential chain.
        storage_options: Options passed to s3fs as they are (a mapping of option names to values).
        cache_dir: The worker's shard cache, a local folder resolved on the machine that runs the
            task. Left out: ``$MOP_HOME/cache``.
        retry_seconds: How long a store call waits, retrying with backoff, for an endpoint that does
            not answer before the task fails (and is retried by Airflow). From 0 to 3600.
        keep_checkpoints: Checkpoints a run keeps per configuration: its last k plus the one of its
            best evaluated hop. An integer >= 2, so a retried hop always finds the state it starts
            from; ``None`` keeps every one.
        cache_max_gb: A bound on each worker's shard cache in GB; least recently used shards go first
            (a shard used in the last 10 minutes stays). A positive number, or ``None`` for no bound.
    """

    root: str | None = None
    conn_id: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    cache_dir: str | None = None
    retry_seconds: float = 60.0  # how long a store call waits for an unreachable endpoint
    keep_checkpoints: int | None = 2  # per configuration: the last k plus its best; None keeps every one
    cache_max_gb: float | None = 50.0  # a worker's shard cache; least recently used shards go first

    def __post_init__(self) -> None:
        if self.keep_checkpoints is not None:
            _positive_int("store.keep_checkpoints", self.keep_checkpoints, minimum=2)
        if self.cache_max_gb is not None and (isinstance(self.cache_max_gb, bool) or
                                              not isinstance(self.cache_max_gb, (int, float)) or
                                              not self.cache_max_gb > 0):
            raise SpecError("store.cache_max_gb", self.cache_max_gb, "must be a positive number of GB or null",
                            "use e.g. 50, or null for no bound")
        if isinstance(self.retry_seconds, bool) or not isinstance(self.retry_seconds, (int, float)) \
                or not 0 <= self.retry_seconds <= 3600:
            raise SpecError("store.retry_seconds", self.retry_seconds, "must be a number of seconds from 0 to 3600",
                            "use e.g. 60; Airflow's task retries cover longer outages")
        root = self.root or "file://" + os.path.join(default_home(), "store")
        if "://" not in root:
            _refuse_relative("store.root", root, "s3://bucket/mop")
            root = "file://" + os.path.abspath(os.path.expanduser(root))
        scheme = root.split("://", 1)[0]
        if scheme not in ("file", "s3", "memory"):
            raise SpecError("store.root", self.root, "scheme must be file://, s3:// or memory://",
                            "use a local folder or an s3://bucket/prefix")
        object.__setattr__(self, "root", root.rstrip("/"))
        object.__setattr__(self, "storage_options", _options("store.storage_options", self.storage_options))
        _optional_name("store.conn_id", self.conn_id)
        if self.cache_dir is not None and (not isinstance(self.cache_dir, str) or not self.cache_dir.strip()):
            raise SpecError("store.cache_dir", self.cache_dir, "must be a local folder path or left out",
                            "use e.g. '/var/cache/mop' or leave it out for the default")
        if self.cache_dir:
            object.__setattr__(self, "cache_dir", os.path.abspath(os.path.expanduser(self.cache_dir)))

    @property
    def cache_max_bytes(self) -> int | None:
        return None if self.cache_max_gb is None else int(self.cache_max_gb * 1e9)

    @property
    def local_cache(self) -> str:
        """The shard cache on the machine running the task: resolved there, not where the DAG was parsed."""
        return self.cache_dir or os.path.join(default_home(), "cache")


@dataclass(frozen=True)
class SearchSpec:
    """What to search and how to rank: grid or random search over ``space``, optionally adaptive.

    Attributes:
        space: Required. The search space (:class:`~mop_airflow.search.space.SearchSpace`):
            ``{"method": "grid" | "random", "params": {...}, "num_samples": n, "seed": s}``. Random
            search needs ``num_samples`` unless the search is adaptive, where the plan decides it.
        metric: The ranking metric: a validation metric (its name starts with ``val_``), either
            ``val_loss`` or ``val_`` + one of the space's compiled ``metrics``.
        direction: ``"min"`` or ``"max"``; left out, it follows the metric's name (loss, error, mse,
            mae... are smaller-is-better; accuracy, auc, precision, recall, f1 larger-is-better).
        adaptive: Hyperband, successive halving, ASHA or population-based training:
            ``{"method": "hyperband", "R": 9, "eta": 3}`` (also ``rounding``: ``"paper"`` or
            ``"madlib"``, and ``skip_last``),
            ``{"method": "successive_halving", "n": 27, "r": 1, "eta": 3}`` (also ``rungs``: how many
            rungs the bracket has, by default ``floor(log_eta(n)) + 1``, the most that still leave a
            configuration in the last one),
            ``{"method": "asha", "n": 64, "r": 1, "R": 27, "eta": 3}`` (also ``budget``, in iterations) or
            ``{"method": "pbt", "population": 8, "iterations": 12, "interval": 2, "mutations": {...}}``.
            Hyperband, successive halving and PBT are decided between blocks of hops, one block to each
            rung end or boundary, in one DAG run while their tasks fit 2,000; ASHA is decided inside the
            shard slots, one block in one DAG run (a model-based ASHA, ``space.sampler="tpe"``, between
            blocks); see :mod:`mop_airflow.search.adaptive`. Needs ``space.method="random"`` without
            ``num_samples``. Fixed when the DAG file is parsed.
        fail_fast: ``False``: a configuration whose builder raises, whose loss diverges or that runs
            out of memory is marked failed with its reason and the others go on. ``True``: the run
            fails at the first such configuration.
        max_configurations: A space that expands to more configurations is refused when the DAG file
            is parsed. An integer >= 1.
        warm_start: Start configurations from an earlier run's weights: ``{"from": "latest" |
            "champion" | RUN_ID, "select": "winner" | "top_k" | "matching", "k": 3, "dag_id": ...}``
            (see :func:`warm_start_spec`), or ``None`` to start fresh.
    """

    space: SearchSpace
    metric: str = "val_accuracy"
    direction: str | None = None
    adaptive: Mapping[str, Any] | None = None
    fail_fast: bool = False
    max_configurations: int = 1000
    warm_start: Mapping[str, Any] | None = None  # see warm_start_spec()

    def __post_init__(self) -> None:
        object.__setattr__(self, "warm_start", warm_start_spec(self.warm_start))
        if not isinstance(self.fail_fast, bool):
            raise SpecError("search.fail_fast", self.fail_fast, "must be true or false",
                            "use true to fail the run at the first failing configuration, false to go on")
        _positive_int("search.max_configurations", self.max_configurations)
        if not isinstance(self.space, SearchSpace):
            object.__setattr__(self, "space", SearchSpace.from_dict(self.space))
        if self.adaptive is not None:
            if self.space.method != "random":
                raise SpecError("search.space.method", self.space.method,
                                "an adaptive search draws its configurations at random",
                                "use method='random' with distributions or lists of choices")
            if self.space.num_samples is not None:
                raise SpecError("search.space.num_samples", self.space.num_samples,
                                "the adaptive plan decides how many configurations to draw",
                                "remove num_samples; `mop-airflow plan` shows the count")
            object.__setattr__(self, "adaptive", dict(self.adaptive))
            if self.space.sampler == "tpe" and self.adaptive.get("method") != "asha":
                raise SpecError("search.space.sampler", "tpe", f"proposes the configurations a random search or ASHA "
                                f"starts, not those of {self.adaptive.get('method')!r}, which are drawn up front",
                                "use search.adaptive.method='asha', or leave sampler out")
        elif self.space.method == "random" and self.space.num_samples is None:
            raise SpecError("search.space.num_samples", None, "random search needs an integer number of samples >= 1",
                            "set num_samples, e.g. 16")
        if not isinstance(self.metric, str) or not self.metric:
            raise SpecError("search.metric", self.metric, "must be a metric name",
                            "use 'val_accuracy' or 'val_loss'")
        if not self.metric.startswith("val_"):
            raise SpecError("search.metric", self.metric, "ranking uses validation metrics (names start with 'val_')",
                            f"use 'val_{self.metric}'")
        base = self.metric[len("val_"):]
        if base != "loss" and base not in self.space.metric_names():
            raise SpecError("search.metric", self.metric,
                            f"is neither 'val_loss' nor a compiled metric {list(self.space.metric_names())}",
                            "add the metric to the search space's 'metrics' or rank on 'val_loss'")
        object.__setattr__(self, "direction", metric_direction(self.metric, self.direction))


WARM_START_SELECT = ("winner", "top_k", "matching")


def warm_start_spec(value: Any) -> dict[str, Any] | None:
    """``search.warm_start``: start configurations from an earlier run's weights instead of random ones.

    ``{"from": "latest" | "champion" | RUN_ID, "select": "winner" | "top_k" | "matching", "k": 3, "dag_id": ...}``:
    ``from`` the DAG's latest run that wrote a report, the run of its published champion, or a named run
    (``dag_id`` another DAG's, in the same store); ``select`` which of its configurations lend their weights: the winner, the top ``k``
    (each new configuration starts from the best-ranked one with the same model and hparams), or every
    configuration that exists in both runs (same content). Optimizer state comes along only where the
    optimizer settings are the same; otherwise the new configuration's optimizer starts afresh.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError("search.warm_start", value, "must be a mapping or null",
                        'use e.g. {"from": "latest", "select": "winner"}')
    unknown = sorted(set(value) - {"from", "select", "k", "dag_id"})
    if unknown:
        raise SpecError(f"search.warm_start.{unknown[0]}", value[unknown[0]], "is not a warm-start field",
                        "use from, select, k and dag_id")
    out = {"from": value.get("from", "latest"), "select": value.get("select", "winner"), "k": value.get("k", 3),
           "dag_id": value.get("dag_id")}
    if not isinstance(out["from"], str) or not out["from"]:
        raise SpecError("search.warm_start.from", out["from"], "must be 'latest', 'champion' or a run id",
                        "use 'latest' (the DAG's newest run with a report), 'champion' (its published champion) or "
                        "a run id from the Airflow UI")
    if out["select"] not in WARM_START_SELECT:
        raise SpecError("search.warm_start.select", out["select"], f"must be one of {list(WARM_START_SELECT)}",
                        "use 'winner', 'top_k' (with k) or 'matching'")
    _positive_int("search.warm_start.k", out["k"])
    if out["dag_id"] is not None and (not isinstance(out["dag_id"], str) or not out["dag_id"]):
        raise SpecError("search.warm_start.dag_id", out["dag_id"], "must be a DAG id or null",
                        "leave it out to start from this DAG's own runs")
    return out


@dataclass(frozen=True)
class PublishSpec:
    """Champion and challenger: after the report, the run's winner and the DAG's current champion are
    both evaluated on this run's validation data, and the winner is published (registry entry and
    the ``mop://<dag_id>/champion`` Asset event) only if it beats the champion.

    Attributes:
        enabled: ``True`` publishes a winner that beats the champion; ``False`` never publishes.
        margin: How much the winner must beat the champion by, in the ranking metric's units and
            direction (a tie keeps the champion). A number >= 0.
    """

    enabled: bool = True
    margin: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise SpecError("publish.enabled", self.enabled, "must be true or false",
                            "use true to publish a winner that beats the champion, false to never publish")
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not self.margin >= 0:
            raise SpecError("publish.margin", self.margin, "must be a number >= 0 in the ranking metric's units",
                            "use e.g. 0.005 (half a point of accuracy), or 0 to publish any strictly better winner")
        object.__setattr__(self, "margin", float(self.margin))


@dataclass(frozen=True)
class MopSpec:
    """The whole job: data, search space, schedule, store and publishing.

    Built from a dict with :meth:`from_dict` (the DAG file's spec) or from the sections themselves;
    every section is validated when the DAG file is parsed. A space larger than
    ``search.max_configurations`` and a classification loss on a regression target are refused here.

    Attributes:
        data: Required. Where the training data is and what its columns mean (:class:`DataSpec`).
        search: Required. What to search and how to rank (:class:`SearchSpec`).
        schedule: Shards, iterations, passes per hop, slots and fusing (:class:`ScheduleSpec`).
        store: Where shards, checkpoints and reports live (:class:`StoreSpec`).
        publish: Champion and challenger (:class:`PublishSpec`).
    """

    data: DataSpec
    search: SearchSpec
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    store: StoreSpec = field(default_factory=StoreSpec)
    publish: PublishSpec = field(default_factory=PublishSpec)

    def __post_init__(self) -> None:
        for name, cls in (("data", DataSpec), ("search", SearchSpec),
                          ("schedule", ScheduleSpec), ("store", StoreSpec), ("publish", PublishSpec)):
            value = getattr(self, name)
            if isinstance(value, Mapping):
                if name == "schedule" and "bundle_size" in value:
                    raise SpecError("schedule.bundle_size", value["bundle_size"], RETIRED_BUNDLE_SIZE,
                                    "remove schedule.bundle_size")
                object.__setattr__(self, name, _build(cls, value, name))
            elif not isinstance(value, cls):
                raise SpecError(name, value, f"must be a {cls.__name__} or a dict",
                                f"pass {cls.__name__}(...) or a dict of its fields")
        plan = self.adaptive_plan()  # validate brackets against the shard count now, at parse time
        if getattr(plan, "budget", None) is not None:  # an ASHA budget must last R blocks on these slots
            from mop_airflow.search.asha import check_budget  # noqa: PLC0415

            check_budget(plan, self.schedule.shards, self.schedule.slots_per_shard)
        self._check_loss_fits_task()
        size = self.search.space.size(plan.total_configurations if plan is not None else None)
        if size > self.search.max_configurations:
            raise SpecError("search.max_configurations", self.search.max_configurations,
                            f"the search space expands to {size} configurations, more than this maximum",
                            "list fewer values per dimension (or fewer samples), or raise search.max_configurations")

    def _check_loss_fits_task(self) -> None:
        """A class loss on a regression target (or the reverse) would fail at the first training step."""
        losses = self.search.space.choices("loss")
        if self.data.task == "regression":
            wrong = [loss for loss in losses if "crossentropy" in str(loss) or "hinge" in str(loss)]
            if wrong:
                raise SpecError("search.space.params.loss", wrong[0], "is a classification loss but data.task is "
                                "'regression'", "use 'mse', 'mae' or 'huber' (and metrics such as ['mae'])")

    def adaptive_plan(self) -> Any:
        """The Hyperband, successive-halving, ASHA or PBT plan, or None for a plain MOP search."""
        from mop_airflow.search.adaptive import adaptive_plan, effective_adaptive  # noqa: PLC0415

        adaptive = effective_adaptive(self.search.adaptive, self.search.space.to_dict(), self.schedule.iterations)
        if adaptive is None:
            return None
        return adaptive_plan(adaptive, self.schedule.shards, self.search.space.params)

    def configurations(self) -> list[dict[str, Any]]:
        """The run's configurations: the whole grid / random draw, or as many as the adaptive plan needs."""
        plan = self.adaptive_plan()
        count = plan.total_configurations if plan is not None else None
        if self.search.space.sampler == "tpe":  # the rest are proposed from the results as the search goes
            count = min(count or self.search.space.startup, self.search.space.startup)
        return self.search.space.expand(self.schedule.epochs_per_hop, count=count)

    def to_dict(self) -> dict[str, Any]:
        out = {name: asdict(getattr(self, name)) for name in ("data", "schedule", "store", "publish")}
        out["search"] = {"space": self.search.space.to_dict(), "metric": self.search.metric,
                         "direction": self.search.direction, "adaptive": self.search.adaptive,
                         "fail_fast": self.search.fail_fast, "max_configurations": self.search.max_configurations,
                         "warm_start": self.search.warm_start}
        features = self.data.features
        out["data"]["features"] = (features if isinstance(features, str) else
                                   {k: dict(v) for k, v in features.items()} if isinstance(features, Mapping)
                                   else list(features))
        out["data"]["classes"] = list(self.data.classes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "MopSpec":
        if not isinstance(data, Mapping):
            raise SpecError("spec", data, "must be a mapping", "pass a dict with data, search, schedule, store")
        unknown = set(data) - {"data", "search", "schedule", "store", "publish"}
        if unknown:
            raise SpecError("spec", sorted(unknown), "unknown section(s)",
                            "use only the sections data, search, schedule, store and publish")
        for required in ("data", "search"):
            if required not in data:
                raise SpecError(required, None, "is required", f"add a '{required}' section")
        return cls(**{k: data[k] for k in data})

    def with_overrides(self, conf: Mapping[str, Any] | None) -> "MopSpec":
        """A copy with per-run overrides from a trigger conf (sections merge field by field).

        ``schedule.shards``, ``iterations``, ``iterations_per_run`` and ``search.adaptive`` are refused here;
        :func:`mop_airflow.config.trigger.apply_conf` refuses ``schedule.slots_per_shard`` too.
        """
        if not conf:
            return self
        if not isinstance(conf, Mapping):
            raise SpecError("conf", conf, "must be a mapping of spec sections",
                            "trigger with e.g. {\"search\": {\"metric\": \"val_loss\"}}")
        merged = self.to_dict()
        for section, values in section_overrides(conf, "conf").items():
            merged[section].update(values)
        for fixed in ("shards", "iterations", "iterations_per_run"):
            if merged["schedule"][fixed] != getattr(self.schedule, fixed):
                raise SpecError(f"conf.schedule.{fixed}", merged["schedule"][fixed],
                                "shapes the DAG and is fixed when the DAG file is parsed",
                                f"change schedule.{fixed} in the DAG file instead of the trigger conf")
        if merged["search"].get("adaptive") != self.search.adaptive:
            raise SpecError("conf.search.adaptive", merged["search"].get("adaptive"),
                            "its brackets and rungs shape the DAG and are fixed when the DAG file is parsed",
                            "change search.adaptive in the DAG file instead of the trigger conf")
        return MopSpec.from_dict(merged)


def section_overrides(values: Mapping[str, Any], where: str) -> dict[str, dict]:
    """``values`` checked to be spec sections, each a mapping of fields (``where`` names them in errors)."""
    out = {}
    for section, given in values.items():
        if section not in SPEC_SECTIONS:
            raise SpecError(f"{where}.{section}", given, "is not a spec section",
                            "override only data, search, schedule, store or publish")
        if not isinstance(given, Mapping):
            raise SpecError(f"{where}.{section}", given, "must be a mapping of fields",
                            f"pass e.g. {{'{section}': {{...}}}}")
        out[section] = dict(given)
    return out


def _build(cls: type, values: Mapping[str, Any], section: str) -> Any:
    unknown_key(section, values, [f.name for f in fields(cls)], what="a known field")
    try:
        return cls(**values)
    except TypeError as exc:  # a required field is missing
        raise SpecError(section, dict(values), str(exc), f"give every required field of {cls.__name__}") from exc
