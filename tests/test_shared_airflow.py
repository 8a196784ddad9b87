"""The test worker's shared Airflow (tests/conftest.py): what a file's DAG files set for the processes
that parse them, without starting an Airflow (the files that use it start it)."""

import ast
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import AirflowPart, with_header


def test_the_header_goes_after_the_docstring_and_future_imports_so_both_still_work():
    source = '"""The DAG\'s doc."""\n\nfrom __future__ import annotations\n\nimport json\nx = __doc__\n'
    out = with_header(source, "HEADER = 1\n")
    module = ast.parse(out)
    assert ast.get_docstring(module) == "The DAG's doc."
    assert [type(n).__name__ for n in module.body][:3] == ["Expr", "ImportFrom", "Assign"]
    assert out.index("from __future__") < out.index("HEADER = 1") < out.index("import json")
    assert with_header("import json\n", "HEADER = 1\n") == "HEADER = 1\nimport json\n"


def test_a_dag_file_sets_its_test_files_home_and_builders_path_in_the_process_that_parses_it(tmp_path):
    af = SimpleNamespace(dags_folder=tmp_path / "shared_dags")
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "part_builder.py").write_text("NAME = 'from the part'\n")
    part = AirflowPart(af, tmp_path / "file", "one_file", env={"EXTRA": "1"}, paths=[lib])
    path = part.write_dag("a_dag", "import part_builder\nprint(__import__('os').environ['MOP_HOME'],"
                                   " part_builder.NAME, __import__('os').environ['EXTRA'])\n")
    assert path.parent == tmp_path / "shared_dags" / "one_file" and not list(path.parent.glob("*.partial"))
    env = {k: v for k, v in os.environ.items() if k not in ("MOP_HOME", "PYTHONPATH", "EXTRA")}
    out = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(tmp_path / "file" / "mop"), "from", "the", "part", "1"]
    assert part.dag_env["PYTHONPATH"].split(os.pathsep)[0] == str(lib)  # for processes the task starts


class _DyingProcessor:
    """A stand-in for LocalAirflow whose dag-processor has exited once: its first wait fails as
    LocalAirflow's does, and every call is recorded."""

    def __init__(self, tmp_path):
        self.dags_folder, self.calls, self.processor_up = tmp_path / "dags", [], False

    def alive(self):
        return {"scheduler": True, "dag-processor": self.processor_up}

    def wait_for_dag(self, dag_id, timeout, folder):
        self.calls.append(("wait", dag_id, folder.name))
        if not self.processor_up:
            raise RuntimeError("the dag-processor exited (exit code 1) while a waited to be parsed; its log ends:\nboom")

    def stop_service(self, name, timeout):
        self.calls.append(("stop", name))

    def start_service(self, name):
        self.calls.append(("start", name))
        self.processor_up = True


def test_a_dag_processor_that_exited_is_started_again_once_with_a_warning_that_says_why(tmp_path):
    af = _DyingProcessor(tmp_path)
    part = AirflowPart(af, tmp_path / "file", "one_file")
    with pytest.warns(UserWarning, match=r"(?s)exit code 1.*boom.*started again"):
        part.wait_for_dag("a")
    assert af.calls == [("wait", "a", "one_file"), ("stop", "dag-processor"), ("start", "dag-processor"),
                        ("wait", "a", "one_file")]
    af.processor_up, af.calls = True, []
    part.wait_for_dag("b")  # a live one is only waited on
    assert af.calls == [("wait", "b", "one_file")]


def test_an_import_error_is_not_taken_for_a_dag_processor_that_exited(tmp_path):
    af = _DyingProcessor(tmp_path)
    af.processor_up = True
    af.wait_for_dag = lambda dag_id, timeout, folder: (_ for _ in ()).throw(RuntimeError("DAG import errors:\nx"))
    with pytest.raises(RuntimeError, match="DAG import errors"):
        AirflowPart(af, tmp_path / "file", "one_file").wait_for_dag("a")


def test_the_shared_files_are_dealt_into_units_even_in_seconds_longest_first():
    from tests.conftest import FILE_SECONDS, SHARED_UNIT, shared_units

    files = [f"tests/{name}" for name in ("test_slots_at_user_shapes.py", "test_slot_faults_scheduler.py",
                                          "test_real_scheduler.py", "test_pbt_runs.py", "test_asha_runs.py",
                                          "test_new_file.py")]
    assert set(shared_units(files, 1).values()) == {SHARED_UNIT}  # one unit: as with two workers
    units = shared_units(files, 2)
    seconds = {}
    for path, unit in units.items():
        seconds[unit] = seconds.get(unit, 0) + FILE_SECONDS.get(path.split("/")[-1], 0)
    assert sorted(seconds) == [f"{SHARED_UNIT} 1", f"{SHARED_UNIT} 2"] and set(units) == set(files)
    longest, second = sorted(files, key=lambda f: -FILE_SECONDS.get(f.split("/")[-1], 0))[:2]
    assert units[longest] == f"{SHARED_UNIT} 1"  # the longest starts the first unit
    assert units[second] == f"{SHARED_UNIT} 2"
    # the unit with more seconds holds nothing that would have fitted the other with less between them
    longer, shorter = sorted(seconds, key=seconds.get, reverse=True)
    gap = seconds[longer] - seconds[shorter]
    assert all(FILE_SECONDS.get(p.split("/")[-1], 0) >= gap for p, u in units.items() if u == longer)
