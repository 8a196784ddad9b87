"""`mop-airflow plan` prints the schedule before anything runs; bad input exits 2 with the rule."""

import os

import pytest

from mop_airflow.cli.main import main


def test_plan_prints_brackets_totals_and_estimate(capsys):
    assert main(["plan", "--R", "9", "--eta", "3", "--shards", "4", "--seconds-per-hop", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and len(line.split()) == 6]
    # (bracket, rung, configs, iterations, hops, keep) for R=9, eta=3 on 4 shards
    assert rows == [["2", "0", "9", "1", "4", "3"], ["2", "1", "3", "3", "12", "1"], ["2", "2", "1", "9", "36", "-"],
                    ["1", "0", "5", "3", "12", "1"], ["1", "1", "1", "9", "36", "-"], ["0", "0", "3", "9", "36", "-"]]
    assert "total configurations: 17" in out
    assert "69 iterations = 276 model-hops" in out
    assert "estimated wall time: at least 138 s" in out  # 276 hops x 2 s / 4 shards
    # the replay of the DAG's task plan, never below the bound: a rung is a block that needs every shard
    # slot, so the brackets' rungs train one after another (side by side as tasks per hop, 140 s)
    # the brackets side by side in 3 blocks (rung ends 1, 3, 9) keep the 4 shards busy: the bound
    assert "simulated wall time: 138 s" in out and "its 3 block(s) to the rung ends" in out


def test_the_plans_simulated_wall_time_replays_a_train_task_per_shard_slot(capsys):
    # the same plan on 4 shards of 2 slots: the DAG renders 2 train tasks a shard, so the replay trains two
    # hops a shard at once (138 s when it replayed one train task a shard whatever --slots said)
    assert main(["plan", "--R", "9", "--eta", "3", "--shards", "4", "--slots", "2", "--seconds-per-hop", "2"]) == 0
    out = capsys.readouterr().out
    assert "at least 72 s" in out and "simulated wall time: 90 s" in out


def test_successive_halving_plan(capsys):
    assert main(["plan", "--n", "8", "--r", "1", "--eta", "2", "--shards", "2"]) == 0
    out = capsys.readouterr().out
    assert "total configurations: 8" in out


def test_plan_rejects_rungs_between_iterations(capsys):
    assert main(["plan", "--R", "4", "--eta", "3"]) == 2
    assert "not a whole number of iterations" in capsys.readouterr().err


def test_plan_previews_asha_rungs_budget_and_a_replay_and_refuses_an_R_no_rung_reaches(capsys):
    assert main(["plan", "--asha", "--n", "9", "--r", "1", "--R", "9", "--eta", "3", "--shards", "2",
                 "--seconds-per-hop", "2", "--task-seconds", "4"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if len(line.split()) == 3 and line.split()[0].isdigit()]
    assert rows == [["0", "1", "9"], ["1", "3", "3"], ["2", "9", "1"]]
    # 9 x 1 + 3 x (3 - 1) + 1 x (9 - 3) iterations, each 2 hops on 2 shards
    assert "budget: 21 iterations (42 model hops)" in out
    assert "at least 21 hop steps" in out  # the budget over 2 slots (21) vs one configuration to R (18 hops)
    # the same 21 iterations as a deadline: 10 blocks of 2 configurations, replayed beside it
    assert 'with "budget": 21 in search.adaptive (a deadline of 10 blocks, one configuration per slot)' in out
    steps = int(out.split(" hop steps, slot use")[0].rsplit(" ", 1)[1])
    blocks = -(-steps // 2)
    assert f"estimated wall time: {steps * 2 + blocks * 4:,} s" in out
    assert main(["plan", "--asha", "--n", "9", "--R", "10"]) == 2
    assert "search.adaptive.R=10: is not a rung" in capsys.readouterr().err


def test_plan_previews_an_asha_budget_as_blocks_and_refuses_one_that_cannot_reach_R(capsys):
    assert main(["plan", "--asha", "--n", "27", "--R", "9", "--shards", "2", "--budget", "30"]) == 0
    out = capsys.readouterr().out
    assert "budget: 30 iterations: 2 configurations at once (one per slot) for at most 15 blocks" in out
    iterations, steps = out.split("decided between blocks of one iteration: ")[1].split(" hop steps")[0].split(
        " iterations in ")
    assert float(iterations) <= 30 and int(steps) <= 15 * 2  # never past the budget's blocks
    assert "at most 30 hop steps: the budget's blocks" in out and "reached R=9" in out
    assert main(["plan", "--asha", "--n", "27", "--R", "9", "--shards", "2", "--budget", "17"]) == 2
    assert "search.adaptive.budget=17: lasts 8 block(s)" in capsys.readouterr().err


def test_plan_simulates_madlibs_hyperband_on_16_shards(capsys):
    """R=81, eta=3 (MADlib's own example) on 16 shards: 5 blocks, one per rung end, 25,296 hops."""
    assert main(["plan", "--R", "81", "--eta", "3", "--shards", "16", "--seconds-per-hop", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "its 5 block(s) to the rung ends" in out
    simulated = float(out.split("simulated wall time: ")[1].split(" s")[0].replace(",", ""))
    assert 25296 * 0.1 / 16 <= simulated < 1.5 * 25296 * 0.1 / 16  # the bound, and the barriers at 4 rung ends


# ---------------------------------------------------------------- help that reads as help
def _commands(parser, path=()):
    """(command path, its parser) for every command and sub-command."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def test_every_command_has_a_description_and_every_option_help_text():
    from mop_airflow.cli.main import build_parser

    parser = build_parser()
    found = list(_commands(parser))
    assert {"check", "plan", "up", "demo", "report", "k8s values", "champion publish", "pools sync"} <= {
        " ".join(path) for path, _ in found}
    missing = []
    for path, sub in found:
        if not (sub.description or "").strip():
            missing.append(f"{' '.join(path)}: no description")
        for action in sub._actions:
            if action.dest == "help" or action.help == "==SUPPRESS==" or action.__class__.__name__ == "SubCommands":
                continue
            if not (action.help or "").strip():
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}: no help")
    assert missing == []


def test_the_top_level_help_lists_the_commands_and_each_shows_its_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert ":mod:" not in out and "this module" not in out
    commands = [line.split()[0] for line in out.split("commands:")[1].splitlines()[2:] if line.startswith("    ")
                and not line.startswith("     ")]
    assert commands[:3] == ["check", "plan", "up"] and {"report", "k8s", "champion", "pools"} <= set(commands)
    with pytest.raises(SystemExit):
        main(["k8s", "values", "--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines inside words with hyphens
    assert "(default:mop-airflow-worker:cuda)" in out and "(default:mop-airflow-worker:cpu)" in out
    assert "(default:aws_default)" in out
    with pytest.raises(SystemExit):
        main(["example-data", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default 20000)" in out and "data/, /" in out.replace(os.sep, "/")


def test_an_argument_a_command_does_not_take_is_refused_with_that_commands_usage(capsys):
    """Not argparse's top-level `usage: mop-airflow [-h] COMMAND ...`, which names no option of the command."""
    with pytest.raises(SystemExit) as exited:
        main(["plan", "--method", "hyperband"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: mop-airflow plan [-h] [--asha] [--R R]")
    assert err.rstrip().endswith("mop-airflow plan: error: unrecognized arguments: --method hyperband "
                                 "(`mop-airflow plan --help` lists the arguments it takes)")
    with pytest.raises(SystemExit) as exited:  # a command's own command: its parser, its name
        main(["k8s", "values", "--shards", "2", "--gpu-count", "1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: mop-airflow k8s values [-h] --shards SHARDS")
    assert "mop-airflow k8s values: error: unrecognized arguments: --gpu-count 1 (`mop-airflow k8s values --help`" in err


# ---------------------------------------------------------------- mop-airflow check: no Airflow running
def _toy(tmp_path, **kwargs):
    import numpy as np

    from tests.training.toys import toy_spec

    rng = np.random.default_rng(0)
    return toy_spec(tmp_path, rng.normal(size=(240, 6)).astype("float32"), rng.integers(0, 3, 240), shards=3,
                    **kwargs)


def test_check_validates_a_spec_file_builds_its_models_and_says_what_would_run(tmp_path, capsys):
    import json

    spec = _toy(tmp_path, models=("tests.training.toys:batchnorm_dropout_mlp", "tests.training.toys:regression_mlp"))
    spec["schedule"]["slots_per_shard"] = 2
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "spec: spec valid; Grid search, 4 configurations" in out
    assert "would train 4 configuration(s) (2 builder(s)) on 3 shard(s) x 2 slot(s), 1 block(s)" in out
    assert "data valid: 240 row(s) in 1 file(s), 48 for validation; inputs f0, f1, f2, f3, f4, f5" in out
    assert "models: 2 distinct model(s) built" in out
    assert not (tmp_path / "store").exists()  # nothing written to the store: no run was made


def test_check_names_a_misspelt_builder_once_for_its_configurations_with_the_name_it_may_mean(tmp_path, capsys):
    import json

    spec = _toy(tmp_path, models=("tests.training.toys:batchnorm_dropout_mlp", "tests.training.toys:regresion_mlp"))
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["check", str(path)]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if "cannot train:" in line]
    assert len(lines) == 1  # one line for the builder's 2 configurations, not one each
    assert lines[0].startswith("  2 configurations (c0")
    assert ("cannot train: model builder 'tests.training.toys:regresion_mlp': attribute 'regresion_mlp' is missing "
            "in 'tests.training.toys' (did you mean 'regression_mlp'?). Fix: check the spelling after the colon") \
        in lines[0]


def test_check_finds_the_builders_beside_a_spec_file_as_beside_a_dag_file(tmp_path, capsys):
    import sys
    import uuid

    import yaml

    module = f"my_models_{uuid.uuid4().hex[:8]}"  # a name no earlier test imported
    (tmp_path / f"{module}.py").write_text("from tests.training.toys import batchnorm_dropout_mlp as mlp\n")
    path = tmp_path / "selection.yaml"
    path.write_text(yaml.safe_dump(_toy(tmp_path, models=(f"{module}:mlp",))))
    try:
        assert main(["check", str(path)]) == 0
    finally:
        sys.path.remove(str(tmp_path))
    assert "models: 1 distinct model(s) built" in capsys.readouterr().out


def test_check_names_a_broken_builder_and_exits_non_zero(tmp_path, capsys):
    import yaml

    spec = _toy(tmp_path, models=("tests.training.toys:batchnorm_dropout_mlp", "tests.training.toys:seven_outputs"))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "c0002" in err or "seven_outputs" in err
    assert ("the model outputs 7 value(s) per row but 3 classes and loss 'sparse_categorical_crossentropy' need(s) 3. "
            "Fix: end with keras.layers.Dense(hparams['num_classes']") in err
    assert "2 of 4 configuration(s) cannot train; the run would fail before training: model builder " \
           "'tests.training.toys:seven_outputs' fails for each of its 2 configuration(s)" in err


def test_check_names_the_field_value_rule_and_fix_of_a_bad_spec(tmp_path, capsys):
    import json

    spec = _toy(tmp_path)
    spec["schedule"]["shards"] = 0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    assert main(["check", str(path), "--no-models"]) == 2
    err = capsys.readouterr().err
    assert "schedule.shards" in err and "0" in err and "Fix" in err
    assert main(["check", str(tmp_path / "missing.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_check_finds_the_specs_a_dag_file_builds_without_airflow_running(tmp_path, capsys):
    import json

    spec = _toy(tmp_path)
    dag_file = tmp_path / "my_dag.py"
    dag_file.write_text("from mop_airflow import build_mop_dag\n\n"
                        f"dag = build_mop_dag({json.dumps(spec)}, dag_id='toy_selection')\n")
    assert main(["check", str(dag_file), "--no-models"]) == 0
    out = capsys.readouterr().out
    assert "toy_selection: spec valid" in out and "would train 2 configuration(s)" in out
    (tmp_path / "no_dag.py").write_text("x = 1\n")
    assert main(["check", str(tmp_path / "no_dag.py")]) == 2
    assert "builds no mop_airflow DAG or task group and has no module-level `spec`" in capsys.readouterr().err


# ---------------------------------------------------------------- one prefix, one unit, one project home
def test_environment_variables_old_names_still_read_with_a_warning_new_names_win(tmp_path, caplog):
    import warnings

    from mop_airflow.config import environment

    environment._warned.discard("MOP_SLOT_WAIT_S")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert environment.env("MOP_SLOT_WAIT_SECONDS", environ={"MOP_SLOT_WAIT_S": "5"}) == "5"
    assert [str(w.message) for w in caught] == [
        "the environment variable MOP_SLOT_WAIT_S is deprecated: set MOP_SLOT_WAIT_SECONDS instead (same value)"]
    assert "set MOP_SLOT_WAIT_SECONDS instead" in caplog.text
    both = {"MOP_SLOT_WAIT_S": "5", "MOP_SLOT_WAIT_SECONDS": "7"}
    assert environment.env("MOP_SLOT_WAIT_SECONDS", environ=both) == "7"
    assert environment.env("MOP_SLOT_WAIT_SECONDS", "60", environ={}) == "60"
    home = str(tmp_path / "home")
    assert environment.project_home({"MOP_AIRFLOW_HOME": home}) == home
    assert environment.project_home({"MOP_HOME": home, "MOP_AIRFLOW_HOME": "/elsewhere"}) == home
    assert environment.project_home({}) == os.path.expanduser("~/mop_airflow")
    for new, old in environment.RENAMED.items():  # one prefix, one unit suffix
        assert new.startswith("MOP_") and not new.startswith("MOP_AIRFLOW_") and not new.endswith("_S"), (new, old)


def test_the_task_and_the_command_line_share_one_project_home(monkeypatch, tmp_path):
    from mop_airflow.cli.main import build_parser
    from mop_airflow.config.spec import default_home

    monkeypatch.delenv("MOP_AIRFLOW_HOME", raising=False)
    monkeypatch.setenv("MOP_HOME", str(tmp_path))
    assert default_home() == str(tmp_path)  # where a task's default store and cache are
    assert build_parser().parse_args(["report", "a_dag"]).home == str(tmp_path)  # where `report` looks
    monkeypatch.delenv("MOP_HOME")
    assert default_home() == build_parser().parse_args(["up", "--dags-folder", "d"]).home == os.path.expanduser(
        "~/mop_airflow")


def test_check_trains_a_step_on_rows_of_the_data_and_names_a_loss_that_does_not_fit_the_labels(tmp_path, capsys):
    import json

    spec = _toy(tmp_path)
    spec["search"]["space"]["params"]["loss"] = "categorical_crossentropy"  # one-hot targets; the labels are 0, 1, 2
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "a training step on 8 rows of" in err and "'categorical_crossentropy'" in err
    assert "Fix: make the model's output and loss ('categorical_crossentropy') fit the label 'y' (classification, " \
           "3 classes as indices 0..2)" in err


def test_check_finds_each_task_groups_spec_in_a_dag_file(tmp_path, capsys):
    import json

    first, second = _toy(tmp_path), _toy(tmp_path, learning_rates=(1e-2,))
    second["schedule"]["shards"] = 0  # the second group's mistake, named with its selection
    dag_file = tmp_path / "groups_dag.py"
    dag_file.write_text(
        "import datetime as dt, json\nfrom airflow.sdk import DAG\nfrom mop_airflow import MopTaskGroup\n\n"
        "with DAG('groups', schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)) as dag:\n"
        f"    MopTaskGroup(json.loads({json.dumps(json.dumps(first))}), group_id='first', pools='off')\n")
    assert main(["check", str(dag_file), "--no-models"]) == 0
    assert "groups.first: spec valid" in capsys.readouterr().out
    spec_file = tmp_path / "module_spec.py"
    spec_file.write_text(f"import json\nspec = json.loads({json.dumps(json.dumps(second))})\n")
    assert main(["check", str(spec_file), "--no-models"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mop-airflow: module_spec: ") and "schedule.shards" in err
