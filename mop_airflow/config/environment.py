"""The environment variables mop_airflow reads: one prefix, ``MOP_``, and one unit suffix, ``_SECONDS``.

Every reader asks :func:`env` for the current name. The names of earlier releases (:data:`RENAMED`:
``MOP_AIRFLOW_HOME`` and its kin, ``MOP_SLOT_WAIT_S``) are still read where the current name is
unset, with a warning naming the new one, so a deployment keeps working while its environment files
are updated.
docs/reference/environment.md lists every variable.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping

# current name -> the name an earlier release read
RENAMED = {
    "MOP_HOME": "MOP_AIRFLOW_HOME",
    "MOP_API_URL": "MOP_AIRFLOW_API_URL",
    "MOP_API_USER": "MOP_AIRFLOW_API_USER",
    "MOP_API_PASSWORD": "MOP_AIRFLOW_API_PASSWORD",
    "MOP_HOPS_PER_WORKER": "MOP_AIRFLOW_HOPS_PER_WORKER",
    "MOP_PRELOAD": "MOP_AIRFLOW_PRELOAD",
    "MOP_WORKER_NAME": "MOP_AIRFLOW_WORKER_NAME",
    "MOP_MIGRATED_DB_DIR": "MOP_AIRFLOW_MIGRATED_DB_DIR",
    "MOP_SLOT_WAIT_SECONDS": "MOP_SLOT_WAIT_S",
}
DEFAULT_HOME = "~/mop_airflow"

_warned: set[str] = set()
log = logging.getLogger(__name__)


def env(name: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of ``name`` (a current name), else of its earlier name with a warning, else ``default``.
    An empty value counts as unset, as everywhere in mop_airflow."""
    environ = os.environ if environ is None else environ
    value = environ.get(name)
    if value:
        return value
    old = RENAMED.get(name)
    value = environ.get(old) if old else None
    if not value:
        return default
    if old not in _warned:  # once per process: a task reads some variables on every hop
        _warned.add(old)
        message = f"the environment variable {old} is deprecated: set {name} instead (same value)"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        log.warning("%s", message)
    return value


def project_home(environ: Mapping[str, str] | None = None) -> str:
    """The project's folder, the same for DAG files, tasks and the command line: ``$MOP_HOME``, else
    ``~/mop_airflow`` (absolute, so that a task's working folder does not move it)."""
    return os.path.abspath(os.path.expanduser(env("MOP_HOME", environ=environ) or DEFAULT_HOME))
