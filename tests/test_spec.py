"""Configuration is validated when the DAG is built: each error names field, value, rule and fix."""

import pytest

from mop_airflow.errors import SpecError
from mop_airflow.search.space import SearchSpace
from mop_airflow.config import MopSpec, metric_direction

MODEL = "mop_airflow.examples.mnist1d_models:mlp"


def spec_dict(**over):
    base = {
        "data": {"source": "/data/train.parquet", "label": "y", "features": "x*", "classes": [0, 1]},
        "search": {"space": {"method": "grid", "params": {"model": [MODEL], "learning_rate": [1e-3, 1e-2]}}},
        "schedule": {"shards": 2, "iterations": 2},
    }
    for path, value in over.items():
        section, key = path.split("__")
        base[section][key] = value
    return base


@pytest.mark.parametrize("params, field, words", [
    ({"model": [MODEL], "optimizer": "adamm"}, "search.space.params.optimizer", "not a known optimizer"),
    ({"model": [MODEL], "learning_rate": []}, "search.space.params.learning_rate", "at least one value"),
    ({"model": [MODEL], "learning_rate": [-1.0]}, "search.space.params.learning_rate", "must be a number > 0"),
    ({"model": [MODEL], "batch_size": [0]}, "search.space.params.batch_size", "integer >= 1"),
    ({"model": "no_colon_path"}, "search.space.params.model", "import path"),
    ({"model": [MODEL], "learnin_rate": [1e-3]}, "search.space.params.learnin_rate", "not a known key"),
    ({"learning_rate": [1e-3]}, "search.space.params.model", "is required"),
    ({"model": [MODEL], "learning_rate": {"distribution": "uniform", "low": 0.1, "high": 0.2}},
     "search.space.params.learning_rate", "cannot be crossed in a grid"),
])
def test_grid_space_errors_name_field_and_rule(params, field, words):
    with pytest.raises(SpecError) as info:
        SearchSpace(params=params)
    assert info.value.field == field
    assert words in str(info.value)
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize("dist, field, words", [
    ({"distribution": "uniform", "low": 0.5, "high": 0.5}, "learning_rate.low", "must be below high"),
    ({"distribution": "log_uniform", "low": 0.0, "high": 1.0}, "learning_rate.low", "log range needs low > 0"),
    ({"distribution": "log_uniform", "low": -2, "high": 1.0}, "learning_rate.low", "log range needs low > 0"),
    ({"distribution": "gaussian", "low": 0, "high": 1}, "learning_rate.distribution", "must be one of"),
    ({"distribution": "choice", "values": []}, "learning_rate.values", "non-empty"),
])
def test_random_space_distribution_errors(dist, field, words):
    with pytest.raises(SpecError) as info:
        SearchSpace(method="random", num_samples=4, params={"model": MODEL, "learning_rate": dist})
    assert info.value.field.endswith(field)
    assert words in str(info.value)


@pytest.mark.parametrize("over, field", [
    ({"schedule__shards": 0}, "schedule.shards"),
    ({"schedule__iterations": 0}, "schedule.iterations"),
    ({"schedule__epochs_per_hop": 1.5}, "schedule.epochs_per_hop"),
    ({"data__classes": [1]}, "data.classes"),
    ({"data__validation": 1.5}, "data.validation"),
    ({"data__source": "/data/train.xlsx"}, "data.source"),
    ({"data__features": ["x", "y"]}, "data.features"),
    ({"schedule__shard": 3}, "schedule.shard"),
    ({"search__fail_fast": "yes"}, "search.fail_fast"),
    ({"search__max_configurations": 0}, "search.max_configurations"),
])
def test_spec_errors(over, field):
    with pytest.raises(SpecError) as info:
        MopSpec.from_dict(spec_dict(**over))
    assert info.value.field == field


def test_random_search_needs_samples_and_is_seeded_per_hyperparameter():
    with pytest.raises(SpecError, match="num_samples"):
        MopSpec.from_dict({**spec_dict(), "search": {"space": {"method": "random", "params": {"model": MODEL}}}})
    same = {"distribution": "uniform", "low": 0.0, "high": 1.0}
    space = SearchSpace(method="random", num_samples=5, seed=3,
                        params={"model": MODEL, "hparams": {"a": same, "b": same}})
    configs = space.expand()
    assert configs == space.expand()  # seeded
    # two hyperparameters with the same range draw from their own streams
    assert [c["hparams"]["a"] for c in configs] != [c["hparams"]["b"] for c in configs]
    assert all(0.0 <= c["hparams"]["a"] <= 1.0 for c in configs)


def test_grid_expansion_and_stable_ids():
    space = SearchSpace(params={"model": [MODEL, MODEL.replace("mlp", "cnn")], "learning_rate": [1e-3, 3e-3],
                                "batch_size": [32, 128]})
    configs = space.expand(default_epochs_per_hop=2)
    assert len(configs) == 8
    assert len({c["config_id"] for c in configs}) == 8
    assert configs == space.expand(default_epochs_per_hop=2)
    assert {c["epochs_per_hop"] for c in configs} == {2}
    assert {(c["model"].split(":")[1], c["optimizer_params"]["learning_rate"], c["batch_size"]) for c in configs} == {
        (m, lr, b) for m in ("mlp", "cnn") for lr in (1e-3, 3e-3) for b in (32, 128)}


def test_metric_direction():
    assert metric_direction("val_loss") == "min"
    assert metric_direction("val_accuracy") == "max"
    assert metric_direction("val_custom", "max") == "max"
    with pytest.raises(SpecError):
        metric_direction("val_custom")
    with pytest.raises(SpecError, match="compiled metric"):
        MopSpec.from_dict({**spec_dict(), "search": {**spec_dict()["search"], "metric": "val_auc"}})


def test_overrides_change_search_but_not_the_dag_shape():
    spec = MopSpec.from_dict(spec_dict())
    changed = spec.with_overrides({"search": {"space": {"params": {"model": [MODEL], "batch_size": [16]}}}})
    assert [c["batch_size"] for c in changed.search.space.expand()] == [16]
    with pytest.raises(SpecError) as info:
        spec.with_overrides({"schedule": {"shards": 3}})
    assert info.value.field == "conf.schedule.shards"
    assert MopSpec.from_dict(spec.to_dict()) == spec  # round trip through XCom-able data


def test_a_space_larger_than_max_configurations_is_refused_before_expanding():
    params = {"model": [MODEL], "learning_rate": [1e-4, 1e-3, 1e-2], "batch_size": [16, 32, 64, 128],
              "hparams": {"units": list(range(1, 101))}}  # 3 x 4 x 100 = 1200 > 1000 (the default)
    with pytest.raises(SpecError, match=r"search.max_configurations=1000: the search space expands to 1200 "
                                        r"configurations, more than this maximum. Fix: list fewer values"):
        MopSpec.from_dict(spec_dict(search__space={"method": "grid", "params": params}))
    spec = MopSpec.from_dict(spec_dict(search__space={"method": "grid", "params": params},
                                       search__max_configurations=1200))
    assert len(spec.configurations()) == spec.search.space.size() == 1200
    with pytest.raises(SpecError, match="expands to 20 configurations"):
        MopSpec.from_dict(spec_dict(search__space={"method": "random", "num_samples": 20, "params": params},
                                    search__max_configurations=10))


def test_fail_fast_is_off_by_default_and_may_change_per_run():
    spec = MopSpec.from_dict(spec_dict())
    assert spec.search.fail_fast is False
    assert spec.with_overrides({"search": {"fail_fast": True}}).to_dict()["search"]["fail_fast"] is True


@pytest.mark.parametrize("space, field, nearest", [
    # a typo of num_samples used to fall back to the default in silence
    ({"method": "random", "num_sample": 3, "params": {"model": [MODEL]}}, "search.space.num_sample", "num_samples"),
    ({"method": "grid", "parms": {}, "params": {"model": [MODEL]}}, "search.space.parms", "params"),
    ({"params": {"model": [MODEL], "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 0.1,
                                                      "typo_key": 1}}, "method": "random", "num_samples": 2},
     "search.space.params.learning_rate.typo_key", None),
    ({"params": {"model": [MODEL], "hparams": {"units": {"distribution": "choice", "value": [8, 16]}}},
      "method": "random", "num_samples": 2}, "search.space.params.hparams.units.value", "values"),
    ({"params": {"model": [MODEL], "learning_rate": {"distribution": "uniform", "low": 0.1, "hihg": 0.2}},
      "method": "random", "num_samples": 2}, "search.space.params.learning_rate.hihg", "high"),
    ({"params": {"model": [MODEL], "learning_rates": [1e-3]}, "method": "grid"}, "search.space.params.learning_rates",
     "learning_rate"),
    ({"params": {"model": [MODEL], "epochs": 3}, "method": "grid"}, "search.space.params.epochs", "epochs_per_hop"),
])
def test_unknown_keys_in_the_space_and_its_distributions_are_refused_with_the_nearest_key(space, field, nearest):
    spec = spec_dict()
    spec["search"]["space"] = space
    with pytest.raises(SpecError) as raised:
        MopSpec.from_dict(spec)
    assert raised.value.field == field
    assert "use only" in raised.value.fix
    if nearest:
        assert f"did you mean {nearest!r}?" in raised.value.fix


def test_an_unknown_key_of_a_named_input_is_refused_with_the_nearest_key():
    spec = spec_dict()
    spec["data"]["features"] = {"image": {"shap": [8, 8, 1]}}
    with pytest.raises(SpecError) as raised:
        MopSpec.from_dict(spec)
    assert raised.value.field == "data.features.image.shap"
    assert raised.value.fix.startswith("did you mean 'shape'? use only [")


def test_a_relative_data_path_is_refused_at_parse_naming_the_absolute_one(tmp_path, monkeypatch):
    """A relative path would be resolved against each task's working folder: `mop-airflow check`, run from the
    data's folder, finds the file, and the run's tasks would not."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as raised:
        MopSpec.from_dict(spec_dict(data__source="animals.csv"))
    assert raised.value.field == "data.source" and raised.value.value == "animals.csv"
    assert "is a relative path" in raised.value.rule
    assert f"give the absolute path (from the folder you are in: '{tmp_path / 'animals.csv'}')" in raised.value.fix
    with pytest.raises(SpecError) as raised:
        MopSpec.from_dict(spec_dict(data__validation="valid/"))
    assert raised.value.field == "data.validation"
    spec = spec_dict()
    spec["store"] = {"root": "mop_store"}
    with pytest.raises(SpecError) as raised:
        MopSpec.from_dict(spec)
    assert raised.value.field == "store.root" and f"'{tmp_path / 'mop_store'}'" in raised.value.fix
    # what a task can rely on: an absolute path, one under ~/ (expanded where it runs), a URI, a template
    for source in ("/data/train.parquet", "~/data/train.parquet", "s3://bucket/train/",
                   "{{ ti.xcom_pull(task_ids='extract') }}"):
        assert MopSpec.from_dict(spec_dict(data__source=source)).data.source == source
