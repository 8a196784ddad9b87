"""The trigger form: typed fields derived from the DAG's spec, and how a run's conf becomes the run's spec.

The conf is what the Airflow form sends (every field), or what the REST API and
``airflow dags trigger --conf`` name (some fields, or spec sections as before).
"""

import copy
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mop_airflow.errors import MopError, SpecError
from mop_airflow.config import MopSpec
from mop_airflow.config.trigger import apply_conf
from mop_airflow.config.form import form_fields
from tests.conftest import REPO

MLP = "mop_airflow.examples.mnist1d_models:mlp"
CNN = "mop_airflow.examples.mnist1d_models:cnn"
DATA = {"source": "/data/train.parquet", "label": "y", "features": "x*", "classes": [0, 1]}


def grid():
    return {"data": dict(DATA), "search": {"space": {"method": "grid", "params": {
        "model": [MLP, CNN], "optimizer": "adam", "learning_rate": [3e-3, 1e-2], "batch_size": [32, 128],
        "hparams": {"units": [16]}}}}, "schedule": {"shards": 4, "iterations": 3, "seed": 42}}


def random_lists():
    spec = grid()
    spec["search"]["space"] = {"method": "random", "num_samples": 6, "seed": 3, "params": {
        "model": {"distribution": "choice", "values": [MLP, CNN]}, "learning_rate": [1e-3, 1e-2],
        "batch_size": {"distribution": "choice", "values": [32, 64]}}}
    return spec


def hyperband():
    """The example DAG's spec (dags/mop_mnist1d_hyperband.py) with its own data section."""
    spec = grid()
    spec["search"] = {"space": {"method": "random", "seed": 7, "params": {
        "model": {"distribution": "choice", "values": [MLP, CNN]}, "optimizer": "adam",
        "learning_rate": {"distribution": "log_uniform", "low": 1e-3, "high": 3e-2},
        "batch_size": {"distribution": "choice", "values": [32, 64, 128]}, "metrics": ["accuracy"]}},
        "metric": "val_accuracy", "adaptive": {"method": "hyperband", "R": 9, "eta": 3}}
    spec["schedule"] = {"shards": 4, "seed": 42}
    return spec


SHAPES = {"grid": grid, "random_lists": random_lists, "hyperband": hyperband}


def defaults(spec):
    return {name: copy.deepcopy(f.default) for name, f in form_fields(spec).items()}


def as_form_strings(conf):
    """What the Airflow form's multi-select sends for numbers it offers: strings."""
    return {k: [str(v) for v in value] if k in ("learning_rate", "batch_size") else value for k, value in conf.items()}


def test_a_grid_dags_form_has_typed_fields_in_sections():
    fields = form_fields(grid())
    assert list(fields) == ["method", "num_samples", "architectures", "optimizer", "learning_rate", "batch_size",
                            "epochs_per_hop", "metric", "overrides"]
    arch = fields["architectures"].schema
    assert arch["items"]["enum"] == arch["examples"] == [MLP, CNN]  # the DAG's own builders
    assert arch["values_display"] == {MLP: "mlp (mop_airflow.examples.mnist1d_models)",
                                      CNN: "cnn (mop_airflow.examples.mnist1d_models)"}
    assert fields["method"].schema["enum"] == ["grid", "random"] and fields["method"].default == "grid"
    assert "(8 with this form's defaults)" in fields["method"].schema["description_md"]  # 2 x 2 x 2 x 1
    assert fields["num_samples"].schema["type"] == ["integer", "null"] and fields["num_samples"].default is None
    lr = fields["learning_rate"].schema
    assert lr["items"]["exclusiveMinimum"] == 0 and {3e-3, 1e-2, 1e-4} <= set(lr["examples"])
    assert fields["optimizer"].schema["values_display"]["adamw"] == "AdamW"
    assert fields["metric"].schema["enum"] == ["val_loss", "val_accuracy"]
    assert fields["metric"].schema["values_display"] == {"val_loss": "val_loss (lower is better)",
                                                         "val_accuracy": "val_accuracy (higher is better)"}
    assert fields["epochs_per_hop"].schema["minimum"] == 1
    sections = {name: f.schema.get("section") for name, f in fields.items()}
    assert {s for n, s in sections.items() if n in ("epochs_per_hop", "metric")} == {"Training and ranking"}
    assert sections["overrides"].startswith("Advanced") and sections["learning_rate"] is None  # the open section
    for name, f in fields.items():  # every field explains itself and is required only when it has a value
        assert f.schema["title"] and f.schema["description_md"], name
        assert f.default is not None or "null" in f.schema["type"], name


def test_a_hyperband_dags_form_offers_a_learning_rate_range_and_shows_r_and_eta_as_set_in_the_dag_file():
    fields = form_fields(hyperband())
    assert list(fields) == ["architectures", "optimizer", "learning_rate_low", "learning_rate_high", "batch_size",
                            "epochs_per_hop", "metric", "R", "eta", "overrides"]  # no method: the plan draws
    assert (fields["learning_rate_low"].default, fields["learning_rate_high"].default) == (1e-3, 3e-2)
    assert "log-uniformly" in fields["learning_rate_low"].schema["description_md"]
    assert fields["batch_size"].default == [32, 64, 128]  # a choice is a list in the form
    r, eta = fields["R"].schema, fields["eta"].schema
    assert (r["enum"], eta["enum"]) == ([9], [3]) and r["section"] == eta["section"] == "Hyperband (set in the DAG file)"
    assert r["values_display"] == {"9": "9 (set in the DAG file)"}
    assert "3 bracket(s), 17 configurations, rungs of 1, 3, 9 iteration(s)" in r["description_md"]
    assert "1 to 9 iterations" in fields["epochs_per_hop"].schema["description_md"]


def test_an_asha_dags_form_shows_its_budget_as_set_in_the_dag_file_and_a_conf_cannot_change_it():
    spec = hyperband()
    spec["search"]["adaptive"] = {"method": "asha", "n": 64, "r": 1, "R": 9, "eta": 3, "budget": 72}
    fields = form_fields(spec)
    assert [k for k in fields if fields[k].schema.get("section") == "ASHA (set in the DAG file)"] == [
        "n", "r", "R", "eta", "budget"]
    assert fields["budget"].schema["enum"] == [72]
    del spec["search"]["adaptive"]["budget"]
    assert "budget" not in form_fields(spec)  # only a spec that sets one shows it
    spec["search"]["adaptive"]["budget"] = 72
    with pytest.raises(SpecError, match="conf.budget.*fixed when the DAG file is parsed"):
        apply_conf(MopSpec.from_dict(spec), {"budget": 100})


def test_a_field_that_could_not_take_effect_is_left_out():
    spec = grid()
    params = spec["search"]["space"]["params"]
    params.update(model=[MLP], epochs_per_hop=[1, 2])  # one builder; passes per hop searched in the space
    fields = form_fields(spec)
    assert "architectures" not in fields and "epochs_per_hop" not in fields
    params["learning_rate"] = [1e-3]  # a single value still shows: it can be changed
    assert form_fields(spec)["learning_rate"].default == [1e-3]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_an_untouched_form_runs_the_dag_files_spec_exactly(shape):
    import jsonschema

    spec = MopSpec.from_dict(SHAPES[shape]())
    for f in form_fields(spec).values():  # Airflow refuses a DAG whose defaults break their own schema
        jsonschema.validate(f.default, f.schema)
    for conf in (defaults(spec), as_form_strings(defaults(spec)), {}, None):
        run = apply_conf(spec, conf)
        assert run.to_dict() == spec.to_dict()
        assert run.configurations() == spec.configurations()


def changed_paths(before, after, prefix=""):
    if isinstance(before, dict) and isinstance(after, dict):
        return sorted(p for k in set(before) | set(after)
                      for p in changed_paths(before.get(k), after.get(k), f"{prefix}{k}."))
    return [] if before == after else [prefix[:-1]]


@pytest.mark.parametrize("shape, conf, paths", [
    ("grid", {"learning_rate": [0.01]}, ["search.space.params.learning_rate"]),
    ("grid", {"architectures": [CNN]}, ["search.space.params.model"]),
    ("grid", {"batch_size": ["64", 64, 256]}, ["search.space.params.batch_size"]),
    ("grid", {"optimizer": ["adam", "sgd"]}, ["search.space.params.optimizer"]),
    ("grid", {"epochs_per_hop": 2}, ["schedule.epochs_per_hop"]),
    ("grid", {"metric": "val_loss"}, ["search.direction", "search.metric"]),
    ("hyperband", {"learning_rate_low": 0.005}, ["search.space.params.learning_rate.low"]),
    ("hyperband", {"architectures": [CNN], "R": 9, "eta": 3}, ["search.space.params.model.values"]),
    ("random_lists", {"num_samples": 9}, ["search.space.num_samples"]),
])
def test_a_partial_conf_changes_exactly_what_it_names(shape, conf, paths):
    spec = MopSpec.from_dict(SHAPES[shape]())
    for full_form in (False, True):  # REST/CLI name some fields; the form sends every field
        run = apply_conf(spec, {**defaults(spec), **conf} if full_form else conf)
        assert changed_paths(spec.to_dict(), run.to_dict()) == paths


def test_what_the_changed_fields_train():
    spec = MopSpec.from_dict(grid())
    configs = apply_conf(spec, {"learning_rate": [0.01], "architectures": [CNN]}).configurations()
    assert [(c["model"], c["optimizer_params"]["learning_rate"], c["batch_size"]) for c in configs] == [
        (CNN, 0.01, 32), (CNN, 0.01, 128)]
    by_batch = [c["batch_size"] for c in apply_conf(spec, {"batch_size": ["64", 64, 256]}).configurations()]
    assert sorted(by_batch) == [64] * 4 + [256] * 4  # "64" and 64 are one value, picked twice in the form
    assert {c["epochs_per_hop"] for c in apply_conf(spec, {"epochs_per_hop": 2}).configurations()} == {2}
    assert apply_conf(spec, {"metric": "val_loss"}).search.direction == "min"
    hb = MopSpec.from_dict(hyperband())
    drawn = apply_conf(hb, {"learning_rate_low": 0.005, "learning_rate_high": 0.01}).configurations()
    assert len(drawn) == 17 and all(0.005 <= c["optimizer_params"]["learning_rate"] <= 0.01 for c in drawn)


def test_a_grid_becomes_random_search_over_the_same_values_and_back():
    spec = MopSpec.from_dict(grid())
    drawn = apply_conf(spec, {"method": "random", "num_samples": 5}).configurations()
    assert len(drawn) == 5
    assert all(c["model"] in (MLP, CNN) and c["optimizer_params"]["learning_rate"] in (3e-3, 1e-2)
               and c["batch_size"] in (32, 128) for c in drawn)
    lists = MopSpec.from_dict(random_lists())
    crossed = apply_conf(lists, {"method": "grid"})  # its choices become lists to cross
    assert crossed.search.space.method == "grid" and len(crossed.configurations()) == 2 * 2 * 2


@pytest.mark.parametrize("shape, conf, field, words", [
    ("grid", {"learning_rate": [-1]}, "conf.learning_rate", "must be a number > 0"),
    ("grid", {"learning_rate": ["fast"]}, "conf.learning_rate", "must be a number > 0"),
    ("grid", {"learning_rate": []}, "conf.learning_rate", "must be a non-empty list"),
    ("grid", {"batch_size": [0.5]}, "conf.batch_size", "must be a whole number >= 1"),
    ("grid", {"architectures": ["my_models:resnet"]}, "conf.architectures", "is not one of this DAG's choices"),
    ("grid", {"optimizer": ["adamm"]}, "conf.optimizer", "is not one of this DAG's choices"),
    ("grid", {"epochs_per_hop": 0}, "conf.epochs_per_hop", "must be a whole number >= 1"),
    ("grid", {"metric": "val_auc"}, "conf.metric", "must be one of ['val_loss', 'val_accuracy']"),
    ("grid", {"method": "random"}, "conf.num_samples", "random search needs a number of configurations"),
    ("grid", {"num_samples": 4}, "conf.num_samples", "only applies to random search"),
    ("grid", {"learning_rte": [0.01]}, "conf.learning_rte", "did you mean 'learning_rate'?"),
    ("grid", {"serch": {"metric": "val_loss"}}, "conf.serch", "is not a spec section"),
    ("grid", {"overrides": [1]}, "conf.overrides", "must be a JSON object of spec sections"),
    ("grid", {"overrides": {"serch": {}}}, "conf.overrides.serch", "is not a spec section"),
    ("grid", {"overrides": {"store": {"root": "s3://b/x"}}}, "conf.overrides.store", "top level"),
    ("hyperband", {"eta": 1}, "conf.eta", "decides the brackets and rungs of the DAG's graph"),
    ("hyperband", {"R": 27}, "conf.R", "fixed when the DAG file is parsed"),
    ("hyperband", {"learning_rate_low": 0.05}, "conf.learning_rate_low", "must be below learning_rate_high=0.03"),
    ("hyperband", {"learning_rate_high": -1}, "conf.learning_rate_high", "must be a number > 0"),
    ("hyperband", {"method": "grid"}, "conf.method", "is not a field of this DAG's trigger form"),
])
def test_a_bad_value_names_the_field_the_rule_and_the_fix(shape, conf, field, words):
    with pytest.raises(SpecError) as info:
        apply_conf(SHAPES[shape](), conf)
    assert info.value.field == field
    assert words in str(info.value) and "Fix: " in str(info.value)


def test_json_overrides_apply_after_the_fields_and_a_clash_is_an_error():
    spec = MopSpec.from_dict(grid())
    form = defaults(spec)
    run = apply_conf(spec, {**form, "learning_rate": [0.01], "overrides": {"search": {"fail_fast": True},
                                                                           "schedule": {"seed": 7}}})
    assert run.search.fail_fast and run.schedule.seed == 7
    assert run.search.space.to_dict()["params"]["learning_rate"] == [0.01]
    space = {"method": "grid", "params": {"model": [CNN], "learning_rate": [1e-4]}}
    # the JSON replaces the whole search space when no field of it changed (the form's defaults stay put) ...
    assert apply_conf(spec, {**form, "overrides": {"search": {"space": space}}}).search.space.to_dict()["params"] == \
        space["params"]
    # ... and the section-style conf of the REST API and the CLI works as before
    assert apply_conf(spec, {"search": {"space": space}}).configurations() == \
        apply_conf(spec, {**form, "overrides": {"search": {"space": space}}}).configurations()
    with pytest.raises(SpecError, match=r"conf.learning_rate=\[0.01\]: is changed while the JSON also sets "
                                        r"search.space. Fix: set it in one place"):
        apply_conf(spec, {**form, "learning_rate": [0.01], "overrides": {"search": {"space": space}}})
    with pytest.raises(SpecError, match="conf.epochs_per_hop=2: is changed while the JSON also sets"):
        apply_conf(spec, {"epochs_per_hop": 2, "schedule": {"epochs_per_hop": 3}})



@pytest.mark.parametrize("where", ["top level", "overrides"])
def test_a_conf_that_changes_the_slots_a_shard_is_refused_naming_the_field_the_value_and_the_fix(where):
    """A train task per shard slot is rendered when the DAG file is parsed: a run cannot have other slots."""
    spec = MopSpec.from_dict({**grid(), "schedule": {**grid()["schedule"], "slots_per_shard": 2}})
    change = {"schedule": {"slots_per_shard": 3}}
    conf = change if where == "top level" else {**defaults(spec), "overrides": change}
    with pytest.raises(SpecError) as info:
        apply_conf(spec, conf)
    assert (info.value.field, info.value.value) == ("conf.schedule.slots_per_shard", 3)
    assert "shapes the DAG" in info.value.rule and "(2 a shard here)" in info.value.rule
    assert "change schedule.slots_per_shard in the DAG file" in info.value.fix and "--slots 3" in info.value.fix
    # the value the DAG file gives, and every other schedule field, still go through
    same = apply_conf(spec, {"schedule": {"slots_per_shard": 2, "seed": 9}})
    assert (same.schedule.slots_per_shard, same.schedule.seed) == (2, 9)


typed_keys = st.sampled_from(["method", "num_samples", "architectures", "optimizer", "learning_rate", "batch_size",
                              "epochs_per_hop", "metric", "overrides", "learning_rate_low", "learning_rate_high", "R",
                              "eta", "search", "lr"])
values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 300) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6) | st.sampled_from(["grid", "random", MLP, CNN, "adam", "0.01", "64", "val_loss"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(
        ["search", "schedule", "data", "space", "metric", "seed"]), children, max_size=3),
    max_leaves=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(SHAPES)), st.dictionaries(typed_keys, values, max_size=3))
def test_any_form_conf_either_applies_or_raises_a_spec_error(shape, conf):
    try:
        run = apply_conf(SHAPES[shape](), conf)
    except MopError as exc:
        assert "Fix:" in str(exc)
    else:
        assert all(math.isfinite(c["optimizer_params"]["learning_rate"]) for c in run.configurations())


# -- Airflow: the params of the example DAGs and a real trigger --------------------------------------


def served(dag):
    """The DAG as the API server holds it: it validates a trigger's conf against these params."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))


@pytest.fixture(scope="module")
def example_dags():
    """Each example model-selection DAG (it has the trigger form; the scoring example has none), as parsed
    and as served."""
    from airflow.dag_processing.dagbag import DagBag

    dags = DagBag(dag_folder=str(REPO / "dags")).dags
    assert "mop_digits_retrain" in dags and "mop_digits_score" in dags
    return {dag_id: (dag, served(dag)) for dag_id, dag in dags.items() if "preflight" in dag.task_dict}


def test_every_example_dags_params_validate_and_their_defaults_run_its_spec(example_dags):
    for dag, server_side in example_dags.values():
        params = server_side.params
        form = params.validate()  # what an untouched form sends
        assert set(form) == set(form_fields(dag.get_task("preflight").spec))
        spec = MopSpec.from_dict(dag.get_task("preflight").spec)
        assert apply_conf(spec, form).configurations() == spec.configurations(), dag.dag_id
        assert "iterations" not in form and "data" not in form  # nothing fixed at parse time is offered as editable


def test_airflow_checks_a_conf_against_the_fields_and_the_first_task_checks_the_rest(example_dags):
    from airflow.sdk.exceptions import ParamValidationError

    dag, server_side = example_dags["mop_mnist1d"]
    params = server_side.params
    params.deep_merge({"learning_rate": ["0.01", 0.03], "architectures": [CNN]}).validate()  # as the form sends
    for bad in ({"learning_rate": [-1]}, {"architectures": ["my_models:resnet"]}, {"epochs_per_hop": 0}):
        with pytest.raises(ParamValidationError):
            params.deep_merge(bad).validate()  # refused when triggered: no run is made
    params.deep_merge({"learning_rte": [0.01]}).validate()  # a key no field has passes Airflow ...
    with pytest.raises(SpecError, match="did you mean 'learning_rate'"):  # ... and fails the run's first task
        apply_conf(dag.get_task("preflight").spec, {"learning_rte": [0.01]})
    hb = example_dags["mop_mnist1d_hyperband"][1].params
    with pytest.raises(ParamValidationError):
        hb.deep_merge({"eta": 1}).validate()


def preflight_record(dag_run):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids="preflight",
                                                 key="return_value")).first()
        assert row is not None
        return XComModel.deserialize_value(row)


@pytest.mark.integration
def test_a_form_conf_reaches_the_run_through_a_real_trigger(airflow_db, tmp_path):
    from tests.conftest import write_dag_file

    spec = grid()
    spec["schedule"].update(shards=1, iterations=1)  # few tasks: only preflight runs, the rest is marked done
    spec["store"] = {"root": f"file://{tmp_path / 'store'}"}
    dag = write_dag_file("mop_trigger_form", spec)
    form = served(dag).params.validate()  # what the untouched form sends
    dag_run = dag.test(run_conf={**form, "learning_rate": ["0.01"], "architectures": [CNN], "epochs_per_hop": 2},
                       mark_success_pattern=r"^(?!preflight$)")
    assert dag_run.get_task_instance("preflight").state == "success"
    record = preflight_record(dag_run)
    assert [(c["model"], c["optimizer_params"]["learning_rate"], c["batch_size"], c["epochs_per_hop"])
            for c in record["configs"]] == [(CNN, 0.01, 32, 2), (CNN, 0.01, 128, 2)]
    assert record["spec"]["schedule"]["epochs_per_hop"] == 2

    failed = dag.test(run_conf={**form, "method": "random"}, mark_success_pattern=r"^(?!preflight$)")
    preflight = failed.get_task_instance("preflight")
    assert (failed.state, preflight.state, preflight.try_number) == ("failed", "failed", 1)  # at once, not retried


def test_the_form_lives_on_the_dag_alone_and_every_task_still_reads_it():
    """Airflow would copy the form into each task and serialize every copy (13 s for a 2,584-task
    DAG); a task reads the DAG's params at run time, so none carries a copy."""
    from airflow.sdk import DAG, Param
    from airflow.sdk.definitions.param import process_params
    from airflow.serialization.serialized_objects import DagSerialization

    from mop_airflow import MopTaskGroup, build_mop_dag

    dag = build_mop_dag(grid(), dag_id="form_once")
    serialized = DagSerialization.to_dict(dag)["dag"]
    assert {name for name, _ in serialized["params"]} == set(form_fields(MopSpec.from_dict(grid())))
    assert [t["__var"]["task_id"] for t in serialized["tasks"] if t["__var"].get("params")] == []
    hop = next(t for t in dag.tasks if t.task_id.startswith("train_shard_"))
    seen = process_params(dag, hop, {"epochs_per_hop": 3}, suppress_exception=False)
    assert seen["epochs_per_hop"] == 3 and seen["learning_rate"] == dag.params["learning_rate"]

    with DAG("own_params", schedule=None, params={"day": Param("mon", type="string")}) as mine:
        group = MopTaskGroup(grid(), group_id="pick")
    assert set(mine.params) == {"day"} | {f"pick.{name}" for name in form_fields(group.spec)}
    assert all(not t.params for t in mine.tasks)
    assert process_params(mine, mine.get_task("pick.report"), {}, suppress_exception=False)["day"] == "mon"
