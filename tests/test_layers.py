"""The house's rules, checked on every module of the package (no hand-written list to fall behind).

The core walks one way: errors and the store at the bottom, then spec, records, search and plan,
data, training, results, serving; Airflow's side (hooks, following a run, operators, the deployment
tooling, the DAG factory, the results page) sits on top of it, the command line on top of all. A
module may import its own layer and the layers below, never one above, so there is no import circle
between folders; and nothing below the Airflow boundary imports Airflow, not even inside a function.
The deployment tooling (the embedded Airflow, Celery, Helm, Kubernetes, the preload hook) sits below
the DAG factory, which takes its ShardPods, and above everything else: it may use the core, and the
core, the operators and the hooks never import it.
"""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Lowest first. docs/architecture.md's table of the layers is generated from this list.
LAYERS = ["errors", "store", "search", "config", "records", "planning", "data", "training", "slots", "results", "serving",
          "examples", "hooks", "monitor", "operators", "deployment", "airflow", "plugins", "cli"]
# the only layers that may import Airflow
BOUNDARY = {"hooks", "monitor", "operators", "deployment", "airflow", "plugins", "cli"}


def package_files():
    """Every module file of the installed package, with its dotted name and its layer."""
    places = [(ROOT / "mop_airflow", "mop_airflow"), (ROOT / "operators", "mop_airflow.operators"),
              (ROOT / "plugins", "mop_airflow.plugins")]
    for folder, package in places:
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if name == "mop_airflow":
                continue  # the package's front door: its lazy build_mop_dag / MopTaskGroup are the DAG factory's
            yield path, name, name.split(".")[1]


def imports_of(path):
    """(line, imported module) for every import in the file, at any depth (lazy ones included)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def test_every_module_is_in_a_known_layer():
    unknown = sorted({name for _, name, layer in package_files() if layer not in LAYERS})
    assert unknown == [], f"add these to LAYERS (and the README's table): {unknown}"


def test_no_module_below_the_airflow_boundary_imports_airflow_even_lazily():
    found = [f"{path.relative_to(ROOT)}:{line} imports {module}"
             for path, _, layer in package_files() if layer not in BOUNDARY
             for line, module in imports_of(path) if module == "airflow" or module.startswith("airflow.")]
    assert found == []


def test_imports_only_go_to_the_same_layer_or_below():
    upward = []
    for path, _, layer in package_files():
        for line, module in imports_of(path):
            parts = module.split(".")
            if parts[0] != "mop_airflow" or len(parts) < 2:
                continue
            target = parts[1]
            if LAYERS.index(target) > LAYERS.index(layer):
                upward.append(f"{path.relative_to(ROOT)}:{line} ({layer}) imports {module} ({target})")
    assert upward == []


def test_no_import_circle_between_modules():
    names = {name for _, name, _ in package_files()}
    graph = {}
    for path, name, _ in package_files():
        targets = set()
        for _, module in imports_of(path):
            while module and module not in names:  # `from a.b import name` names module a.b
                module = module.rpartition(".")[0]
            if module and module != name:
                targets.add(module)
        graph[name] = targets
    state, circles = {}, []

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_importing_the_whole_core_loads_no_airflow():
    core = sorted(name for _, name, layer in package_files() if layer not in BOUNDARY)
    assert len(core) > 50  # the walk found the package
    code = (f"import sys, importlib\nfor m in {core!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1] == "[]"


# Modules moved out of the DAG factory's package whose old paths the docs published (and deployments
# wrote: airflow_local_settings.py, [core] hostname_callable): old path -> the module now.
MOVED = {"mop_airflow.airflow.local": "mop_airflow.deployment.local",
         "mop_airflow.airflow.preload": "mop_airflow.deployment.preload",
         "mop_airflow.airflow.shard_pods": "mop_airflow.deployment.shard_pods"}


def test_an_old_published_path_gives_the_moved_module_and_warns_the_file_that_imports_it():
    code = ("import importlib, warnings\n"
            "warnings.simplefilter('always')\n"
            f"for old, new in {MOVED!r}.items():\n"
            "    with warnings.catch_warnings(record=True) as caught:\n"
            "        exec(f'import {old}')\n"  # an import statement, as in a DAG file or the settings file
            "    assert importlib.import_module(old) is importlib.import_module(new), old\n"
            "    [w] = caught\n"
            "    assert w.category is DeprecationWarning and new in str(w.message) and w.filename == '<string>', w\n"
            "from mop_airflow.airflow.preload import preload_if_task_host\n"
            "from mop_airflow.deployment.local import worker_hostname\n"
            "assert importlib.import_module('mop_airflow.airflow.local').worker_hostname is worker_hostname\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "ok", out.stderr[-2000:]
