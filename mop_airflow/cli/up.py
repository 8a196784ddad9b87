"""What ``mop-airflow up`` decides before it starts Airflow, without Airflow: who may reach it
(``--host``) and whether the example DAGs find their data (``--home``).

**Who may reach it.** On a loopback address (127.0.0.0/8, ``::1``, ``localhost``) only this machine
reaches the UI, and every visitor is an admin with no login, as ``airflow standalone`` does. Any
other address reaches a network (``0.0.0.0`` and ``::`` every interface): there the login is on
(Airflow's simple auth manager with every-visitor-an-admin off), as the user ``admin`` with a generated
password, printed when it is made and kept for the next start in the simple auth manager's passwords
file (mode 0600) under Airflow's home. So ``up`` never serves an open admin UI to a network.

**The example data.** The example DAGs (``dags/``, anything that imports ``mop_airflow.examples``)
read their data from ``$MOP_HOME/data``, which ``up`` sets to ``--home``. Where a DAG folder
holds such DAGs and the data is not there, ``up`` makes it (the examples extra's packages, once per
home), or says how to make it, instead of every example DAG failing in its first task.

It also holds the `up` and `example-data` commands.
"""

from __future__ import annotations

import argparse
import sys
import time
import importlib.util
import ipaddress
import json
import os
import re
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from mop_airflow.cli.runs import DEFAULT_PORT, FAILED, OK, UNAVAILABLE, USAGE, fail
from mop_airflow.hooks.rest import PASSWORD_ENV, PASSWORDS_FILE_NAME, USER_ENV

DEFAULT_HOST = "127.0.0.1"
WILDCARDS = ("0.0.0.0", "::")  # every interface: this machine's networks too
LOGIN_USER = "admin"  # the simple auth manager's admin ([core] simple_auth_manager_users = admin:admin)
EXAMPLES_MODULE = "mop_airflow.examples"
_IMPORTS_EXAMPLES = re.compile(rf"^\s*(from|import)\s+{re.escape(EXAMPLES_MODULE)}\b", re.MULTILINE)
# What `mop-airflow example-data` writes and the example DAGs read (mop_airflow/examples/*_data.py).
EXAMPLE_DATA = ("mnist1d_train.parquet", "mnist1d_test.parquet", "digits", "digit_images", "friedman")
EXAMPLES_EXTRA = ("mnist1d", "sklearn")  # what making the example data imports


def is_loopback(host: str) -> bool:
    """Whether only this machine reaches ``host``: a loopback address, or a name whose every address is
    one. ``0.0.0.0`` and ``::`` (every interface) are not, nor is any other address. A name that does
    not resolve is a :class:`ValueError` naming it."""
    name = host.strip().strip("[]")
    if name in WILDCARDS or not name:
        return False
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except socket.gaierror as exc:
        raise ValueError(f"--host {host}: no address of that name ({exc}). Fix: give an address of this machine, "
                         "e.g. 0.0.0.0 (every interface) or 127.0.0.1 (this machine only)") from exc
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def _in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class Access:
    """How ``up --host HOST`` serves Airflow: the settings its processes get (``env``), the address this
    machine's processes and commands use (``internal_url``), the one to open elsewhere (``url``), and the
    login where there is one."""

    host: str
    port: int
    env: dict[str, str] = field(default_factory=dict)
    internal_url: str = ""
    url: str = ""
    password: str | None = None  # the login's (user LOGIN_USER); None: no login, this machine only
    new_password: bool = False  # made now: printed this once
    passwords_file: Path | None = None

    @property
    def login(self) -> bool:
        return self.password is not None


def access(host: str, port: int, airflow_home: Path) -> Access:
    """The settings for serving on ``host``: the login on off the loopback address, its password kept in
    (or made into) ``airflow_home``'s simple auth manager passwords file."""
    host = host.strip().strip("[]")
    internal = DEFAULT_HOST if host in WILDCARDS else host  # every interface holds the loopback one
    internal_url = f"http://{_in_url(internal)}:{port}"
    env: dict[str, str] = {}
    if host != DEFAULT_HOST:
        env.update({
            "AIRFLOW__API__HOST": host,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{internal_url}/execution/",
            # where a browser finds the UI: this address, or on every interface whatever name it used
            "AIRFLOW__API__BASE_URL": "" if host in WILDCARDS else internal_url,
        })
    url = f"http://{_in_url(socket.gethostname() if host in WILDCARDS else host)}:{port}"
    if is_loopback(host):
        return Access(host, port, env, internal_url, url)
    passwords_file = Path(airflow_home) / PASSWORDS_FILE_NAME
    password, new = _keep_or_make_password(passwords_file)
    login = f"{quote(LOGIN_USER, safe='')}:{quote(password, safe='')}"
    env.update({
        # a network reaches it: the simple auth manager asks every visitor for the login
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{LOGIN_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file),
        # the same login for up's own calls, its pools sync, and the tasks' pool check (preflight)
        USER_ENV: LOGIN_USER,
        PASSWORD_ENV: password,
        "AIRFLOW_CONN_MOP_AIRFLOW_API": f"http://{login}@{_in_url(internal)}:{port}",
    })
    return Access(host, port, env, internal_url, url, password, new, passwords_file)


def _keep_or_make_password(passwords_file: Path) -> tuple[str, bool]:
    """The login's password the simple auth manager already has in ``passwords_file``, or a new one
    written there (mode 0600), and whether it is new."""
    passwords = json.loads(passwords_file.read_text() or "{}") if passwords_file.exists() else {}
    if passwords.get(LOGIN_USER):
        return passwords[LOGIN_USER], False
    passwords[LOGIN_USER] = secrets.token_urlsafe(16)
    passwords_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(passwords_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(passwords) + "\n")
    passwords_file.chmod(0o600)
    return passwords[LOGIN_USER], True


def login_lines(served: Access) -> list[str]:
    """What ``up`` says about who may reach it (the password only when it was just made)."""
    if not served.login:
        return [f"Airflow UI: {served.url}  (no login: only this machine reaches {served.host}, and there every "
                "visitor is an admin)"]
    lines = [f"Airflow UI: {served.url}  (reachable from the network on {served.host}: sign in as {LOGIN_USER})"]
    if served.new_password:
        lines.append(f"password of {LOGIN_USER}: {served.password}  (made now and shown this once; kept in "
                     f"{served.passwords_file})")
    else:
        lines.append(f"password of {LOGIN_USER}: the one shown when it was made, kept in {served.passwords_file}")
    lines.append(f"mop-airflow status and report from another shell: export {USER_ENV}={LOGIN_USER} "
                 f"{PASSWORD_ENV}=<the password>")
    return lines


def uses_example_data(dags_folder: Path) -> bool:
    """Whether a DAG file of the folder imports :mod:`mop_airflow.examples` (the example DAGs do, for
    their data's spec). A DAG that only names an example model by its import path (a string) reads
    its own data: making the example data for it cost a start half a minute."""
    for path in Path(dags_folder).rglob("*.py"):
        try:
            if _IMPORTS_EXAMPLES.search(path.read_text(errors="replace")):
                return True
        except OSError:
            continue
    return False


def missing_example_data(data_dir: Path) -> list[str]:
    """What the example DAGs read that is not in ``data_dir``."""
    return [name for name in EXAMPLE_DATA if not (Path(data_dir) / name).exists()]


def can_make_example_data() -> bool:
    """Whether the examples extra's packages (MNIST-1D's generator, scikit-learn) are installed."""
    return all(importlib.util.find_spec(name) is not None for name in EXAMPLES_EXTRA)


def make_example_data(directory: str | Path, num_samples: int = 20000) -> list[str]:
    """Write every example data set into ``directory``; a line per data set, saying where it is."""
    from mop_airflow.examples.mnist1d_data import write_mnist1d  # noqa: PLC0415
    from mop_airflow.examples.sklearn_data import write_digit_images, write_digits, write_friedman  # noqa: PLC0415

    directory = str(directory)
    out = write_mnist1d(directory, num_samples=num_samples)
    return [f"train: {out['train']}\nvalidation: {out['test']}",
            f"digits (8x8 images as a tensor column): {write_digits(directory)}",
            f"digit images (8x8 PNG files, a folder per class): {write_digit_images(directory)}",
            f"friedman (regression, CSV files): {write_friedman(directory)}"]


def example_data_lines(dags_folder: Path, home: Path, *, make: bool) -> list[str]:
    """What ``up`` says (and does) about the example data at start: nothing for a folder without
    example DAGs; where it is; or, where it is missing, that it makes it (``make`` and the examples
    extra installed) or how to make it."""
    if not uses_example_data(dags_folder):
        return []
    data = Path(home) / "data"
    missing = missing_example_data(data)
    if not missing:
        return [f"example data: {data}"]
    how = f"mop-airflow example-data --dir {data}"
    if make and can_make_example_data():
        lines = [f"the example DAGs read their data from {data}, which lacks {', '.join(missing)}: making it "
                 f"now (once for this home; `{how}` does the same)"]
        return lines + make_example_data(data)
    extra = "" if can_make_example_data() else ' (it needs the examples extra: pip install "mop-airflow[examples]")'
    return [f"the example DAGs read their data from {data}, which lacks {', '.join(missing)}: each one fails in "
            f"its first task until you make it with `{how}`{extra}"]


def add_commands(sub: argparse._SubParsersAction, home: str) -> None:
    up = sub.add_parser("up", help="run the DAGs of a folder on a local Airflow (SQLite, LocalExecutor) until Ctrl-C",
                        description="Start Airflow's api-server, scheduler and dag-processor with its home under "
                                    "the project home, make the example DAGs' data where the home lacks it, create "
                                    "the shard pools every mop_airflow DAG of the folder needs, print the UI's "
                                    "address (and, off the loopback address, its login), and stop everything on "
                                    "Ctrl-C.")
    up.add_argument("--dags-folder", required=True, help="the folder of your DAG files")
    up.add_argument("--home", default=home, help="the project home: Airflow's home, the store, the data and the logs "
                                                 "(default $MOP_HOME, else ~/mop_airflow: %(default)s)")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the UI and REST API port (default {DEFAULT_PORT})")
    up.add_argument("--host", default="127.0.0.1",
                    help="the address the UI and REST API listen on (default 127.0.0.1: this machine only, no login). "
                         "Any other than a loopback address, e.g. 0.0.0.0 (every interface) on a remote machine, "
                         "turns the login on: user admin, a generated password printed when it is made")
    up.add_argument("--no-example-data", action="store_true",
                    help="do not make the example DAGs' data where --home lacks it (say how to make it instead)")
    up.set_defaults(func=cmd_up)

    data = sub.add_parser("example-data", help="generate MNIST-1D, digits (Parquet and PNG folders) and Friedman #1 "
                                                "(offline)",
                          description="Write the example DAGs' data sets, made offline (the examples extra): "
                                      "MNIST-1D as Parquet, the digits as Parquet and as PNG folders, and Friedman #1 "
                                      "(regression, CSV). The example DAGs read them from $MOP_HOME/data.")
    data.add_argument("--dir", default=os.path.join(home, "data"),
                      help="the folder to write the data sets to (default: the project home's data/, %(default)s)")
    data.add_argument("--num-samples", type=int, default=20000,
                      help="MNIST-1D samples to generate, train and validation together (default %(default)s); "
                           "the other sets have fixed sizes")
    data.set_defaults(func=cmd_example_data)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether Airflow's api-server could listen on ``host``:``port``. It binds with SO_REUSEADDR (uvicorn
    does), so the check does too: the connections of an Airflow just stopped wait in TIME_WAIT for a minute
    and must not keep `up` from starting again, while a socket that really listens still refuses."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def cmd_up(args: argparse.Namespace) -> int:
    from mop_airflow.deployment import local  # noqa: PLC0415
    
    folder = Path(args.dags_folder).absolute()
    if not folder.is_dir():
        return fail(f"--dags-folder {args.dags_folder}: no such folder", USAGE)
    home = Path(args.home).absolute()
    host = args.host.strip().strip("[]")
    try:
        is_loopback(host)
    except ValueError as exc:
        return fail(str(exc), USAGE)
    bind = "127.0.0.1" if host in WILDCARDS else host
    if not port_free(0, bind):
        return fail(f"--host {args.host}: not an address of this machine. Fix: give one of its addresses, or 0.0.0.0 "
                     "for every interface", USAGE)
    if not port_free(args.port, bind):
        return fail(f"port {args.port} is in use on {args.host} (another Airflow?): pass --port with a free one",
                     UNAVAILABLE)
    served = access(host, args.port, home / "airflow")  # off the loopback address: the login on
    for line in example_data_lines(folder, home, make=not args.no_example_data):
        print(line)
    try:
        with local.LocalAirflow(home / "airflow", folder, port=args.port,
                                extra_env={"MOP_HOME": str(home), **served.env}) as af:
            sync = af.run_cli("mop-airflow", "pools", "sync", "--dags-folder", str(folder), check=False)
            print(sync.stdout.strip())
            if sync.stderr.strip():
                print(sync.stderr.strip()[-4000:], file=sys.stderr)
            (home / "airflow" / "api_url").write_text(af.base_url)
            print("")
            for line in login_lines(served):
                print(line)
            print(f"DAGs from {folder}; the store and logs under {home}")
            print("follow a run with: mop-airflow status DAG_ID; stop with Ctrl-C")
            while all(af.alive().values()):
                time.sleep(1)
            dead = [name for name, ok in af.alive().items() if not ok]
            return fail(f"{', '.join(dead)} stopped; see {af.home / 'logs'}", FAILED)
    except KeyboardInterrupt:
        print("\nstopped Airflow")
        return OK
    finally:
        (home / "airflow" / "api_url").unlink(missing_ok=True)


def cmd_example_data(args: argparse.Namespace) -> int:
    for line in make_example_data(args.dir, num_samples=args.num_samples):
        print(line)
    return OK
