"""Turn a configuration dict into a compiled Keras model whose optimizer is ready to be restored.

The model builder contract: a configuration names a function ``build(hparams) -> keras.Model`` by
import path ("package.module:function"). It is called with the configuration's ``hparams`` plus two
keys injected from the data, ``input_dim`` (number of feature columns) and ``num_classes``; the
injected values win over same-named hparams because the data decides them. The builder returns an
uncompiled model; compiling (optimizer, loss, metrics) is done here from the configuration so that
every configuration is compiled the same way and its optimizer can be checkpointed.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import random
import sys
from typing import Any, Callable, Mapping

import keras
import numpy as np

from mop_airflow.errors import TrainingError

# The names mop_airflow.search.space.OPTIMIZERS accepts, to keras.optimizers class names.
_OPTIMIZER_CLASSES = {
    "adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "rmsprop": "RMSprop", "adagrad": "Adagrad",
    "adadelta": "Adadelta", "adamax": "Adamax", "nadam": "Nadam", "ftrl": "Ftrl", "lion": "Lion",
    "lamb": "Lamb", "adafactor": "Adafactor",
}

# Arguments every Keras optimizer takes through its base class; the search space never sets `name`.
_BASE_OPTIMIZER_PARAMS = frozenset(
    name for name in inspect.signature(keras.optimizers.Optimizer.__init__).parameters
    if name not in ("self", "name", "kwargs")
)


def load_builder(import_path: str) -> Callable[[dict[str, Any]], Any]:
    """Import ``"module:function"``; the part after the colon may be dotted (``"mod:Class.build"``)."""
    module_name, sep, attribute = str(import_path).partition(":")
    if not sep or not module_name or not attribute:
        raise TrainingError(f"model builder {import_path!r}: not an import path 'module:function'. "
                            "Fix: name the builder like 'my_package.models:cnn'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrainingError(f"model builder {import_path!r}: module {module_name!r} could not be imported "
                            f"({exc}). Fix: install the package that defines it on every worker, or put it "
                            "on PYTHONPATH (e.g. in the Airflow dags or plugins folder)") from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            close = difflib.get_close_matches(part, [n for n in dir(target) if not n.startswith("_")], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TrainingError(f"model builder {import_path!r}: attribute {part!r} is missing in "
                                f"{getattr(target, '__name__', module_name)!r}{hint}. Fix: check the spelling "
                                "after the colon, or that the worker runs the same version of the module")
        target = getattr(target, part)
    if not callable(target):
        raise TrainingError(f"model builder {import_path!r}: {type(target).__name__} object is not callable. "
                            "Fix: point at a function build(hparams) -> keras.Model")
    return target


def make_optimizer(config: Mapping[str, Any]) -> keras.optimizers.Optimizer:
    """A fresh optimizer from ``config["optimizer"]`` and ``config["optimizer_params"]``."""
    name = str(config.get("optimizer", "adam")).lower()
    if name not in _OPTIMIZER_CLASSES:
        raise TrainingError(f"optimizer {name!r} is not known. Fix: use one of {sorted(_OPTIMIZER_CLASSES)}")
    optimizer_class = getattr(keras.optimizers, _OPTIMIZER_CLASSES[name])
    params = dict(config.get("optimizer_params") or {})
    accepted = _BASE_OPTIMIZER_PARAMS | {
        p for p in inspect.signature(optimizer_class.__init__).parameters if p not in ("self", "name", "kwargs")
    }
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise TrainingError(f"optimizer {name!r} has no parameter {unknown[0]!r}. "
                            f"Fix: use only {sorted(accepted)} in optimizer_params")
    try:
        return optimizer_class(**params)
    except (TypeError, ValueError) as exc:
        raise TrainingError(f"optimizer {name!r} rejected optimizer_params {params}: {exc}. "
                            "Fix: correct the offending value") from exc


# Metric names compile() resolves from the loss (e.g. "acc" to sparse categorical accuracy).
_COMPILE_METRIC_ALIASES = frozenset({"acc", "accuracy", "crossentropy", "ce"})


def _check_loss_and_metrics(loss: Any, metrics: list[Any]) -> None:
    """Fail at build time: compile() accepts any string and the first training step would fail."""
    try:
        keras.losses.get(loss)
    except ValueError as exc:
        raise TrainingError(f"loss {loss!r} is not a Keras loss. Fix: use e.g. "
                            "'sparse_categorical_crossentropy' (integer labels)") from exc
    for metric in metrics:
        if metric in _COMPILE_METRIC_ALIASES:
            continue
        try:
            keras.metrics.get(metric)
        except ValueError as exc:
            raise TrainingError(f"metric {metric!r} is not a Keras metric. Fix: use e.g. 'accuracy'") from exc


def data_hparams(input_shapes: Mapping[str, tuple[int, ...]], num_classes: int, task: str) -> dict[str, Any]:
    """The keys a builder gets from the data (see the module docstring)."""
    shapes = {name: tuple(int(d) for d in shape) for name, shape in input_shapes.items()}
    out: dict[str, Any] = {"input_shapes": shapes, "task": task,
                           "num_outputs": int(num_classes) if task == "classification" else 1}
    if len(shapes) == 1:
        (shape,) = shapes.values()
        out.update(input_shape=shape, input_dim=math.prod(shape))
    if task == "classification":
        out["num_classes"] = int(num_classes)
    return out


def set_random_seed(seed: int) -> None:
    """``keras.utils.set_random_seed(seed)``, without importing TensorFlow where it is not the backend.

    Keras seeds TensorFlow whenever it is installed (for ``tf.data`` pipelines), importing it to do so:
    on the JAX backend that cost every slot process 2.4 s and several hundred MB on the 2-core machine,
    and nothing else of a hop imports it there (tested). Where TensorFlow is the backend or already
    imported, Keras's own function runs; elsewhere the same steps, TensorFlow's left out.
    """
    if keras.config.backend() == "tensorflow" or "tensorflow" in sys.modules:
        keras.utils.set_random_seed(seed)
        return
    try:
        from keras.src.backend.common import global_state  # noqa: PLC0415
        from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR  # noqa: PLC0415
        from keras.src.utils.rng_utils import GLOBAL_RANDOM_SEED  # noqa: PLC0415
    except ImportError:  # a Keras laid out otherwise: its own function, TensorFlow's import and all
        keras.utils.set_random_seed(seed)
        return
    global_state.set_global_attribute(GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, None)  # made again from the seed when drawn
    random.seed(seed)
    np.random.seed(seed)
    if keras.config.backend() == "torch":
        import torch  # noqa: PLC0415

        torch.manual_seed(seed)


def build_model(config: Mapping[str, Any], *, input_shapes: Mapping[str, tuple[int, ...]], num_classes: int,
                seed: int, task: str = "classification") -> keras.Model:
    """Build, compile and materialise the optimizer of one configuration, reproducibly from ``seed``.

    The optimizer variables are created up front so that a checkpoint can be restored into them
    before the first training step (Keras creates them lazily otherwise).
    """
    # Seeds Python, NumPy and the backend: initial weights and dropout seed states follow from `seed`.
    set_random_seed(seed)
    builder = load_builder(config["model"])
    hparams = {**dict(config.get("hparams") or {}), **data_hparams(input_shapes, num_classes, task)}
    try:
        model = builder(hparams)
    except Exception as exc:
        raise TrainingError(f"model builder {config['model']!r} failed with hparams {hparams}: "
                            f"{type(exc).__name__}: {exc}. Fix: the builder or the hparams") from exc
    if not isinstance(model, keras.Model):
        raise TrainingError(f"model builder {config['model']!r} returned {type(model).__name__}, not a "
                            "keras.Model. Fix: return the model, e.g. keras.Sequential([...])")
    if not model.built:
        # Subclassed models create their weights on first call (Model.build() does not call them);
        # an inference call on one zero row creates them without touching any state.
        shapes = hparams["input_shapes"]
        zeros = {name: keras.ops.zeros((1, *shape)) for name, shape in shapes.items()}
        try:
            model(zeros[next(iter(shapes))] if len(shapes) == 1 else zeros)
        except Exception as exc:
            raise TrainingError(f"model builder {config['model']!r} returned an unbuilt model that cannot be "
                                f"built for input shapes {shapes}: {exc}. Fix: start the model with "
                                "keras.Input(hparams['input_shape'])") from exc
    loss, metrics = config["loss"], list(config.get("metrics") or [])
    _check_loss_and_metrics(loss, metrics)
    # Keras's defaults (one step per call, no XLA) measured fastest for a fresh model per hop on
    # CPU: jit_compile adds 1.5-4 s of compilation per hop, steps_per_execution=32 doubles the
    # ~0.5 s of tracing and only pays back on hops of more than ~200 steps.
    model.compile(optimizer=make_optimizer(config), loss=loss, metrics=metrics)
    model.optimizer.build(model.trainable_variables)
    return model
