"""Hosts on one machine: network namespaces joined by a bridge, each with its own address, hostname,
/tmp and home, for tests/test_hosts.py and benchmarks/host_faults.py (both import this module).

Needs root and ``ip``, ``unshare``, ``mount``. A host is a network namespace with a veth pair into a
bridge that also has an address in the root namespace (so this process reaches every host, and the
hosts reach each other; nothing is routed anywhere else); every process of a host runs in a mount and
UTS namespace of its own (``unshare --mount --uts``) where its folder's ``home`` is ``/home``, its
``tmp`` is ``/tmp`` and one hosts file (every host's name and address, as a DNS would give them) is
``/etc/hosts``. A host shares no file with another: what they share goes over the network.

``ip link set <veth> down`` on the bridge side cuts a host off (:meth:`Host.cut`), ``up`` brings it
back. :meth:`Host.lose` kills every process in the host's namespace and removes its folder, as a
machine that goes away for good. :meth:`Hosts.close` (the context manager's exit) ends every process
of every host, deletes the namespaces, veths and the bridge, whatever happened before.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Mapping

BIN = Path(sys.executable).parent
# The hosts' user's home: /home is private to each host (not /root, where Python itself may be installed).
HOME = Path("/home/mop")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def can_make_hosts() -> str | None:
    """Why this machine cannot make hosts, or None when it can."""
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    missing = [tool for tool in ("ip", "unshare", "mount", "hostname", "runuser") if not shutil.which(tool)]
    if missing:
        return f"missing {', '.join(missing)}"
    probe = f"mhprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Host:
    """One machine: a network namespace, an address, a hostname and a folder of its own."""

    def __init__(self, hosts: "Hosts", name: str, index: int):
        self.hosts, self.name, self.index = hosts, name, index
        self.netns = f"{hosts.prefix}-{name}"
        self.address = f"{hosts.subnet}.{index}"
        self.veth = f"{hosts.prefix}v{index}"  # the bridge's side: down cuts the host off
        self.folder = hosts.base / "hosts" / name
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def home(self) -> Path:
        """What the host sees as its user's home, :data:`HOME` (its processes run with HOME set to it)."""
        return self.folder / "home" / HOME.name

    @property
    def tmp(self) -> Path:
        return self.folder / "tmp"

    def make(self) -> "Host":
        self.home.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.tmp.chmod(0o1777)  # as /tmp is: PostgreSQL's user writes there
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", f"{self.veth}p")
        _ip("link", "set", f"{self.veth}p", "netns", self.netns)
        _ip("link", "set", self.veth, "master", self.hosts.bridge, "up")
        inside = ("ip", "netns", "exec", self.netns, "ip")
        for args in (("link", "set", f"{self.veth}p", "name", "eth0"), ("addr", "add", f"{self.address}/24", "dev", "eth0"),
                     ("link", "set", "eth0", "up"), ("link", "set", "lo", "up")):
            subprocess.run([*inside, *args], check=True, capture_output=True)
        return self

    def _wrap(self, command: str) -> list[str]:
        """``command`` (a shell line) as a process of this host: its namespaces, /home, /tmp, hostname."""
        prelude = (f"hostname {self.name} && mount --bind {shlex.quote(str(self.hosts.hosts_file))} /etc/hosts && "
                   f"mount --bind {shlex.quote(str(self.home.parent))} {HOME.parent} && "
                   f"mount --bind {shlex.quote(str(self.tmp))} /tmp && cd {HOME} && {command}")
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--propagation", "private",
                "sh", "-c", prelude]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A fresh login's environment on this host (nothing of this process's Airflow settings)."""
        env = {"PATH": f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(HOME),
               "LANG": "C.UTF-8", "TF_CPP_MIN_LOG_LEVEL": "2"}
        if "MOP_SRC" in os.environ:  # the checkout under test, where the environment imports it from there
            env["MOP_SRC"] = os.environ["MOP_SRC"]
        env.update(extra or {})
        return env

    def run(self, command: str, *, timeout: float = 600, env: Mapping[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(self._wrap(command), env=self.env(env), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"on {self.name}: {command!r} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
        return done

    def spawn(self, label: str, command: str, env: Mapping[str, str] | None = None, setup: str = "") -> subprocess.Popen:
        """Start ``command`` in the background (after the shell line ``setup``), in a process group of its own; its log is
        ``<base>/logs/<host>-<label>.log`` (outside the host's folder: it outlives a lost host)."""
        log = self.hosts.base / "logs" / f"{self.name}-{label}.log"
        with open(log, "ab") as out:
            self.processes[label] = subprocess.Popen(self._wrap(f"{setup}exec {command}"), env=self.env(env), stdout=out,
                                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self.processes[label]

    def log(self, label: str) -> Path:
        return self.hosts.base / "logs" / f"{self.name}-{label}.log"

    def cut(self) -> None:
        _ip("link", "set", self.veth, "down")

    def restore(self) -> None:
        _ip("link", "set", self.veth, "up")

    def kill_all(self) -> None:
        """SIGKILL every process group this host started, then anything else left in its namespace."""
        for proc in self.processes.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pids = _ip("netns", "pids", self.netns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        for proc in self.processes.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.processes.clear()

    def lose(self) -> None:
        """The machine goes away for good: every process killed, its disk gone, its network gone."""
        self.kill_all()
        shutil.rmtree(self.folder, ignore_errors=True)
        self.remove_network()

    def remove_network(self) -> None:
        _ip("link", "del", self.veth, check=False)
        _ip("netns", "del", self.netns, check=False)


class Hosts:
    """``with Hosts(base) as hosts: control = hosts.add("control")``: hosts on a bridge of their own."""

    def __init__(self, base: Path, names: list[str] | tuple[str, ...] = ()):
        self.base = Path(base).absolute()
        tag = uuid.uuid4().hex[:4]
        self.prefix = f"mh{tag}"  # interface names are at most 15 characters
        self.bridge = f"{self.prefix}br"
        # a private /24 of its own: 10.(200..249).(0..255), drawn, and checked free below
        number = int(tag, 16)
        self.subnet = f"10.{200 + number % 50}.{(number // 50) % 256}"
        self.gateway = f"{self.subnet}.1"
        self.hosts: dict[str, Host] = {}
        self.hosts_file = self.base / "etc-hosts"
        self._names = list(names)

    def __enter__(self) -> "Hosts":
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        if self.subnet + "." in _ip("-4", "addr").stdout:
            raise RuntimeError(f"{self.subnet}.0/24 is in use on this machine; run again (another subnet is drawn)")
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        self.write_hosts_file(self._names)

    def write_hosts_file(self, names: list[str]) -> None:
        """Every host's name and address, written in place (the hosts bind-mount this very file)."""
        lines = ["127.0.0.1 localhost"] + [f"{self.subnet}.{10 + i} {name}" for i, name in enumerate(names)]
        self._names = list(names)
        with open(self.hosts_file, "w") as out:
            out.write("\n".join(lines) + "\n")

    def add(self, name: str) -> Host:
        """Make host ``name`` (one of the names given to the constructor: its address is fixed by them)."""
        index = 10 + self._names.index(name)
        host = Host(self, name, index)
        self.hosts[name] = host
        return host.make()

    def address(self, name: str) -> str:
        return f"{self.subnet}.{10 + self._names.index(name)}"

    def close(self) -> None:
        for host in list(self.hosts.values()):
            host.kill_all()
        for host in list(self.hosts.values()):
            host.remove_network()
        self.hosts.clear()
        _ip("link", "del", self.bridge, check=False)


def wait_port(address: str, port: int, timeout: float = 120, proc: subprocess.Popen | None = None,
              log: Path | None = None) -> None:
    """Until ``address:port`` accepts a connection (from this, the root namespace)."""
    import socket  # noqa: PLC0415

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"the process for {address}:{port} exited ({proc.returncode}):\n{tail}")
        try:
            with socket.create_connection((address, port), timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing answered on {address}:{port} within {timeout}s")
