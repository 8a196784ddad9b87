"""Containers for the deployment tests: podman as root, with runc, on the host's network.

Every container, image and volume folder made through :class:`Podman` is removed by :meth:`Podman.close`
(the fixtures call it whatever happens), and every name carries the session's prefix, so nothing is left
behind and nothing of anyone else's is touched. ``CONTAINERS_CONF`` points podman at a containers.conf
with ``default_ulimits = []``: the sandboxes these tests run in may not raise rlimits, which podman does
by default.

The images: :func:`build_images` builds Debian bookworm's minimal system with ``debootstrap``, imports it,
builds the stand-in for the official Airflow image on it (``tests/deploy/airflow_base``: no registry is
reachable here to pull ``apache/airflow``) and ``docker/worker.Dockerfile`` FROM that stand-in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO

BASE_CONTEXT = Path(__file__).with_name("airflow_base")
DEBIAN_PACKAGES = "python3,python3-venv,ca-certificates,dumb-init"
# The certificate authorities the host trusts, lent to the builds (read only): pip inside a build then
# reaches the package index as on the host, through a proxy with a certificate of its own too.
HOST_CA_BUNDLE = Path(os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")


def tools_missing() -> list[str]:
    return [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]


@dataclass
class Podman:
    """podman with the session's settings; what it makes is named ``<prefix>-...`` and removed by close."""

    workdir: Path
    prefix: str = field(default_factory=lambda: f"mop-deploy-{uuid.uuid4().hex[:6]}")
    containers: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.conf = self.workdir / "containers.conf"
        self.conf.write_text("[containers]\ndefault_ulimits = []\n")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def __call__(self, *args: str, check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run(["podman", "--runtime", "runc", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env, **kwargs)
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args[:3])}... exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done

    def build(self, tag: str, context: Path, dockerfile: Path, build_args: dict[str, str] | None = None,
              volumes: tuple[str, ...] = ()) -> float:
        """Build ``tag`` (removed by close); returns the seconds it took."""
        # --force-rm: a failed build's working containers go too (podman keeps them otherwise)
        args = ["build", "--force-rm", "--network", "host", "-t", tag, "-f", str(dockerfile)]
        for key, value in (build_args or {}).items():
            args += ["--build-arg", f"{key}={value}"]
        for volume in volumes:
            args += ["-v", volume]
        self.images.append(tag)
        start = time.monotonic()
        self(*args, str(context), timeout=3600)
        return time.monotonic() - start

    def run(self, name: str, image: str, args: list[str], *, entrypoint: list[str] | None = None,
            env: dict[str, str] | None = None, mounts: list[tuple[str, str]] = (), hostname: str | None = None,
            hosts: dict[str, str] | None = None, user: str | None = None, detach: bool = True,
            network: str = "host", aliases: tuple[str, ...] = (), timeout: float = 600) -> subprocess.CompletedProcess:
        """``podman run`` on the host's network (or ``network``, with DNS ``aliases``): ``entrypoint`` replaces
        the image's (a pod's ``command``), ``args`` its CMD (a pod's ``args``); mounts are (source, target)
        binds, a source without a slash a named volume of this session's."""
        full = f"{self.prefix}-{name}"
        self.containers.append(full)
        cmd = ["run", "--name", full, "--network", network]
        for alias in aliases:
            cmd += ["--network-alias", alias]
        cmd += ["-d"] if detach else []
        if hostname:
            cmd += ["--hostname", hostname]
        for host, address in (hosts or {}).items():
            cmd += ["--add-host", f"{host}:{address}"]
        if user:
            cmd += ["--user", user]
        env_file = self.workdir / f"{full}.env"  # values may hold newlines and quotes: a file, never argv
        env_file.write_text("".join(f"{k}={v}\n" for k, v in (env or {}).items() if "\n" not in v))
        cmd += ["--env-file", str(env_file)]
        for k, v in (env or {}).items():
            if "\n" in v:
                cmd += ["-e", f"{k}={v}"]
        for source, target in mounts:
            if "/" not in source:
                source = f"{self.prefix}-{source}"
                if source not in self.volumes:
                    self.volumes.append(source)
            cmd += ["-v", f"{source}:{target}"]
        if entrypoint is not None:
            cmd += ["--entrypoint", json.dumps(entrypoint)]
        return self(*cmd, image, *args, check=detach, timeout=timeout)

    def network(self, name: str) -> str:
        full = f"{self.prefix}-{name}"
        self.networks.append(full)
        self("network", "create", full)
        return full

    def exec(self, name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self("exec", f"{self.prefix}-{name}", *args, check=False, timeout=timeout)

    def running(self, name: str) -> bool:
        done = self("inspect", "-f", "{{.State.Running}}", f"{self.prefix}-{name}", check=False)
        return done.stdout.strip() == "true"

    def logs(self, name: str, tail: int = 60) -> str:
        done = self("logs", "--tail", str(tail), f"{self.prefix}-{name}", check=False)
        return done.stdout + done.stderr

    def close(self) -> None:
        if self.containers:  # in one call, which stops them side by side: one at a time took 73 s for compose's
            self("rm", "-f", "-i", "-t", "5", *reversed(self.containers), check=False)
        for volume in self.volumes:
            self("volume", "rm", "-f", volume, check=False)
        for network in self.networks:
            self("network", "rm", "-f", network, check=False)
        for tag in reversed(self.images):
            self("rmi", "-f", tag, check=False)
        for made in (self.containers, self.volumes, self.networks, self.images):
            made.clear()


def build_images(podman: Podman) -> dict[str, object]:
    """Debian's minimal system, the stand-in for apache/airflow on it, and docker/worker.Dockerfile FROM
    that: the product image's tag, the seconds each step took and the image's size."""
    timings = {}
    start = time.monotonic()
    rootfs = podman.workdir / "rootfs"
    done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={DEBIAN_PACKAGES}", "bookworm",
                           str(rootfs)], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    debian = f"localhost/{podman.prefix}-debian:bookworm"
    podman.images.append(debian)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    podman("import", "-", debian, stdin=tar.stdout, timeout=600)
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)
    timings["debian_s"] = time.monotonic() - start
    base = f"localhost/{podman.prefix}-airflow-base:latest"
    cas = build_volumes()
    timings["airflow_base_s"] = podman.build(base, BASE_CONTEXT, BASE_CONTEXT / "Dockerfile", {"DEBIAN_BASE": debian},
                                             volumes=cas)
    image = f"localhost/{podman.prefix}-worker:cpu"
    # The versions this test environment runs with, as the image's constraints (MOP_CONSTRAINTS): the image
    # gets the tested versions, and pip resolves Airflow's tree without searching through releases. Every
    # build downloads ~1.5 GB: podman 4.3 kept nothing in the Dockerfile's pip cache mount between builds here.
    constraints = podman.workdir / "constraints.txt"
    constraints.write_text(tested_versions())
    timings["worker_s"] = podman.build(image, REPO, REPO / "docker" / "worker.Dockerfile",
                                       {"BASE_IMAGE": base, "MOP_CONSTRAINTS": "/tmp/mop-constraints.txt",
                                        "JAX_PACKAGE": "jax"},  # the chart's shard workers run Keras on JAX
                                       volumes=(*cas, f"{constraints}:/tmp/mop-constraints.txt:ro"))
    size = podman("image", "inspect", "-f", "{{.Size}}", image).stdout.strip()
    return {"image": image, "debian": debian, "timings": timings, "size_bytes": int(size), "build_volumes": cas}


def built_line(built: dict) -> str:
    """What :func:`build_images` made, in a line: the image, its size and each step's seconds."""
    return (f"image {built['image']}: {built['size_bytes'] / 1e9:.2f} GB, built in "
            + ", ".join(f"{k} {v:.0f} s" for k, v in built["timings"].items()))


def build_volumes() -> tuple[str, ...]:
    """What every build borrows from the host: its certificate authorities, read only."""
    return (f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro",) if HOST_CA_BUNDLE.exists() else ()


def tested_versions() -> str:
    """``name==version`` of every distribution this Python has but the project itself."""
    from importlib.metadata import distributions  # noqa: PLC0415

    pins = {d.metadata["Name"].lower(): d.version for d in distributions() if d.metadata["Name"]}
    pins.pop("mop-airflow", None)
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="mop-deploy-"))
