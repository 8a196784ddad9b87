"""Reference pages generated from the code, so they cannot drift from it.

An MkDocs hook (``hooks:`` in mkdocs.yml). A page holds a marker on a line of its own and the hook
puts the generated Markdown in its place:

- ``<!-- mop:spec -->``: every field of the spec's dataclasses (``dataclasses.fields()``: name,
  type, default) with its rule from the class docstring's ``Attributes:`` section;
- ``<!-- mop:space -->``: the keys of a search space's ``params`` and their defaults;
- ``<!-- mop:cli -->``: every command of ``mop-airflow``, walked from its argparse parser;
- ``<!-- mop:layers -->``: the layers of the package as ``tests/test_layers.py`` holds them.

A field without a description, or a marker the hook does not know, fails the build.

The Python API and operators pages are rendered by mkdocstrings from docstrings written with
reStructuredText roles (``:func:`x```, ``:class:`~x```); Markdown leaves the role's name as text
before the code span, so the hook writes each such role as plain code (:func:`roles_to_code`), as
:func:`_rst_to_md` does for the spec reference.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- mop:([a-z]+) -->$", re.MULTILINE)

# (section of the spec, class name), in the order a spec is written
SPEC_SECTIONS = [("", "MopSpec"), ("data", "DataSpec"), ("search", "SearchSpec"),
                 ("schedule", "ScheduleSpec"), ("store", "StoreSpec"), ("publish", "PublishSpec")]


class ReferenceError(Exception):
    """The code and its reference disagree: a field without a description, an unknown marker."""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rst_to_md(text: str) -> str:
    """The docstrings' reStructuredText roles and literals as Markdown code."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def docstring_parts(cls: type) -> tuple[str, dict[str, str]]:
    """A class docstring's prose and its ``Attributes:`` entries (name -> description)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    prose, _, attributes = doc.partition("\nAttributes:\n")
    entries: dict[str, str] = {}
    name = None
    for line in attributes.splitlines():
        match = re.match(r"^    (\w+): (.*)$", line)
        if match:
            name = match.group(1)
            entries[name] = match.group(2)
        elif name and line.startswith("        "):
            entries[name] += " " + line.strip()
        elif line.strip():
            name = None
    return prose.strip(), entries


def _default(spec_field: dataclasses.Field) -> str:
    if spec_field.default is not dataclasses.MISSING:
        return f"`{spec_field.default!r}`"
    if spec_field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = spec_field.default_factory()  # type: ignore[misc]
        return f"`{value!r}`" if isinstance(value, (dict, list, tuple)) else "see its section"
    return "required"


def spec_reference() -> str:
    """Every field of every spec section: name, type, default and rule."""
    from mop_airflow.config import spec as spec_module

    out = []
    for section, class_name in SPEC_SECTIONS:
        cls = getattr(spec_module, class_name)
        prose, entries = docstring_parts(cls)
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        missing = [name for name in names if name not in entries]
        extra = [name for name in entries if name not in names]
        if missing or extra:
            raise ReferenceError(f"{class_name}'s docstring (mop_airflow/config/spec.py) must describe every field "
                                 f"in its Attributes section: missing {missing}, not fields {extra}")
        title = f"`{section}`: `{class_name}`" if section else f"The whole spec: `{class_name}`"
        anchor = section or "spec"
        out += [f"## {title} {{#{anchor}}}", "", _rst_to_md(prose), "",
                "| field | type | default | rule |", "|---|---|---|---|"]
        for spec_field in dataclasses.fields(cls):
            if not spec_field.init:
                continue
            key = f"{section}.{spec_field.name}" if section else spec_field.name
            out.append(f"| `{key}` | `{_cell(str(spec_field.type))}` | {_default(spec_field)} | "
                       f"{_cell(_rst_to_md(entries[spec_field.name]))} |")
        out.append("")
    return "\n".join(out)


def space_reference() -> str:
    """The keys of ``search.space`` and of its ``params``, with their defaults."""
    from mop_airflow.search import space

    defaults = getattr(space, "_DEFAULTS", {})
    params = getattr(space, "_KEYS", ())
    out = ["| `search.space` key | default |", "|---|---|"]
    for spec_field in dataclasses.fields(space.SearchSpace):
        if spec_field.init and spec_field.name in space.SPACE_KEYS:
            out.append(f"| `{spec_field.name}` | {_default(spec_field)} |")
    out += ["", "| `search.space.params` key | default when left out |", "|---|---|"]
    for key in params:
        default = "required" if key == "model" else (f"`{defaults[key]!r}`" if key in defaults else "none")
        out.append(f"| `{key}` | {default} |")
    out += ["", "Optimizers: " + ", ".join(f"`{name}`" for name in space.OPTIMIZERS) + "."]
    return "\n".join(out) + "\n"


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps its sub-commands nowhere public
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name), sub


def _home(value: object) -> object:
    """Paths under the user's home folder as ``~/...``, as the help says them, not this machine's path."""
    home = os.path.expanduser("~")
    if not isinstance(value, str) or home == os.sep:
        return value
    return "~" if value == home else value.replace(home + os.sep, "~" + os.sep)


def _argument_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(action.option_strings) or action.metavar or action.dest
        if action.option_strings and action.nargs != 0:
            name += f" {action.metavar or action.dest.upper()}"
        if action.choices:
            name += " {" + ",".join(map(str, action.choices)) + "}"
        if action.required and action.option_strings:
            default = "required"
        elif not action.option_strings:
            default = "optional" if action.nargs == "?" else "required"
        elif action.nargs == 0:
            default = "off"
        else:
            default = "" if action.default is None else f"`{_home(action.default)}`"
        help_text = _home(parser._get_formatter()._expand_help(action)) if action.help else ""  # %(default)s as --help prints it
        rows.append(f"| `{_cell(name)}` | {default} | {_cell(help_text)} |")
    return rows


def cli_reference() -> str:
    """Every command of ``mop-airflow``, from the parser the command itself uses."""
    # the defaults the page shows are those of an unset environment (current names and the renamed ones)
    unset = ("MOP_HOME", "MOP_API_USER", "MOP_AIRFLOW_HOME", "MOP_AIRFLOW_API_USER")
    saved = {key: os.environ.pop(key) for key in unset if key in os.environ}
    try:
        from mop_airflow.cli.main import build_parser

        root = build_parser()
    finally:
        os.environ.update(saved)
    out = []

    def walk(parser: argparse.ArgumentParser, path: str, summary: str | None) -> None:
        subs = list(_subcommands(parser))
        if path:
            out.extend([f"### `{path}`", ""])
            if summary:
                out.extend([summary[0].upper() + summary[1:] + ".", ""])
            if parser.description and not subs:
                out.extend([_cell(parser.description), ""])
            usage = parser.format_usage().strip().removeprefix("usage: ")
            out.extend(["```text", usage, "```", ""])
            rows = _argument_rows(parser)
            if rows:
                out.extend(["| argument | default | meaning |", "|---|---|---|", *rows, ""])
        for name, help_text, sub in subs:
            walk(sub, f"{path} {name}".strip() if path else f"mop-airflow {name}", help_text)

    walk(root, "", None)
    return "\n".join(out)


def _layers() -> tuple[list[str], set[str]]:
    tree = ast.parse((ROOT / "tests" / "test_layers.py").read_text())
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("LAYERS", "BOUNDARY"):
                values[node.targets[0].id] = ast.literal_eval(node.value)
    return list(values["LAYERS"]), set(values["BOUNDARY"])


def layers_reference() -> str:
    """The layers, top first, with what each may import; read from tests/test_layers.py."""
    layers, boundary = _layers()
    out = ["| layer (top first) | may import mop_airflow's | may import Airflow |", "|---|---|---|"]
    for index in range(len(layers) - 1, -1, -1):
        name = layers[index]
        below = layers[:index]
        folder = f"`{name}/`" if name not in ("errors", "store") else f"`{name}.py`"
        out.append(f"| {folder} | itself" + (", " + ", ".join(f"`{b}`" for b in reversed(below)) if below else "")
                   + f" | {'yes' if name in boundary else 'no, not even inside a function'} |")
    return "\n".join(out) + "\n"


GENERATORS = {"spec": spec_reference, "space": space_reference, "cli": cli_reference, "layers": layers_reference}


CODE_SPAN = re.compile(r"`([^`]+)`")


def _split_piped_code(line: str) -> str:
    """In a table row, `a \\| b` as `a` \\| `b`: a code span shows an escaped pipe with its backslash."""
    def split(match: re.Match) -> str:
        parts = re.split(r"\s*\\\|\s*", match.group(1))
        return " \\| ".join(f"`{part}`" for part in parts if part)

    return CODE_SPAN.sub(lambda m: split(m) if "\\|" in m.group(1) else m.group(0), line)


def render(markdown: str) -> str:
    """The page with every marker replaced by its generated Markdown (and table cells' code tidied)."""
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ReferenceError(f"unknown marker <!-- mop:{name} -->: use one of {sorted(GENERATORS)}")
        return GENERATORS[name]()

    markdown = MARKER.sub(replace, markdown)
    return "\n".join(_split_piped_code(line) if line.startswith("|") else line for line in markdown.split("\n"))


# A role as Markdown renders it: its name as text, then its target as a code span. A leading ``~``
# (Sphinx's "show the last name only") is dropped and the whole name shown, as _rst_to_md does.
RENDERED_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:<code>~?([^<]*)</code>")


def roles_to_code(html: str) -> str:
    """``:func:<code>~a.b</code>``, a role Markdown rendered from a docstring, as ``<code>a.b</code>``."""
    return RENDERED_ROLE.sub(r"<code>\1</code>", html)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    return render(markdown)


def on_page_content(html: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    return roles_to_code(html)
