"""The front door holds: the README is short and every link in it resolves, its examples and the
docs' complete examples run, the reference pages cover the code, and the documentation site builds
with ``mkdocs build --strict`` (a broken link, a missing page or a missing API object fails)."""

import importlib.util
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from mop_airflow.config.spec import MopSpec

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)")
FENCE = re.compile(r"^( *)```(\w+)\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)


def markdown_files():
    return [README, ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


def code_blocks(path: Path, language: str) -> list[str]:
    """The fenced blocks of ``language`` in a Markdown file, their indentation (list items) removed."""
    blocks = []
    for indent, lang, body in FENCE.findall(path.read_text()):
        if lang == language:
            blocks.append("\n".join(line[len(indent):] for line in body.splitlines()))
    return blocks


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) and GitHub give a heading, for the headings we write."""
    text = re.sub(r"\{#([\w-]+)\}\s*$", "", heading).strip()
    text = re.sub(r"[`*_]", "", text)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    out = set()
    for line in path.read_text().splitlines():
        match = re.match(r"^#{1,6} (.*)$", line)
        if match:
            explicit = re.search(r"\{#([\w-]+)\}\s*$", match.group(1))
            out.add(explicit.group(1) if explicit else slug(match.group(1)))
    return out


def test_the_readme_is_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= 250


def test_every_link_of_the_readme_resolves():
    links = LINK.findall(README.read_text())
    assert len(links) >= 10  # the README links into the docs
    broken = []
    for target in links:
        if target.startswith(("http://", "https://")):
            broken.append(f"{target}: the README links only to files of the repository")
            continue
        path, _, anchor = target.partition("#")
        file = (README.parent / path).resolve() if path else README
        if not file.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {path or 'README.md'}")
    assert broken == []


def _builder_module(folder: Path) -> None:
    """The README's model builder, written where its DAG file expects it."""
    builders = [block for block in code_blocks(README, "python") if block.startswith("# my_dags/my_models.py")]
    assert len(builders) == 1
    (folder / "my_models.py").write_text(builders[0])


def _complete_dag_examples():
    """Every Python block of the README and the docs that builds a DAG and leaves nothing out."""
    for path in markdown_files():
        for block in code_blocks(path, "python"):
            if "build_mop_dag(" in block and "..." not in block and block.lstrip().startswith("#"):
                yield path, block


def test_the_dag_examples_of_the_readme_and_the_docs_build_their_dags(tmp_path, monkeypatch):
    examples = list(_complete_dag_examples())
    assert sum(path == README for path, _ in examples) == 2  # "A DAG in Python" and "Your own data"
    folder = tmp_path / "my_dags"
    folder.mkdir()
    _builder_module(folder)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("MOP_AIRFLOW_HOME", str(tmp_path / "home"))
    for index, (path, block) in enumerate(examples):
        dag_file = folder / f"example_{index}.py"
        dag_file.write_text(block)
        dag = runpy.run_path(str(dag_file))["dag"]
        hops = [task for task in dag.task_ids if task.rsplit(".", 1)[-1].startswith("train_shard_")]
        assert hops, f"{path.relative_to(ROOT)}: the example's DAG has no train tasks"
        assert {"preflight", "plan", "report"} <= set(dag.task_ids), path


@pytest.mark.integration
def test_the_model_builders_of_the_readme_and_the_docs_build_models_that_fit_their_data():
    import numpy as np

    builders = {}
    for path in (README, DOCS / "getting-started.md", DOCS / "how-to" / "several-inputs.md"):
        for block in code_blocks(path, "python"):
            if "import keras" in block:
                namespace = {}
                exec(compile(block, str(path), "exec"), namespace)  # noqa: S102 - our own documentation
                builders.update({name: namespace[name] for name in ("mlp", "cnn", "image_and_meta") if name in namespace})
    assert sorted(builders) == ["cnn", "image_and_meta", "mlp"]
    mlp = builders["mlp"]({"input_dim": 3, "num_classes": 2, "units": 32})
    assert mlp.predict(np.zeros((4, 3)), verbose=0).shape == (4, 2)
    cnn = builders["cnn"]({"input_dim": 40, "num_classes": 10})
    assert cnn.predict(np.zeros((4, 40)), verbose=0).shape == (4, 10)
    two = builders["image_and_meta"]({"input_shapes": {"image": (16, 16, 3), "meta": (1,)}, "num_outputs": 1,
                                      "task": "regression"})
    assert two.predict({"image": np.zeros((4, 16, 16, 3)), "meta": np.zeros((4, 1))}, verbose=0).shape == (4, 1)


def _spec_dicts():
    """Every JSON block of the docs that is a whole spec (it has data and search sections)."""
    for path in markdown_files():
        for block in code_blocks(path, "json"):
            value = json.loads(block)
            if isinstance(value, dict) and {"data", "search"} <= set(value):
                yield path, value


def test_the_spec_json_examples_parse(monkeypatch, tmp_path):
    monkeypatch.setenv("MOP_AIRFLOW_HOME", str(tmp_path))
    specs = list(_spec_dicts())
    assert len(specs) >= 3
    for path, value in specs:
        spec = MopSpec.from_dict(value)
        assert spec.configurations(), path


def _reference_module():
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "_hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_spec_reference_names_every_field_of_every_section(monkeypatch):
    import dataclasses

    from mop_airflow.config import spec as spec_module

    monkeypatch.delenv("MOP_AIRFLOW_HOME", raising=False)
    page = _reference_module().spec_reference()
    for section, name in [("data", "DataSpec"), ("search", "SearchSpec"), ("schedule", "ScheduleSpec"),
                          ("store", "StoreSpec"), ("publish", "PublishSpec")]:
        for spec_field in dataclasses.fields(getattr(spec_module, name)):
            assert f"| `{section}.{spec_field.name}` |" in page
    assert "| `schedule.shards` | `int` | `4` |" in page


def test_the_command_line_reference_has_every_command():
    page = _reference_module().cli_reference()
    for command in ("up", "status", "report", "runs", "predict", "export-best", "champion list",
                    "champion publish", "pools sync", "celery config", "example-data", "plan", "demo"):
        assert f"### `mop-airflow {command}`" in page
    assert "| `--seconds-per-hop SECONDS_PER_HOP` |" in page


def test_the_architecture_page_shows_the_layers_of_test_layers():
    from tests.test_layers import LAYERS

    text = (DOCS / "architecture.md").read_text()
    assert "<!-- mop:layers -->" in text
    table = _reference_module().layers_reference()
    rows = [line.split("|")[1].strip().strip("`").rstrip("/").removesuffix(".py") for line in table.splitlines()[2:]]
    assert rows == LAYERS[::-1]


def test_every_benchmark_has_a_section_on_the_performance_page():
    text = (DOCS / "performance.md").read_text()
    missing = [path.name for path in sorted((ROOT / "benchmarks").glob("*.py")) if f"`benchmarks/{path.name}`" not in text]
    assert missing == []


def test_the_docs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env.pop("MOP_AIRFLOW_HOME", None)
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert (tmp_path / "site" / "reference" / "spec" / "index.html").is_file()
    page = (tmp_path / "site" / "reference" / "spec" / "index.html").read_text()
    assert "schedule.iterations_per_run" in page


PATH_IN_CODE = re.compile(r"`((?:mop_airflow|operators|plugins|dags|benchmarks|tests|docker|docs)/[\w./-]*\w)(?:::(\w+))?`")
MODULE_IN_CODE = re.compile(r"`(mop_airflow(?:\.\w+)+)`")


def test_the_files_tests_and_modules_the_pages_name_exist():
    """A page that names a file, a test (`tests/x.py::test_y`) or a module names one that exists, so
    a renamed module or test shows here rather than as a stale page."""
    missing = []
    for page in markdown_files():
        text = page.read_text()
        for path, test in PATH_IN_CODE.findall(text):
            target = ROOT / path
            if "<" in path or "*" in path:
                continue
            if not target.exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
            elif test and not re.search(rf"^\s*def {test}\(", target.read_text(), re.MULTILINE):
                missing.append(f"{page.relative_to(ROOT)}: {path}::{test}")
        for dotted in MODULE_IN_CODE.findall(text):
            parts = dotted.split(".")
            if parts[1] in ("operators", "plugins"):  # installed as mop_airflow.operators from operators/
                parts = parts[1:]
            # a module or package, or an object (def, class, NAME =) of a module
            module = ROOT / "/".join(parts)
            parent = (ROOT / "/".join(parts[:-1])).with_suffix(".py")
            found = (module.with_suffix(".py").is_file() or (module / "__init__.py").is_file()
                     or parent.is_file() and re.search(rf"^(def |class |){parts[-1]}\b", parent.read_text(), re.M))
            if not found:
                missing.append(f"{page.relative_to(ROOT)}: {dotted}")
    assert missing == []
