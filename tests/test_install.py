"""Every install line the pages give runs as written, from a copy of the checkout, in a fresh virtual
environment; the base install is the plugin and its runtime, without the test stack.

The fast tests read the pages and ``pyproject.toml``: each ``pip install`` of mop-airflow installs
from the checkout (the package is not on the index), each extra it names exists, and the base
dependencies name no test tool. The slow test (a quarter of an hour and more without a pip cache:
TensorFlow and Airflow are downloaded and resolved) upgrades pip, installs ``pip install .`` for
real, runs ``mop-airflow --help`` and checks that pytest, Playwright and moto are absent, then resolves every
other line with ``pip install --dry-run``, and builds the wheel with no setuptools warning.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIP_LINE = re.compile(r"(?:python -m )?pip install [^`\n]+")
TEST_STACK = ("pytest", "playwright", "moto")


def install_lines() -> dict[str, list[str]]:
    """Each distinct ``pip install ...`` command of the README and the docs pages, with the pages that
    give it. A line ends at a backtick, a comment or a shell separator; quotes are kept as written."""
    found: dict[str, list[str]] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for match in PIP_LINE.finditer(page.read_text()):
            line = re.split(r"\s+#|\s*(?:&&|;|\|)", match.group(0))[0].strip()
            if "${" in line:
                continue  # a Dockerfile's line quoted with its build arguments: tests/deploy builds the image
            found.setdefault(line, []).append(str(page.relative_to(ROOT)))
    return found


def requirements(line: str) -> list[str]:
    args = shlex.split(line)
    return [arg for arg in args[args.index("install") + 1:] if not arg.startswith("-")]


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_every_page_installs_mop_airflow_from_the_checkout_with_extras_that_exist():
    lines = install_lines()
    assert lines, "no page gives an install line"
    wrong = []
    for line, pages in lines.items():
        for requirement in requirements(line):
            name = re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
            if name == "mop-airflow":
                wrong.append(f"{line} ({', '.join(pages)}): mop-airflow is not on the index; install "
                             "from the checkout: pip install \".[extra]\"")
            elif name in (".", "./") or requirement.startswith(".["):
                named = re.findall(r"\[([^\]]*)\]", requirement)
                for extra in (named[0].split(",") if named else []):
                    if extra.strip() not in extras():
                        wrong.append(f"{line} ({', '.join(pages)}): no extra {extra!r} in pyproject.toml")
    assert wrong == []
    assert any(requirements(line) == ["."] for line in lines), "no page gives the base install, pip install ."


def test_the_base_install_names_no_test_tool_and_the_test_extra_does():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[\[<>=!~; ]", dep, maxsplit=1)[0] for dep in project["dependencies"]}
    assert base.isdisjoint(TEST_STACK + ("pytest-xdist", "hypothesis", "mkdocs"))
    test = {re.split(r"[\[<>=!~; ]", dep, maxsplit=1)[0] for dep in extras()["test"]}
    assert set(TEST_STACK) <= test
    assert {"celery", "gpu", "dashboard", "examples"} <= set(extras())
    assert any(dep.startswith("optuna-dashboard") for dep in extras()["dashboard"])
    assert any(dep.startswith("jax[cuda") for dep in extras()["gpu"])


def _run(cmd: str, cwd: Path, env_bin: Path, timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` in a shell with the virtual environment first on PATH (the user's other settings kept, as
    pip's configuration); on timeout the whole process group is stopped, pip included."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{env_bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    proc = subprocess.Popen(cmd, shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.skipif(not os.environ.get("MOP_TEST_INSTALL"), reason="a quarter of an hour and more: `make test-install`")
def test_each_page_install_line_runs_in_a_fresh_virtual_environment():
    # Not pytest's tmp_path: its numbered folders are pruned by every other pytest run on the machine,
    # and this test runs for many minutes.
    with tempfile.TemporaryDirectory(prefix="mop-install-") as tmp:
        _install_lines_run(Path(tmp))


def _install_lines_run(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"  # what a user clones: the tracked files, none of this tree's builds
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in filter(None, files.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
    bin_ = venv / "bin"

    built = _run(f"pip wheel --no-deps -v . -w {tmp_path / 'wheel'}", checkout, bin_, 900)
    assert built.returncode == 0, built.stderr[-3000:]
    noisy = [line for line in (built.stdout + built.stderr).splitlines()
             if re.search(r"SetuptoolsDeprecationWarning|BuildBackendWarning|would be ignored|as a TOML table",
                          line)]
    assert noisy == []
    wheel = next((tmp_path / "wheel").glob("mop_airflow-*.whl"))
    listing = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True)
    assert "mop_airflow/plugins/static/results.js" in listing.stdout

    lines = install_lines()
    upgrade = "python -m pip install --upgrade pip"  # the install section's first line: the venv's bundled pip
    assert upgrade in lines  # (23.x with Python 3.11) backtracked for more than 18 minutes over Airflow's tree
    assert _run(upgrade, checkout, bin_, 600).returncode == 0
    base = [line for line in lines if requirements(line) == ["."]]
    installed = _run(base[0], checkout, bin_, 3600)  # for real, as the page says (a pip cache makes it shorter)
    assert installed.returncode == 0, installed.stderr[-3000:]
    helped = _run("mop-airflow --help", tmp_path, bin_, 300)
    assert helped.returncode == 0 and "check" in helped.stdout, helped.stderr[-2000:]
    probe = _run("python -c \"import importlib.util as u; print([m for m in ('pytest', 'playwright', 'moto') "
                 "if u.find_spec(m)])\"", tmp_path, bin_, 120)
    assert probe.stdout.strip() == "[]", "the base install brought the test stack"

    # Every other line resolved, not installed: four at a time (pip mostly waits on the index), each in a copy
    # of the checkout of its own, since pip builds the project's metadata in its folder.
    others = [line for line in lines if line not in base and line != upgrade]

    def resolve(k: int, line: str) -> tuple[str, subprocess.CompletedProcess]:
        folder = shutil.copytree(checkout, tmp_path / f"checkout-{k}")
        return line, _run(line.replace("pip install", "pip install --dry-run --quiet", 1), folder, bin_, 900)

    with ThreadPoolExecutor(max_workers=4) as pool:
        resolved = list(pool.map(resolve, range(len(others)), others))
    failed = {line: done.stderr[-1500:] for line, done in resolved if done.returncode != 0}
    assert failed == {}
