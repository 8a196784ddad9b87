"""The configuration of a CeleryExecutor deployment, as ``mop-airflow celery config`` writes it.

One environment file holds every setting the Airflow processes and the ``mop-airflow`` command need
(executor, metadata database, broker, result backend, the API server's address, the JWT secret
every process must share, the log servers' ``[api] secret_key``, the login the tasks use), so each
machine loads the same file before it starts ``airflow`` or ``mop-airflow``. Beside it: the preload
hook's ``airflow_local_settings.py`` and the simple auth manager's password file, seeded with a
generated password for the login.

A lost worker is bounded by these settings (checked in Airflow 3.3, its Celery provider 3.26,
Celery 5.6 and kombu 5.7, the first kombu whose sweep interval can be set; see docs/how-to/celery.md):

- ``[celery] task_acks_late = True`` and ``worker_prefetch_multiplier = 1`` (the provider's defaults,
  written out so nobody lowers them): a message is acknowledged when its task ends, and a worker
  reserves no message while all its processes are busy, so a queued task never waits behind a
  running one on a worker while another worker of the queue is free.
- ``[celery_broker_transport_options] visibility_timeout``: how long an unacknowledged message stays
  with the worker that took it. A worker killed with a task queued to it leaves the message
  unacknowledged in Redis; any worker's sweep (every ``unacked_restore_interval`` seconds, every
  sweep scanning with ``unacked_restore_throttle = 1``) puts it back on its queue once it is older
  than this. The provider's default is a day. A message of a task still running when it comes
  back is refused by Airflow's execution API (409, the task instance is running) and dropped by
  the provider without a result, so long tasks do not run twice.
- ``[scheduler] task_instance_heartbeat_timeout``: a task whose worker died stops heartbeating;
  after this the scheduler fails the try and Airflow's retries start it again (default 300 s).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from mop_airflow.errors import SpecError

ENV_FILE_NAME = "mop-celery.env"
API_USER = "admin"  # the simple auth manager's default user ([core] simple_auth_manager_users = admin:admin)

# The lost-worker settings (module docstring) and the bound they give.
VISIBILITY_TIMEOUT_S = 30
RESTORE_INTERVAL_S = 5
HEARTBEAT_TIMEOUT_S = 60
HEARTBEAT_DETECTION_S = 10
FIRST_RETRY_DELAY_MAX_S = 20  # the DAG's retry_delay of 10 s with backoff 2: Airflow waits 10-20 s before try 2
HAND_OFF_S = 25  # scheduler loop, the queue, a worker starting the task: a few seconds in tests/test_celery_howto.py
QUEUED_BOUND_S = VISIBILITY_TIMEOUT_S + RESTORE_INTERVAL_S + HAND_OFF_S  # 60 s
RUNNING_BOUND_S = HEARTBEAT_TIMEOUT_S + HEARTBEAT_DETECTION_S + FIRST_RETRY_DELAY_MAX_S + HAND_OFF_S  # 115 s
LOST_WORKER_BOUND_S = max(QUEUED_BOUND_S, RUNNING_BOUND_S)  # what the docs state: under 2 minutes


# A GPU worker's own environment, beside the deployment's: Keras on JAX (docs/how-to/gpu-workers.md).
GPU_WORKER_ENV = {"KERAS_BACKEND": "jax"}


def lost_worker_settings() -> dict[str, str]:
    """The settings that bound a lost worker (module docstring), as ``AIRFLOW__SECTION__KEY`` variables:
    the same for processes on machines and for the Helm chart's pods."""
    return {
        "AIRFLOW__CELERY__TASK_ACKS_LATE": "True",
        "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_S),
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__UNACKED_RESTORE_INTERVAL": str(RESTORE_INTERVAL_S),
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__UNACKED_RESTORE_THROTTLE": "1",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": str(HEARTBEAT_DETECTION_S),
    }


@dataclass(frozen=True)
class CeleryDeployment:
    """What a Celery deployment of mop_airflow is made of; :meth:`environment` is its configuration."""

    broker: str
    database: str
    api_url: str = "http://127.0.0.1:8080"
    airflow_home: str = "~/airflow"
    mop_home: str = "~/mop_airflow"
    dags_folder: str | None = None

    def __post_init__(self) -> None:
        if urlsplit(self.broker).scheme not in ("redis", "rediss"):
            raise SpecError("--broker", self.broker, "must be a Redis URL (redis:// or rediss://): the lost-worker "
                            "bound rests on Redis's visibility timeout",
                            "pass e.g. --broker redis://127.0.0.1:6379/0; for another broker write the "
                            "configuration by hand from docs/how-to/celery.md")
        scheme = urlsplit(self.database).scheme
        if not scheme.startswith(("postgresql", "mysql")):
            raise SpecError("--database", self.database, "must be a PostgreSQL or MySQL SQLAlchemy URL: the "
                            "CeleryExecutor cannot share a SQLite file between processes",
                            "pass e.g. --database postgresql+psycopg2://postgres@127.0.0.1:5432/airflow")
        api = urlsplit(self.api_url)
        if api.scheme not in ("http", "https") or not api.hostname:
            raise SpecError("--api-url", self.api_url, "must be the API server's http(s):// address as every worker "
                            "reaches it", "pass e.g. --api-url http://10.0.0.5:8080")
        for name in ("airflow_home", "mop_home", "dags_folder"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, os.path.abspath(os.path.expanduser(value)))
        if self.dags_folder is None:
            object.__setattr__(self, "dags_folder", os.path.join(self.airflow_home, "dags"))

    @property
    def port(self) -> int:
        api = urlsplit(self.api_url)
        return api.port or (443 if api.scheme == "https" else 80)

    @property
    def passwords_file(self) -> Path:
        return Path(self.airflow_home) / "simple_auth_manager_passwords.json.generated"

    def environment(self, *, jwt_secret: str, password: str, secret_key: str) -> dict[str, str]:
        """Every process's settings, as Airflow's ``AIRFLOW__SECTION__KEY`` variables and ours."""
        base = self.api_url.rstrip("/")
        api = urlsplit(base)
        login = f"{quote(API_USER, safe='')}:{quote(password, safe='')}"
        return {
            "AIRFLOW_HOME": self.airflow_home,
            "MOP_HOME": self.mop_home,
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__DAGS_FOLDER": self.dags_folder,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database,
            "AIRFLOW__CELERY__BROKER_URL": self.broker,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.database,
            **lost_worker_settings(),
            "AIRFLOW__API__BASE_URL": base,
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
            # Every process signs or checks the tasks' tokens with it: one secret for the deployment.
            "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
            # The API server signs its request for a task's log with it and the worker's log server checks
            # it: without one value on every machine each makes its own ([api] secret_key, random per
            # airflow.cfg), and a task's log cannot be read from another machine's UI or API.
            "AIRFLOW__API__SECRET_KEY": secret_key,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            # Several workers on one machine: MOP_WORKER_NAME=<name> tells them apart in the UI.
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "mop_airflow.deployment.local.worker_hostname",
            # The login of the tasks (preflight's pool check) and of `mop-airflow status` / `report`.
            "AIRFLOW_CONN_MOP_AIRFLOW_API": f"{api.scheme}://{login}@{api.netloc}{api.path}",
            "MOP_API_URL": base,
            "MOP_API_USER": API_USER,
            "MOP_API_PASSWORD": password,
        }


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of an environment file as :func:`write_config` writes it (``KEY=value``, shell-quoted)."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key] = shlex.split(value)[0] if value else ""
    return out


def _keep_or_make_password(passwords_file: Path) -> str:
    """The login's password: the one the simple auth manager already has for it, or a new one it will use."""
    passwords = json.loads(passwords_file.read_text() or "{}") if passwords_file.exists() else {}
    if API_USER not in passwords:
        passwords[API_USER] = secrets.token_urlsafe(16)
        passwords_file.parent.mkdir(parents=True, exist_ok=True)
        passwords_file.write_text(json.dumps(passwords) + "\n")
        passwords_file.chmod(0o600)
    return passwords[API_USER]


def write_config(deployment: CeleryDeployment, out: Path | None = None) -> list[str]:
    """Write the environment file (default ``$AIRFLOW_HOME/mop-celery.env``), the preload hook and the
    login's password; return a line per file saying what happened to it. An existing file's JWT secret,
    secret key and password are kept, so writing again does not sign out running processes."""
    from mop_airflow.deployment.preload import LOCAL_SETTINGS  # noqa: PLC0415

    home = Path(deployment.airflow_home)
    out = Path(out) if out else home / ENV_FILE_NAME
    previous = read_env_file(out) if out.exists() else {}
    password = _keep_or_make_password(deployment.passwords_file)
    env = deployment.environment(jwt_secret=previous.get("AIRFLOW__API_AUTH__JWT_SECRET") or secrets.token_hex(32),
                                 secret_key=previous.get("AIRFLOW__API__SECRET_KEY") or secrets.token_hex(32),
                                 password=password)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# A CeleryExecutor deployment of mop_airflow, written by `mop-airflow celery config`.",
             "# Load it before every `airflow` and `mop-airflow` command: set -a; . THIS_FILE; set +a",
             "# It holds a secret and a password: keep it readable by the deployment's user only."]
    out.write_text("\n".join(lines + [f"{key}={shlex.quote(value)}" for key, value in env.items()]) + "\n")
    out.chmod(0o600)
    done = [f"configuration: {out}", f"password of Airflow user {API_USER!r}: {deployment.passwords_file}"]
    settings = home / "config" / "airflow_local_settings.py"
    if not settings.exists():
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(LOCAL_SETTINGS)
        done.append(f"preload hook: {settings}")
    elif "preload_if_task_host" not in settings.read_text():
        done.append(f"preload hook: {settings} exists without it; add the two lines of docs/how-to/celery.md")
    else:
        done.append(f"preload hook: {settings} (already there)")
    Path(deployment.dags_folder).mkdir(parents=True, exist_ok=True)
    return done
