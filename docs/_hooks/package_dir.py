"""A Griffe extension for the docs build: the operators and the results page's plugin are read where
they are installed, as ``mop_airflow.operators`` and ``mop_airflow.plugins``.

Their source sits in the top-level ``operators/`` and ``plugins/`` folders, which ``pyproject.toml`` maps
into the ``mop_airflow`` namespace with setuptools' ``package-dir``. Griffe reads source folders, not
that mapping, so without this it finds them only as top-level ``operators`` and ``plugins``, and the
reference would name and link them so. Once ``mop_airflow`` is loaded, each folder is loaded as a
package and attached to it as the member the installed package has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = {"operators": ROOT / "operators", "plugins": ROOT / "plugins"}


class PackageDir(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "mop_airflow":
            return
        for name, folder in PACKAGE_DIR.items():
            if name in pkg.members:
                continue
            module = griffe.load(folder, docstring_parser=loader.docstring_parser,
                                 docstring_options=loader.docstring_options, resolve_aliases=False)
            pkg.set_member(name, module)
