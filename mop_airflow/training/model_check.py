"""Build every distinct model once on the data's shapes before anything trains.

A builder that cannot be imported, does not return a Keras model, or returns one whose inputs or
outputs do not fit the data would otherwise fail at each configuration's first hop, after the
data was staged and hops were queued. Here each distinct (builder, hparams, compile settings) is
built once, one zero batch is passed through it, and its output width is compared with what the
loss needs. Each is then saved as a ``.keras`` file and loaded back as serving loads it
(``safe_mode=True``, no custom code): the report does that with the best model once every
configuration has trained, and a custom layer Keras cannot find (one not registered with
``keras.saving.register_keras_serializable``) would otherwise fail the run after all its training.
Learning rate, batch size and passes per hop do not change the model, so configurations that differ
only in those are built once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from mop_airflow.errors import TrainingError

_NOT_MODEL_KEYS = ("config_id", "batch_size", "epochs_per_hop")


@dataclass(frozen=True)
class ModelCheck:
    """What the check found: per configuration that cannot train, why; how many models were built."""

    failures: dict[str, str]
    built: int

    def fatal(self, configs: Sequence[Mapping[str, Any]], *, fail_fast: bool) -> str | None:
        """The message to fail the run with, or None when the failing configurations are only marked.

        A builder that fails for every configuration using it is a mistake in the DAG, not in one
        configuration: the run fails at once, as it does with ``fail_fast`` and any failure.
        """
        if not self.failures:
            return None
        users: dict[str, list[str]] = {}
        for config in configs:
            users.setdefault(config["model"], []).append(config["config_id"])
        broken = [(model, ids) for model, ids in users.items() if all(cid in self.failures for cid in ids)]
        if broken:
            return "; ".join(f"model builder {model!r} fails for each of its {len(ids)} configuration(s): "
                             f"{self.failures[ids[0]]}" for model, ids in broken)
        if fail_fast:
            cid = sorted(self.failures)[0]
            return f"{cid}: {self.failures[cid]} (search.fail_fast is on)"
        return None


def check_models(configs: Sequence[Mapping[str, Any]], *, input_shapes: Mapping[str, tuple[int, ...]],
                 num_classes: int, task: str, seed: int = 0) -> ModelCheck:
    """Build each distinct model of ``configs`` for the data's shapes; return what does not fit."""
    import keras  # noqa: PLC0415

    from mop_airflow.training.builder import build_model  # noqa: PLC0415

    verdicts: dict[str, str | None] = {}
    failures: dict[str, str] = {}
    for config in configs:
        key = _model_key(config)
        if key not in verdicts:
            keras.backend.clear_session()  # one model at a time: a large grid must not pile up graphs
            try:
                model = build_model(config, input_shapes=input_shapes, num_classes=num_classes, seed=seed, task=task)
                verdicts[key] = (_misfit(model, config, input_shapes, num_classes, task)
                                 or _not_saveable(model, config))
            except TrainingError as exc:
                verdicts[key] = str(exc)
        if verdicts[key] is not None:
            failures[config["config_id"]] = verdicts[key]
    keras.backend.clear_session()
    return ModelCheck(failures=failures, built=len(verdicts))


def distinct_models(configs: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The configurations grouped by the model they build, in order of first appearance (learning rate,
    batch size and passes per hop do not change the model)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for config in configs:
        groups.setdefault(_model_key(config), []).append(config)
    return list(groups.values())


def _model_key(config: Mapping[str, Any]) -> str:
    params = {k: v for k, v in config.items() if k not in _NOT_MODEL_KEYS}
    params["optimizer_params"] = sorted(dict(config.get("optimizer_params") or {}))  # names, not values
    return json.dumps(params, sort_keys=True, default=str)


def check_mutations(configs: Sequence[Mapping[str, Any]], mutated: Mapping[str, Any], *,
                    input_shapes: Mapping[str, tuple[int, ...]], num_classes: int, task: str, seed: int = 0) -> int:
    """Refuse a population-based training mutation of a builder hparam that changes the model's
    weights (a copy goes on with its parent's weights, so they must fit): each ``hparams.<name>``
    mutation's extreme values (a list's values, a range's ends) are built on one configuration of each
    builder and their weights' shapes compared with its own. Returns the models built.
    ``mutated``: field -> list or :class:`~mop_airflow.search.distributions.Distribution`."""
    import keras  # noqa: PLC0415

    from mop_airflow.errors import SpecError  # noqa: PLC0415
    from mop_airflow.search.pbt import extremes, set_field  # noqa: PLC0415
    from mop_airflow.search.space import config_field  # noqa: PLC0415
    from mop_airflow.training.builder import build_model  # noqa: PLC0415

    def shapes(config: Mapping[str, Any]) -> list[tuple[int, ...]]:
        keras.backend.clear_session()
        model = build_model(config, input_shapes=input_shapes, num_classes=num_classes, seed=seed, task=task)
        return [tuple(v.shape) for v in model.variables]  # what a checkpoint holds (dropout seeds too)

    # the learning rate, batch size and optimizer settings never change the weights
    hparams = {key: extremes(spec) for key, spec in sorted(mutated.items()) if key.startswith("hparams.")}
    firsts = {c["model"]: c for c in reversed(list(configs))} if hparams else {}  # one configuration per builder
    owns = {model: shapes(config) for model, config in firsts.items()}
    built = len(owns)
    for key, values in hparams.items():
        for model, config in firsts.items():
            own = owns[model]
            for value in values:
                try:
                    other = shapes(set_field(config, key, value))
                except TrainingError:
                    other = None
                built += 1
                if other != own:
                    keras.backend.clear_session()
                    raise SpecError(f"search.adaptive.mutations.{key}", value,
                                    f"changes the weights of model {config['model']!r} (its weights' shapes differ "
                                    f"from those with {key.split('.', 1)[1]}={config_field(config, key)!r}), so a copy "
                                    "could not go on with its parent's weights",
                                    "mutate only hparams that keep every layer's shape (a dropout rate, say), and put "
                                    "shape-changing ones (units, layers) in search.space.params only")
    keras.backend.clear_session()
    return built


def _misfit(model: Any, config: Mapping[str, Any], input_shapes: Mapping[str, tuple[int, ...]], num_classes: int,
            task: str) -> str | None:
    """Why ``model`` cannot train on rows of ``input_shapes``, or None when it can."""
    import numpy as np  # noqa: PLC0415

    zeros = {name: np.zeros((2, *shape), dtype="float32") for name, shape in input_shapes.items()}
    where = f"model builder {config['model']!r} with hparams {dict(config.get('hparams') or {})}"
    try:
        out = model(zeros[next(iter(zeros))] if len(zeros) == 1 else zeros, training=False)
    except Exception as exc:  # Keras names the layer and both shapes
        return (f"{where}: the model does not take the data's inputs {_shapes(input_shapes)}: "
                f"{_one_line(exc)}. Fix: start the model with keras.Input(hparams['input_shape'])")
    if isinstance(out, (list, tuple, dict)):
        return None  # several outputs: the loss decides what fits, Keras checks it at the first step
    width = int(out.shape[-1]) if len(out.shape) > 1 else 1
    loss = str(config.get("loss") or "")
    wanted = (1 if task == "regression" or "binary" in loss else
              num_classes if "categorical" in loss else None)
    if wanted is not None and width != wanted:
        what = "a regression target" if task == "regression" else f"{num_classes} classes and loss {loss!r}"
        fix = ("end with keras.layers.Dense(1)" if wanted == 1 else
               "end with keras.layers.Dense(hparams['num_classes'], activation='softmax')")
        return f"{where}: the model outputs {width} value(s) per row but {what} need(s) {wanted}. Fix: {fix}"
    return None


def _not_saveable(model: Any, config: Mapping[str, Any]) -> str | None:
    """Why Keras cannot save ``model`` as a ``.keras`` file and load it back without custom code (what
    the report does with the best model, :mod:`mop_airflow.training.best_model`), or None when it can."""
    import os  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    import keras  # noqa: PLC0415

    where = f"model builder {config['model']!r} with hparams {dict(config.get('hparams') or {})}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "check.keras")
            model.save(path)
            keras.models.load_model(path, safe_mode=True)
        return None
    except Exception as exc:  # noqa: BLE001 - whatever Keras raises, the run must not train for nothing
        error = _one_line(exc)
    unknown = _unregistered_classes(model)
    what = (f"{where}: Keras cannot save this model and load it back, so the report could not write the best "
            "model (best_model.keras) after the whole search had trained")
    if unknown:
        names = ", ".join(unknown)
        return (f"{what}: {names} {'is' if len(unknown) == 1 else 'are'} not registered with Keras. Fix: decorate "
                f"{'it' if len(unknown) == 1 else 'each'} with @keras.saving.register_keras_serializable() in the "
                "builder's module and give it a get_config() that returns its constructor's arguments")
    return (f"{what}: {error}. Fix: register every custom layer, model, loss or function with "
            "@keras.saving.register_keras_serializable() and give each a get_config() that returns its "
            "constructor's arguments (a Lambda layer cannot be loaded safely: make it a layer class)")


def _unregistered_classes(model: Any) -> list[str]:
    """The classes of ``model``'s layers (and of the model) that are neither Keras's own nor registered
    with ``keras.saving.register_keras_serializable``, which Keras cannot find when it loads a file."""
    import keras  # noqa: PLC0415

    found = []
    for layer in model._flatten_layers(include_self=True):  # noqa: SLF001 - Keras's own walk of nested layers
        cls = type(layer)
        own = cls.__module__.split(".")[0] in ("keras", "tf_keras", "tensorflow")
        if not own and ">" not in keras.saving.get_registered_name(cls):
            name = f"{cls.__module__}.{cls.__qualname__}"
            if name not in found:
                found.append(name)
    return found


def _shapes(input_shapes: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name} {tuple(shape)}" for name, shape in input_shapes.items())


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}{'...' if len(text) > 400 else ''}"
