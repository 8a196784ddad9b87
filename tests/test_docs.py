"""The front door holds: the README is short and every link in it resolves, its examples and the
docs' complete examples run, the reference pages cover the code, and the documentation site builds
with ``mkdocs build --strict`` (a broken link, a missing page or a missing API object fails).

What a user reads is checked against the code, in the README and every page under ``docs/``:

- **Commands**: every ``mop-airflow ...`` line of a ``bash``, ``sh``, ``shell`` or ``console`` fenced
  block (and a ``$ mop-airflow ...`` line of a fenced block of any language) parses with the real
  parser (``mop_airflow.cli.main.build_parser``), after a leading ``.venv/bin/``, environment
  assignments and ``kubectl ... --`` are taken off and a line is cut at ``&&``, ``;``, ``|``, ``>`` or
  `` #``. Every inline code span ``mop-airflow ...`` names a command that exists and only its options
  (a span may leave required arguments out or show ``[optional]`` parts and ``METAVARS``).
- **Specs**: every ``json`` or ``yaml`` fenced block that is a whole spec (``data`` and ``search``)
  validates with ``MopSpec.from_dict``; every ``python``, ``json`` or ``yaml`` block that is a
  fragment of one (``"search": {...}``, ``"data": {...}``, ``"adaptive": {...}``, ``"space": {...}``,
  ``"schedule": {...}``, ``spec = {...}``, written as dict entries, one or several in a block, each on
  one line or over several) validates once put into a whole spec (``BASE_SPEC``); a fragment with
  ``...`` in it is left out. The Python blocks that build a whole DAG run
  (``test_the_dag_examples_of_the_readme_and_the_docs_build_their_dags``).
- **Retired options and concepts**: a page names a retired option (``RETIRED_OPTIONS``) only in an
  upgrade note that says it is gone; no page, and no docstring, message or string of the package, the
  operators, the plugins, the example DAGs or the results page's script, makes a claim of a design
  that is gone (``RETIRED_CLAIMS``). The changelog is history and is not checked, nor is the
  performance page's dated record of earlier designs (``HISTORY``).
- **Figures the README quotes** that other pages give too (the demo's time, what a fault costs) are
  the same there; the task counts the pages give are the task plan's; the reference pages render no
  reStructuredText role as text; the environment
  variables' page lists every ``MOP_*`` variable the code reads, with the code's defaults; the
  how-tos that make the example data install the ``examples`` extra; the compose file and the GPU
  pages set what a GPU worker needs.
"""

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
    out = set(re.findall(r'<a id="([\w-]+)"></a>', path.read_text()))  # a table row's anchor
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
    monkeypatch.setenv("MOP_HOME", str(tmp_path / "home"))
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
    monkeypatch.setenv("MOP_HOME", str(tmp_path))
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

    monkeypatch.delenv("MOP_HOME", raising=False)
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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The documentation site, built once with ``mkdocs build --strict``."""
    folder = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env.pop("MOP_HOME", None)
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return folder


def test_the_docs_build_strict(site):
    assert (site / "reference" / "spec" / "index.html").is_file()
    page = (site / "reference" / "spec" / "index.html").read_text()
    assert "schedule.iterations_per_run" in page
    assert (site / "reference" / "environment" / "index.html").is_file()


# A reStructuredText role as Markdown renders it from a docstring: the role's name as text before the code.
RAW_ROLE = re.compile(r":[a-z]+:(?:<code>|`)")


def test_the_reference_pages_render_no_restructuredtext_role_as_text(site):
    raw = {}
    for page in ("python-api", "operators", "spec", "cli", "environment"):
        html = (site / "reference" / page / "index.html").read_text()
        found = [html[max(0, m.start() - 40):m.end() + 40] for m in RAW_ROLE.finditer(html)]
        found += [html[max(0, m.start() - 40):m.end() + 40] for m in re.finditer(r"<code>~(?!/)", html)]  # ~/: a home
        if found:
            raw[page] = found
    assert raw == {}
    roles = _reference_module().roles_to_code
    assert roles("see :func:<code>~mop_airflow.airflow.dag.build_mop_dag</code> and :data:<code>RETRIES</code>") == \
        "see <code>mop_airflow.airflow.dag.build_mop_dag</code> and <code>RETRIES</code>"


PATH_IN_CODE = re.compile(r"`((?:mop_airflow|operators|plugins|dags|benchmarks|tests|docker|docs|examples|slot_sim)/[\w./-]*\w)(?:::(\w+))?`")
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


# ------------------------------------------------------------------ every page against the code
def pages():
    """The README and every page of the site (the changelog is history and is left out)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


ANY_FENCE = re.compile(r"^( *)```([\w-]*)[^\n]*\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
SHELLS = ("bash", "sh", "shell", "console")


def fenced_blocks(path: Path) -> list[tuple[str, str]]:
    """Every fenced block of a Markdown file as (language, text), its indentation removed."""
    return [(lang, "\n".join(line[len(indent):] for line in body.splitlines()))
            for indent, lang, body in ANY_FENCE.findall(path.read_text())]


def _cli_parser():
    saved = {key: os.environ.pop(key) for key in ("MOP_HOME", "MOP_API_USER") if key in os.environ}
    try:
        from mop_airflow.cli.main import build_parser

        return build_parser()
    finally:
        os.environ.update(saved)


COMMAND = re.compile(r"(?:^|[\s/]|--\s)mop-airflow\s+(.*)$")


def _command_of(line: str) -> str | None:
    """The arguments after ``mop-airflow`` on a shell line, cut where another command or a comment starts."""
    line = line.strip()
    if line.startswith("#"):
        return None
    match = COMMAND.search(line.removeprefix("$ "))
    if match is None:
        return None
    return re.split(r"\s(?:&&|;|\||>|2>|#)", " " + match.group(1))[0].strip()


def shell_commands():
    """(page, arguments) of every ``mop-airflow`` line of the pages' shell blocks (``$ `` lines of any block)."""
    for page in pages():
        for lang, text in fenced_blocks(page):
            text = re.sub(r"\\\n\s*", " ", text)  # continued lines
            for line in text.splitlines():
                if lang in SHELLS or line.lstrip().startswith("$ mop-airflow "):
                    command = _command_of(line)
                    if command is not None:
                        yield page, command


def inline_commands():
    """(page, span) of every inline code span that starts a ``mop-airflow`` command."""
    for page in pages():
        prose = ANY_FENCE.sub("", page.read_text())
        for span in re.findall(r"`([^`]+)`", prose):
            span = " ".join(span.split())
            command = _command_of(span) if re.search(r"(?:^|[\s/])mop-airflow ", span) else None
            if command is not None:
                yield page, command


def _subcommand(parser: argparse.ArgumentParser, words: list[str]) -> tuple[argparse.ArgumentParser, list[str], str]:
    """The parser of the sub-command ``words`` start with, the words after it, and its path."""
    path = "mop-airflow"
    while words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
        if not subs or words[0] not in subs[0].choices:
            break
        parser, path, words = subs[0].choices[words[0]], f"{path} {words[0]}", words[1:]
    return parser, words, path


def test_every_mop_airflow_command_in_a_shell_block_parses_with_the_real_parser():
    commands = list(shell_commands())
    assert len(commands) >= 20 and any(page == README for page, _ in commands)
    wrong = []
    for page, command in commands:
        parser, errors = _cli_parser(), io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                parser.parse_args(shlex.split(command))
        except SystemExit:
            wrong.append(f"{page.relative_to(ROOT)}: mop-airflow {command}: {errors.getvalue().strip().splitlines()[-1]}")
    assert wrong == []


def test_every_mop_airflow_command_named_in_the_prose_exists_with_the_options_it_shows():
    commands = list(inline_commands())
    assert len(commands) >= 30
    wrong = []
    for page, command in commands:
        words = shlex.split(re.sub(r"\[[^\]]*\]|\.\.\.", " ", command.replace("\\|", "|")))
        parser, rest, path = _subcommand(_cli_parser(), words)
        if path == "mop-airflow":
            wrong.append(f"{page.relative_to(ROOT)}: mop-airflow {command}: no such command")
            continue
        known = parser._option_string_actions  # noqa: SLF001
        for index, word in enumerate(rest):
            option = word.split("=", 1)[0]
            if option.startswith("-") and option not in known:
                wrong.append(f"{page.relative_to(ROOT)}: {path} has no option {option}")
            elif option in known and known[option].choices and index + 1 < len(rest):
                value = rest[index + 1]
                if not value.isupper() and value not in map(str, known[option].choices):
                    wrong.append(f"{page.relative_to(ROOT)}: {path} {option} {value}: not one of {known[option].choices}")
    assert wrong == []


# What a spec fragment is put into: a random search of the README's builders, its data, its schedule.
BASE_SPEC = {
    "data": {"source": "/data/train.parquet", "label": "label", "features": "x*"},
    "search": {"space": {"method": "random", "seed": 7, "params": {
        "model": {"distribution": "choice", "values": ["my_models:mlp", "my_models:cnn"]},
        "learning_rate": {"distribution": "log_uniform", "low": 1e-4, "high": 3e-2},
        "batch_size": [32, 64, 128], "hparams": {"dropout": [0.1, 0.2, 0.3]}}, "num_samples": 8}},
    "schedule": {"shards": 4, "iterations": 3},
}
SECTIONS = ("data", "search", "schedule", "store", "publish")
SEARCH_KEYS = ("space", "adaptive", "metric", "direction", "fail_fast", "max_configurations", "warm_start")


def _fragment(text: str):
    """A block's dict entries (``"key": value, ...``) as a dict, or None where it is no such thing."""
    text = re.sub(r"^\s*spec\s*=\s*", "", text.strip())
    for source in (text, "{" + text + "\n}"):  # on a line of its own: the last line may end in a comment
        try:
            value = ast.literal_eval(source)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        return value if isinstance(value, dict) else None
    return None


def _as_spec(fragment: dict) -> dict | None:
    """``fragment`` put into ``BASE_SPEC``: whole sections, or the search's own keys; None if it is not a spec's."""
    import copy

    spec = copy.deepcopy(BASE_SPEC)
    if set(fragment) <= set(SECTIONS):
        spec.update(fragment)
        if "search" not in fragment and (spec["data"].get("task") == "regression"):
            spec["search"]["space"]["params"].update(loss="mse", metrics=["mae"])
            spec["search"]["metric"] = "val_mae"
        return spec
    if set(fragment) <= set(SEARCH_KEYS):
        spec["search"].update(fragment)
        if "adaptive" in fragment and "space" not in fragment:  # the plan decides how many to draw
            spec["search"]["space"].pop("num_samples")
        return spec
    return None


def _entries(text: str):
    """The dicts and dict entries of a block (``spec = {...}``, ``"adaptive": {...}`` a line, or an entry
    over lines), each the fewest lines from where it starts; lines with ``...`` are left out."""
    lines = text.splitlines()
    start = 0
    while start < len(lines):
        for end in range(start + 1, len(lines) + 1):
            if "..." in lines[end - 1]:
                break
            entry = _fragment("\n".join(lines[start:end]).rstrip().rstrip(","))
            if isinstance(entry, dict):
                yield entry
                start = end - 1
                break
        start += 1


def spec_snippets():
    """(page, spec) of every spec and spec fragment in the pages' python, json and yaml blocks."""
    for page in pages():
        for lang, text in fenced_blocks(page):
            if lang not in ("python", "json", "yaml"):
                continue
            if lang == "yaml":
                value = yaml.safe_load(text)
                fragments = [value] if isinstance(value, dict) else []
            else:
                whole = None if "..." in text else _fragment(text) if lang == "python" else json.loads(text)
                fragments = [whole] if isinstance(whole, dict) else list(_entries(text))
            for fragment in fragments:
                spec = _as_spec(fragment)
                if spec is not None:
                    yield page, spec


def test_every_spec_and_spec_fragment_of_the_pages_validates(monkeypatch, tmp_path):
    monkeypatch.setenv("MOP_HOME", str(tmp_path))
    specs = list(spec_snippets())
    assert len(specs) >= 15
    assert {"adaptive-searches.md", "spec.md", "README.md"} <= {page.name for page, _ in specs}
    wrong = []
    for page, value in specs:
        try:
            spec = MopSpec.from_dict(value)
            spec.adaptive_plan()
        except Exception as exc:  # noqa: BLE001 - every failure is listed with its page
            wrong.append(f"{page.relative_to(ROOT)}: {type(exc).__name__}: {exc}")
    assert wrong == []


# Options a spec no longer takes: a page names one only in a sentence that says it is gone.
RETIRED_OPTIONS = ("allow_partial_iterations", "between_runs", "bundle_size")
GONE = re.compile(r"no longer exists|is gone|retired|is refused|refuses|replaced")
# Claims of designs that are gone, which no page, docstring, message or page script may make (matched in
# lower case, Markdown's backticks and stars taken off, lines joined).
RETIRED_CLAIMS = {
    r"a block per iteration": "adaptive searches train in blocks to the next decision point; ASHA is one block",
    r"decided between blocks of one iteration": "Hyperband decides at its rung ends, PBT at its boundaries",
    r"every adaptive search (is decided|trains) (between|in) blocks|\ban adaptive search trains in blocks"
    r"|asha and pbt are decided between blocks": "an ASHA drawing at random is decided inside the shard slots",
    r"\(asha without a budget\)|(?<!model-based )\basha without a budget (has no|starts|takes|needs)":
        "only a model-based (TPE) ASHA without a budget takes a DAG run per block",
    r"branching task": "a decide task ends each block of Hyperband's rungs",
    r"\bdeal tasks?\b": "a block's train tasks read their block's decision themselves",
    r"do not fuse them yet": "the slots fuse configurations (schedule.fuse)",
    r"changes a leaderboard's last digits": "fusing was measured to move a metric by up to 0.0265",
    r"set allow_partial_iterations=true": "blocks to the rung ends replaced it; a spec may not set it",
    r"replays the very same plan": "the simulator replays the task plan and production's slot placement, with hop "
                                   "times it is given, not the shard loop itself",
    r"(replay|simulat\w*)[^.]*(slot i mod slots|i mod slots of every shard)":
        "the simulator places hops with production's block_hops (planning/placement.py): by model key",
    r"budget: 63": "measured when ASHA was decided between blocks, a design that is gone",
}
# Dated records of earlier designs, not claims about this one.
HISTORY = ("docs/changelog.md", "docs/performance.md")
# Where a claim's words say something else: (file, pattern) -> why.
NOT_A_CLAIM = {("mop_airflow/cli/plan.py", r"decided between blocks of one iteration"):
               "`mop-airflow plan --asha` describes its simulator's clock, blocks of one iteration"}


def _plain(text: str) -> str:
    return " ".join(text.lower().replace("`", "").replace("*", "").split())


def _code_texts():
    """(file, text) of every docstring and string of the package, the operators, the plugins and the
    example DAGs, and of the results page's script."""
    for folder in ("mop_airflow", "operators", "plugins", "dags"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            strings = [node.value for node in ast.walk(ast.parse(path.read_text()))
                       if isinstance(node, ast.Constant) and isinstance(node.value, str)]
            yield str(path.relative_to(ROOT)), "\n".join(strings)
    for path in sorted((ROOT / "plugins" / "static").glob("*.js")):
        yield str(path.relative_to(ROOT)), path.read_text()


def test_no_page_names_a_retired_option_or_concept():
    found = []
    for page in pages():
        name = str(page.relative_to(ROOT))
        if name in HISTORY:
            continue
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for option in RETIRED_OPTIONS:
                if option in line and not GONE.search(line):
                    found.append(f"{name}:{number}: names {option} as if it still existed")
    texts = [(str(page.relative_to(ROOT)), page.read_text()) for page in pages()
             if str(page.relative_to(ROOT)) not in HISTORY]
    for name, text in [*texts, *_code_texts()]:
        plain = _plain(text)
        for claim, why in RETIRED_CLAIMS.items():
            for match in re.finditer(claim, plain):
                if (name, claim) not in NOT_A_CLAIM:
                    found.append(f"{name}: {plain[max(0, match.start() - 60):match.end() + 20]!r}: {why}")
    assert found == []


def test_the_task_counts_the_pages_give_are_the_task_plans():
    from mop_airflow.planning.task_plan import build_task_plan
    from mop_airflow.search.adaptive import adaptive_plan

    plan = build_task_plan(16, 81, adaptive_plan({"method": "hyperband", "R": 81, "eta": 3}, 16))
    blocks = sum(1 for task in plan.tasks if task.kind == "decide")
    page = _plain((DOCS / "how-to" / "adaptive-searches.md").read_text())
    said = re.search(r"hyperband r=81, eta=3 on 16 shards renders (\d+) blocks of (\d+) train tasks and a decide "
                     r"task each: (\d+) tasks in all", page)
    assert said, "docs/how-to/adaptive-searches.md no longer counts Hyperband R=81's tasks on 16 shards"
    assert tuple(map(int, said.groups())) == (blocks, plan.train_tasks // blocks, len(plan.tasks))
    scale = (DOCS / "performance.md").read_text()
    row = next((line for line in scale.splitlines() if line.startswith("| Hyperband R=81, eta=3, 16 shards")), None)
    assert row is None or row.split("|")[2].strip().startswith(f"{len(plan.tasks)},")  # the DAG-scale table


def test_the_figures_the_readme_quotes_are_the_same_on_the_other_pages():
    readme, started = README.read_text(), (DOCS / "getting-started.md").read_text()
    seconds = re.search(r"it took (\d+) s from start to stop \(([\d-]+)", readme)
    assert seconds, "the README no longer says how long the demo took"
    assert f"({seconds.group(1)} s from start to stop,\nmeasured {seconds.group(2)}" in started
    assert f"demo finished in {seconds.group(1)}s" in readme and f"demo finished in {seconds.group(1)}s" in started
    faults = (DOCS / "what-happens-when.md").read_text()
    costs = re.findall(r"\*\*\+([\d.]+) s\*\* \(([\d.]+) s against ([\d.]+) s undisturbed", readme)
    assert costs, "the README no longer says what a killed train task costs"
    for added, took, undisturbed in costs:  # each fault's cost the README gives, as what-happens-when.md gives it
        digits = len(added.split(".")[1]) if "." in added else 0
        assert round(float(took) - float(undisturbed), digits) == float(added)
        assert f"{took} s against {undisturbed} s undisturbed" in faults


ENV_NAME = re.compile(r"\bMOP_[A-Z0-9_]+\b")


def _env_rows() -> dict[str, str]:
    rows = {}
    for line in (DOCS / "reference" / "environment.md").read_text().splitlines():
        match = re.match(r"^\| `(MOP_[A-Z0-9_]+)` \|", line)
        if match:
            rows[match.group(1)] = line
    return rows


def test_the_environment_page_lists_every_variable_the_code_reads_with_its_default():
    read = set()
    for folder in ("mop_airflow", "operators", "plugins"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".js"):
                read |= set(ENV_NAME.findall(path.read_text()))
    rows = _env_rows()
    assert sorted(read - set(rows)) == [], "read by the code, missing on docs/reference/environment.md"
    assert sorted(set(rows) - read) == [], "on docs/reference/environment.md, read nowhere in the code"
    from mop_airflow.slots import driver as shard_loop, watchdog
    from mop_airflow.training import devices, session
    from mop_airflow.cli.runs import DEFAULT_PORT

    defaults = {"MOP_SHARD_STALL_SECONDS": watchdog.STALL_SECONDS, "MOP_SHARD_WAIT_SECONDS": shard_loop.WAIT_SECONDS,
                "MOP_SHARD_YIELD_SECONDS": shard_loop.YIELD_SECONDS, "MOP_SLOT_WAIT_SECONDS": devices.DEFAULT_WAIT_S}
    if hasattr(watchdog, "STALL_FLOOR_SECONDS"):
        defaults["MOP_SHARD_STALL_FLOOR_SECONDS"] = watchdog.STALL_FLOOR_SECONDS
    assert {name: f"| `{value:g}` |" in rows[name] for name, value in defaults.items()} == dict.fromkeys(defaults, True)
    assert f"http://localhost:{DEFAULT_PORT}" in rows["MOP_API_URL"]
    assert session.HOST_CACHE_MOST == 1 << 30 and "up to 1 GiB" in rows["MOP_MODEL_CACHE_BYTES"]
    assert "reference/environment.md" in (ROOT / "mkdocs.yml").read_text()


def test_a_page_that_makes_the_example_data_installs_the_examples_extra():
    missing = []
    for page in pages():
        shell = "\n".join(text for lang, text in fenced_blocks(page) if lang in SHELLS)
        if "mop-airflow example-data" not in shell:
            continue
        for extras in re.findall(r"pip install [\"']?(?:mop-airflow|\.)\[([^\]]*)\]", shell):
            if "examples" not in extras.split(","):
                missing.append(f"{page.relative_to(ROOT)}: mop-airflow[{extras}] without examples")
    assert missing == []
    from importlib.metadata import PackageNotFoundError, requires

    try:  # the examples extra is what example-data imports
        examples = [r for r in requires("mop-airflow") or [] if 'extra == "examples"' in r]
    except PackageNotFoundError:
        examples = []
    assert not examples or any(r.startswith("mnist1d") for r in examples)


def test_the_readme_says_where_the_results_are_and_how_to_reopen_a_finished_demo():
    from mop_airflow.plugins import MopResultsPlugin

    readme = README.read_text()
    links = {link["name"]: link for link in MopResultsPlugin.external_views}
    assert f"**{links['MOP results']['name']}** tab" in readme
    assert f"**{links['MOP runs']['category'].capitalize()} > {links['MOP runs']['name']}**" in readme
    reopen = re.search(r"`\.venv/bin/mop-airflow (up --dags-folder dags)`", readme)
    assert reopen and "the same `.mop_home`" in readme
    _cli_parser().parse_args(reopen.group(1).split())
    celery = next(text for lang, text in fenced_blocks(README) if "mop-celery.env" in text)
    assert celery.index("export AIRFLOW_HOME=") < celery.index('"$AIRFLOW_HOME/mop-celery.env"')


def test_the_gpu_pages_and_the_compose_file_set_what_a_gpu_worker_needs():
    from mop_airflow.deployment.celery_config import GPU_WORKER_ENV

    compose = yaml.safe_load((ROOT / "docker" / "docker-compose.gpu.yaml").read_text())  # the GPU override
    args = compose["x-cuda-build"]["args"]
    assert "jax[cuda" in args["JAX_PACKAGE"] and "and-cuda" in args["TF_PACKAGE"]
    workers = {name: service for name, service in compose["services"].items() if name.startswith("worker-shard-")}
    assert workers and all(service["environment"].get(k) == v for service in workers.values()
                           for k, v in GPU_WORKER_ENV.items())
    gpu = (DOCS / "how-to" / "gpu-workers.md").read_text()
    table = gpu[gpu.index("## The three common machines"):gpu.index("**Several workers on one machine.**")]
    assert "`schedule.slots_per_shard`" in table
    celery = (DOCS / "how-to" / "celery.md").read_text()
    more = celery[celery.index("**More GPUs on a machine:**"):celery.index("**CPU threads:**")]
    assert "`schedule.slots_per_shard: 2`" in more


def test_the_upgrade_notes_name_every_retired_option_and_moved_module_and_both_pages_are_in_the_nav():
    from mop_airflow.search.adaptive import RETIRED
    from tests.test_layers import MOVED

    notes = (DOCS / "upgrade.md").read_text()
    retired = ["schedule.bundle_size", "schedule.iterations_per_run", *(f"search.adaptive.{k}" for k in RETIRED)]
    assert [option for option in retired if f"`{option}`" not in notes] == []
    assert set(RETIRED_OPTIONS) <= {option.rsplit(".", 1)[1] for option in retired}  # the list this file keeps
    nav = (ROOT / "mkdocs.yml").read_text()
    assert "upgrade.md" in nav and "troubleshooting.md" in nav
    shims = [f"| `{old.rsplit('.', 1)[1]}` | `{new.rsplit('.', 1)[0]}` | imports, with a warning |"
             for old, new in MOVED.items()]
    assert [row for row in shims if row not in notes] == []


def test_the_troubleshooting_page_covers_every_error_the_package_raises_on_purpose():
    import inspect

    from mop_airflow import errors

    page = (DOCS / "troubleshooting.md").read_text()
    classes = [name for name, cls in inspect.getmembers(errors, inspect.isclass)
               if issubclass(cls, errors.MopError) and cls is not errors.MopError]
    assert [name for name in classes if f"`{name}`" not in page] == []
    for what in ("check_parallelism", "create-if-absent", "no decision for block", "Keras cannot save this model"):
        assert what in page, what



# ------------------------------------------------------------------ statements that once disagreed
PERFORMANCE = DOCS / "performance.md"
ROW_LINK = re.compile(r"performance\.md#([\w-]+)")


def performance_rows() -> dict[str, str]:
    """Each anchored row (or sentence) of the performance page: anchor -> its line."""
    return {m.group(1): line for line in PERFORMANCE.read_text().splitlines()
            for m in re.finditer(r'<a id="([\w-]+)"></a>', line)}


def test_the_readme_never_calls_two_different_bests_the_same():
    for page in pages():
        for first, second in re.findall(r"the same best \(([\d.]+) against ([\d.]+)\)", page.read_text()):
            assert first == second, f"{page.relative_to(ROOT)}: 'the same best' of {first} and {second}"


# (page, a figure it quotes, the performance row it links to[, the figure as the row writes it]): each
# figure appears on the page beside a link to its row, and in the row itself (rounded alike where the row
# gives more digits)
QUOTED = [
    ("README.md", "+1.2 s", "kill-cost"), ("README.md", "18.4 s against 17.2 s", "kill-cost"),
    ("README.md", "1.11x", "warm-shards-gpu"), ("README.md", "0.291 s / 0.262 s", "warm-shards-gpu", "0.291 / 0.262 s"),
    ("README.md", "21.5 s", "warm-shards-fused"),
    ("README.md", "12.7 s / 23.0 s", "demo-grid-cpu"), ("README.md", "0.9465 / 0.9335", "demo-grid-cpu"),
    ("README.md", "0.97", "asha-budget-slot-use", "0.967"), ("README.md", "0.75", "asha-no-budget-slot-use", "0.751"),
    ("README.md", "0.83", "hyperband-slot-use", "0.830"), ("README.md", "15.0 s", "pbt-vs-ray-wall"),
    ("README.md", "22.4 s", "asha-vs-ray-wall"), ("README.md", "385.5 s", "hyperband-blocks-wall"),
    ("docs/what-happens-when.md", "77.4 s against 17.2 s", "hung-task"),
    ("docs/what-happens-when.md", "18.4 s against 17.2 s", "kill-cost"),
    ("docs/what-happens-when.md", "96.9 s", "asha-hung-slot"), ("docs/what-happens-when.md", "+77.5 s", "lost-worker-cost"),
    ("docs/concepts/shard-slots.md", "1.72 s", "gpu-hop-forked", "1.72"),
    ("docs/how-to/gpu-workers.md", "1.72 s", "gpu-hop-forked", "1.72"), ("docs/how-to/gpu-workers.md", "1.11x", "warm-shards-gpu"),
    ("docs/how-to/adaptive-searches.md", "0.97", "asha-budget-slot-use", "0.967"),
    ("docs/concepts/fused-configurations.md", "0.0090", "fused-leaderboard"),
    ("docs/concepts/fused-configurations.md", "0.0265", "fused-leaderboard"),
    ("docs/concepts/fused-configurations.md", "0.85x", "fused-cpu-8"),
    ("docs/concepts/fused-configurations.md", "0.76x", "fused-cpu-8"),
    ("docs/concepts/fused-configurations.md", "21.5 s", "warm-shards-fused"),
    ("docs/concepts/fused-configurations.md", "23.9 s", "warm-shards-unfused"),
    ("docs/concepts/shard-slots.md", "190.9 s", "slot-sim-ci"), ("docs/concepts/shard-slots.md", "47.8 s", "slot-sim-ci"),
    ("docs/concepts/shard-slots.md", "2,505.9 s", "slot-sim-million"),
    ("docs/concepts/shard-slots.md", "665.5 s", "slot-sim-driver"),
    ("docs/concepts/mop.md", "6.3-7.3 s", "slot-start-up"), ("docs/concepts/mop.md", "12.4 s", "warm-shards-jax"),
]


def _figure(figure: str) -> re.Pattern:
    return re.compile(r"(?<![\d.])" + re.escape(figure).replace(r"\ ", r"\s+") + r"(?![\d])")


def test_every_quoted_figure_links_to_its_performance_row_and_is_the_rows():
    rows = performance_rows()
    wrong = []
    for name, figure, anchor, *as_written in QUOTED:
        text = (ROOT / name).read_text()
        in_row = as_written[0] if as_written else figure.lstrip("+")
        numbers = [float(n) for n in re.findall(r"\d+\.\d+|\d+", figure)]
        assert numbers == [round(float(n), len(str(q).split(".")[-1]) if "." in str(q) else 0)
                           for n, q in zip(re.findall(r"\d+\.\d+|\d+", in_row), re.findall(r"\d+\.\d+|\d+", figure))], \
            (figure, in_row)  # the page rounds the row's figure, nothing else
        row = rows.get(anchor)
        if row is None:
            wrong.append(f"{name}: no row #{anchor} on the performance page")
            continue
        plain_row = row.replace("**", "")
        if not _figure(in_row).search(plain_row):
            wrong.append(f"{name}: {figure!r} is not in the row #{anchor}")
        places = [m.start() for m in _figure(figure).finditer(text.replace("**", ""))]
        links = [m.start() for m in re.finditer(rf"performance\.md#{anchor}\)", text.replace("**", ""))]
        if not places:
            wrong.append(f"{name}: no longer quotes {figure!r}")
        elif not any(abs(p - link) < 500 for p in places for link in links):
            wrong.append(f"{name}: quotes {figure!r} without a link to its row #{anchor} beside it")
    assert wrong == []


def test_every_bold_figure_of_the_readmes_headline_table_is_in_the_rows_it_links_to():
    rows = performance_rows()
    readme = README.read_text()
    table = readme[readme.index("## Headline figures"):].split("\n\n")[2]
    number = re.compile(r"\d[\d,]*(?:\.\d+)?")
    checked = 0
    for line in table.splitlines()[2:]:
        linked = ROW_LINK.findall(line)
        assert linked, f"a headline figure without its row: {line[:80]}"
        there = set(number.findall(" ".join(rows[a].replace("**", "") for a in linked)))
        for bold in re.findall(r"\*\*([^*]+)\*\*", line):
            missing = [n for n in number.findall(bold) if n not in there]
            assert missing == [], (bold, missing, linked)
            checked += 1
    assert checked >= 6


def test_every_link_to_a_performance_row_names_a_row_that_exists():
    rows, heads = performance_rows(), anchors(PERFORMANCE)
    wrong = [f"{page.relative_to(ROOT)}: #{anchor}" for page in pages() for anchor in ROW_LINK.findall(page.read_text())
             if anchor not in rows and anchor not in heads]
    assert wrong == []


def test_a_gpu_figure_is_quoted_with_its_machine_and_a_row_says_when_it_was_last_measured():
    rows = performance_rows()
    for anchor in ("warm-shards-gpu", "demo-grid-gpu"):
        assert "H100" in rows[anchor] and "not measured since 2026-11-2" in rows[anchor] and "design:" in rows[anchor]
    for line in README.read_text().splitlines():  # a README line on the H100 quotes only H100 rows
        if "H100" in line:
            linked = ROW_LINK.findall(line)
            assert linked and all("H100" in rows.get(a, "") for a in linked), line
            assert "33x" not in line, "33x was measured on an H200, with a hop task per hop"


def _current_rows(heads: str) -> list[tuple[list[str], dict[str, str], str]]:
    """Each row of the performance page's current tables (before its history) whose header starts with
    one of ``heads`` (a regex alternation): (the header's cells, the row's cells by header, the line)."""
    text = PERFORMANCE.read_text()
    current = text[:text.index("{#history}")]
    rows = []
    for table in re.findall(rf"^(\| (?:{heads})[^\n]*\|\n\|[-| ]+\|\n(?:\|[^\n]*\|\n)+)", current, re.M):
        header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
        rows += [(header, dict(zip(header, (c.strip() for c in line.strip("|").split(" | ")))), line)
                 for line in table.splitlines()[2:]]
    return rows


def test_every_measured_row_of_the_performance_page_says_its_machine_and_how_many_runs():
    text = PERFORMANCE.read_text()
    wrong = []
    for header, cells, line in _current_rows("measures"):
        assert {"runs", "machine", "date"} <= set(header), header
        if not re.match(r"\d", cells["runs"]) or not cells["machine"]:
            wrong.append(f"no count of runs or no machine: {line[:80]}")
    assert "C2 alone: the run did not record which of the two" in text
    assert "the production shard loop was rewritten on 2026-11-28" in _plain(text)
    assert wrong == []


def test_a_current_row_is_measured_since_the_shard_loop_three_times_or_says_it_is_not():
    """A row that gives figures of the shard loop before 2026-11-28, or of one run, says so where a reader
    looks: "not measured since" in its date (only a GPU machine's row, until one is lent), or why one run
    in its runs cell; the figures a row replaced stand after "(was" in its date."""
    wrong = []
    for _, cells, line in _current_rows("measures|fault"):
        date, runs = cells["date"], cells["runs"]
        said = "not measured since" in date
        if "before the 2026-11-28 shard loop" in date.split("(was")[0] and not said:
            wrong.append(f"figures of the old shard loop given as current: {line[:90]}")
        if int(re.match(r"\d+", runs).group()) < 3 and not said and "(" not in runs:
            wrong.append(f"one run, without saying why or that it is to be measured again: {line[:90]}")
        if said and not re.search(r"H100|H200", cells["machine"]):
            wrong.append(f"a row of this 2-core machine not measured again (only the GPU machines wait): {line[:90]}")
    assert wrong == []


def test_the_retired_designs_measurements_are_in_the_history_and_the_readme_does_not_reproduce_them():
    text = PERFORMANCE.read_text()
    history = text[text.index("{#history}"):]
    for anchor in ("{#task-parallel}", "{#adaptive-slot-use}"):
        assert anchor in history, anchor
    readme = README.read_text()
    assert "Ray Tune, `with_parameters`" not in readme and "out of memory | out of memory" not in readme


def test_the_pbt_benchmark_is_said_to_be_smaller_than_the_example_with_the_scripts_own_defaults():
    def constants(path):  # NAME = 4 and A, B = 4, 6 at a module's top level
        out = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
                pairs = zip(target.elts, value.elts) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) \
                    else [(target, value)]
                out.update({t.id: v.value for t, v in pairs if isinstance(t, ast.Name) and isinstance(v, ast.Constant)})
        return out

    bench = constants(ROOT / "benchmarks" / "pbt_vs_ray.py")
    example = (ROOT / "dags" / "mop_mnist1d_pbt.py").read_text()
    section = PERFORMANCE.read_text().split("{#pbt-vs-ray}", 1)[1].split("```", 1)[0]
    assert "the example's search" not in section
    said = re.search(r"population (\d+), (\d+) iterations, interval (\d+), on (\d+) one-slot\s+shards", section)
    assert said and tuple(map(int, said.groups())) == (bench["POPULATION"], bench["ITERATIONS"], bench["INTERVAL"],
                                                        bench["SHARDS"])
    pop, its = re.search(r'"population": (\d+), "iterations": (\d+)', example).groups()
    shards = re.search(r'"shards": (\d+)', example).group(1)
    assert f"(the example: population {pop}, {its} iterations" in section and f"on {shards} shards)" in section


SHAPE_FIELDS = ("schedule.shards", "schedule.iterations", "schedule.iterations_per_run", "schedule.slots_per_shard",
                "search.adaptive")


def test_what_a_trigger_conf_may_not_change_is_said_one_way_and_the_code_refuses_each():
    from mop_airflow.config import spec as spec_module
    from mop_airflow.config.form import form_fields
    from mop_airflow.config.trigger import apply_conf
    from mop_airflow.errors import SpecError

    spec = MopSpec.from_dict({**BASE_SPEC, "schedule": {"shards": 2, "iterations": 2}})
    changes = {"schedule.shards": 3, "schedule.iterations": 3, "schedule.iterations_per_run": 1,
               "schedule.slots_per_shard": 2, "search.adaptive": {"method": "hyperband", "R": 3, "eta": 3}}
    for field, value in changes.items():
        section, key = field.split(".")
        with pytest.raises(SpecError) as info:
            apply_conf(spec, {section: {key: value}})
        assert info.value.field == f"conf.{field}" and "Fix: " in str(info.value)
    overrides = form_fields(spec)["overrides"].schema["description_md"]
    texts = {"docs/reference/spec.md": (DOCS / "reference" / "spec.md").read_text(),
             "docs/how-to/trigger-a-run.md": (DOCS / "how-to" / "trigger-a-run.md").read_text(),
             "ScheduleSpec's docstring": spec_module.ScheduleSpec.__doc__.replace("``", "`"),
             "the form's overrides field": overrides}
    for where, text in texts.items():
        sentence = re.search(r"((?:`[\w.]+`,?\s*(?:and\s*)?)+)\s*shape\s+the\s+DAG", text)
        assert sentence, f"{where} no longer says what a conf may not change"
        assert set(re.findall(r"`([\w.]+)`", sentence.group(1))) == set(SHAPE_FIELDS), where


def test_the_run_folder_lists_every_folder_and_file_a_run_writes():
    layout = (ROOT / "mop_airflow" / "records" / "layout.py").read_text()
    used = "\n".join(p.read_text() for folder in ("mop_airflow", "operators", "plugins")
                     for p in (ROOT / folder).rglob("*.py") if p.name != "layout.py")
    written = set()
    for method, first in re.findall(r"def (\w+)\(self[^)]*\)[^:]*:\n(?:\s+\"\"\"[^\n]*\n(?:[^\n]*\n)*?)?\s+return self\._at\(\"([^\"]+)\"", layout):
        if re.search(rf"\.{method}\b", used):  # a place a run still writes or reads
            written.add(first if "." in first else first + "/")
    written.add("tensorboard/")  # mop_airflow.results.tracking.tensorboard_uri
    page = (DOCS / "concepts" / "airflow-mapping.md").read_text()
    listed = re.search(r"Run artifacts: `<store>/<dag_id>/<run_id>/\{([^}]*)\}`", page)
    assert listed, "docs/concepts/airflow-mapping.md no longer lists a run's folder"
    names = {name.strip() for name in listed.group(1).split(",")}
    assert names == written, (sorted(names - written), sorted(written - names))


def test_the_architecture_layout_names_every_module_of_every_package():
    text = (DOCS / "architecture.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    sections, current = {}, None
    for line in block.splitlines():
        head = re.match(r"^(?:  )?([\w]+)/\s", line + " ")
        if head and not line.startswith("    "):
            current = ("mop_airflow/" if line.startswith("  ") else "") + head.group(1)
            sections[current] = ""
        if current:
            sections[current] += line + "\n"
    missing = []
    for folder in [*sorted((ROOT / "mop_airflow").glob("*/")), ROOT / "operators", ROOT / "slot_sim"]:
        if not folder.is_dir() or folder.name.startswith("__"):
            continue
        key = str(folder.relative_to(ROOT)).replace("\\", "/")
        said = sections.get(key, "")
        for module in sorted(folder.glob("*.py")):
            if module.name not in ("__init__.py", "__main__.py") and module.name not in said:
                missing.append(f"{key}/{module.name}")
    assert missing == []
    assert "package-dir" in text and "`mop_airflow.operators.*`" in text and "`mop_airflow.plugins.*`" in text


def test_the_reference_names_operators_and_plugins_as_they_are_imported():
    page = (DOCS / "reference" / "operators.md").read_text()
    headings = re.findall(r"^## `([\w.]+)`", page, re.M)
    assert headings and all(h.startswith("mop_airflow.operators.") for h in headings)
    assert "package-dir" in page and "from mop_airflow.operators.predict import MopPredictOperator" in page
    directives = re.findall(r"^::: ([\w.]+)$", page, re.M)
    assert directives and all(d.startswith("mop_airflow.operators.") for d in directives), directives
    for name in ("ShardPods", "run_layout", "predict", "champion_asset"):
        assert re.search(rf"^::: mop_airflow\.[\w.]+\.{name}$", (DOCS / "reference" / "python-api.md").read_text(), re.M)
    for page in pages():  # prose names them by their import path, never as a top-level package
        for match in re.finditer(r"`(operators|plugins)\.\w+", page.read_text()):
            raise AssertionError(f"{page.relative_to(ROOT)}: {match.group(0)}")


def test_the_operators_reference_is_rendered_under_their_import_paths(site):
    html = (site / "reference" / "operators" / "index.html").read_text()
    assert 'id="mop_airflow.operators.train.MopTrainShardOperator"' in html
    assert re.findall(r'id="(?:operators|plugins)\.[\w.]+"', html) == []


def test_the_task_group_example_runs_as_written(tmp_path, monkeypatch):
    blocks = [b for b in code_blocks(DOCS / "how-to" / "task-group.md", "python") if b.startswith("# dags/my_pipeline.py")]
    assert len(blocks) == 1
    monkeypatch.setenv("MOP_HOME", str(tmp_path / "home"))
    path = tmp_path / "my_pipeline.py"
    path.write_text(blocks[0])
    dag = runpy.run_path(str(path))["dag"]
    assert {"extract", "deploy", "model_selection.preflight", "model_selection.result"} <= set(dag.task_ids)
    assert [t for t in dag.task_ids if t.startswith("model_selection.train_shard_")]


def test_what_happens_when_is_a_short_table_whose_costs_link_to_their_rows():
    text = (DOCS / "what-happens-when.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| fault")]
    assert len(rows) >= 20
    long = [cell[:60] for line in rows for cell in line.strip("|").split(" | ") if len(cell.strip()) > 300]
    assert long == []
    performance = performance_rows()
    for line in rows:
        cost = line.strip().strip("|").split(" | ")[-1]
        if re.search(r"\d\s*s\b", cost) and "MOP_" not in cost and "store." not in cost:
            linked = ROW_LINK.findall(cost)
            assert linked and all(a in performance for a in linked), f"a cost without its row: {line[:80]}"


def test_make_clean_is_described_as_what_the_makefile_deletes():
    recipe = re.search(r"^clean:\n\trm -rf ([^\n]+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe
    deleted = recipe.group(1).split()
    readme = README.read_text()
    said = readme[readme.index("**`make clean` deletes"):][:600]
    assert all(f"`{path}`" in said for path in deleted), deleted
    assert "champion" in said and "store" in said


def test_the_troubleshooting_page_has_the_newcomers_cases_each_under_its_own_heading():
    headings = set(re.findall(r"^## (.+)$", (DOCS / "troubleshooting.md").read_text(), re.M))
    assert {"A task stays queued", "The GPU is not seen, or JAX and CUDA do not match", "Out of memory",
            "The DAG is paused"} <= headings


def test_the_changelog_has_one_fixed_and_one_performance_history_per_release():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.split(r"^## ", text, flags=re.M)[1:]
    assert len(releases) >= 2
    for release in releases:
        name = release.splitlines()[0]
        for heading in ("### Added", "### Changed", "### Fixed", "### Performance history"):
            assert len(re.findall(rf"^{heading}$", release, re.M)) <= 1, (name, heading)


def test_the_unreleased_changes_are_grouped_by_day_newest_first():
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## ", 1)[0]
    for heading in ("Fixed", "Added", "Changed"):
        section = unreleased.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
        days = re.findall(r"^#### (\d{4}-\d\d-\d\d)$", section, re.M)
        assert days and days == sorted(days, reverse=True) and len(set(days)) == len(days), (heading, days)
        assert section.lstrip().startswith("#### "), f"{heading}: entries before the first day"


def test_no_page_gives_two_headings_or_rows_one_anchor():
    """A link lands on one place: two sections named alike once gave the performance page two
    ``#slot-sim`` headings, and every link went to the first, whose rows were not the million's."""
    twice = []
    for page in [README, *pages()]:
        ids = re.findall(r'<a id="([\w-]+)"></a>', page.read_text())
        for line in page.read_text().splitlines():
            match = re.match(r"^#{1,6} (.*)$", line)
            if match:
                explicit = re.search(r"\{#([\w-]+)\}\s*$", match.group(1))
                ids.append(explicit.group(1) if explicit else slug(match.group(1)))
        twice += [f"{page.relative_to(ROOT)}: #{name}" for name in sorted(set(ids)) if ids.count(name) > 1]
    assert twice == []
