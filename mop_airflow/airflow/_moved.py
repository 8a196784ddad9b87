"""The old import paths of modules that moved out of this package on 2026-12-06, kept where the
documentation published them (``mop_airflow.airflow.local``, ``.preload``, ``.shard_pods``): DAG files,
``airflow_local_settings.py`` files and environment files (``[core] hostname_callable``) written
before still work, and say where the module is now."""

from __future__ import annotations

import importlib
import sys
import warnings


def moved(old: str, new: str) -> None:
    """Make the module ``old``, being imported, the module ``new``, warning the importer with both names."""
    # stacklevel 3: past this function and the old module's body, to the file that imported it
    warnings.warn(f"{old} has moved: import {new} instead", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
