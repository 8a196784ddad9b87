"""docker/docker-compose.yaml read as Compose reads it (YAML anchors and merge keys, ``${VAR:-default}``
and ``${VAR:?message}``), and its services started with podman as Compose would start them: a network
of their own on which each service's name resolves to it, each container with the service's command,
environment and volumes (``./dags`` a bind of the compose file's folder, a named volume one of the
session's), in the order its ``depends_on`` gives; ``service_healthy`` waits for the healthcheck's
command, ``service_completed_successfully`` for the container's end.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import yaml

from tests.deploy.podman import Podman

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\?)([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        name, how, rest = match.groups()
        if env.get(name):
            return env[name]
        if how == ":?":
            raise AssertionError(f"the compose file needs {name}: {rest}")
        return rest or ""

    return _VARIABLE.sub(one, text)


def services(compose_file: Path, env: dict[str, str]) -> dict[str, dict]:
    return yaml.safe_load(interpolate(compose_file.read_text(), env))["services"]


def command(service: dict) -> list[str]:
    given = service.get("command", [])
    return shlex.split(given) if isinstance(given, str) else [str(part) for part in given]


def start_order(all_services: dict[str, dict]) -> list[str]:
    """Every service after those it depends on (profiles left out, as `compose up` leaves them)."""
    order: list[str] = []
    active = {name for name, s in all_services.items() if not s.get("profiles")}

    def visit(name: str) -> None:
        if name in order:
            return
        for needed in all_services[name].get("depends_on") or {}:
            visit(needed)
        order.append(name)

    for name in sorted(active):
        visit(name)
    return order


class Compose:
    """The compose file's services on ``podman``; ``images`` maps a service to the image it runs (the
    built one, or a stand-in where the file's image cannot be pulled here)."""

    def __init__(self, podman: Podman, compose_file: Path, all_services: dict[str, dict], images: dict[str, str]):
        self.podman, self.folder, self.services, self.images = podman, compose_file.parent, all_services, images
        self.network = podman.network("compose")

    def mounts(self, service: dict) -> list[tuple[str, str]]:
        out = []
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                source = str((self.folder / source).resolve())
            out.append((source, target))
        return out

    def run(self, name: str, args: list[str] | None = None, *, detach: bool = True, entrypoint=None):
        service = self.services[name]
        return self.podman.run(name, self.images[name], command(service) if args is None else args,
                               entrypoint=entrypoint, env={k: str(v) for k, v in (service.get("environment") or {}).items()},
                               mounts=self.mounts(service), hostname=name, network=self.network, aliases=(name,),
                               detach=detach, timeout=1800)

    def healthy(self, name: str, timeout: float = 300) -> None:
        test = self.services[name]["healthcheck"]["test"]
        argv = test[1:] if test[0] == "CMD" else ["sh", "-c", test[1]]
        deadline = time.monotonic() + timeout
        while True:
            done = self.podman.exec(name, *argv)
            if done.returncode == 0:
                return
            assert self.podman.running(name), f"{name} stopped:\n{self.podman.logs(name)}"
            assert time.monotonic() < deadline, (f"{name} never healthy: {argv} exited {done.returncode}: "
                                                 f"{(done.stdout + done.stderr)[-1500:]}\n{self.podman.logs(name)}")
            time.sleep(3)
