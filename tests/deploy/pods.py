"""The pods of a rendered Helm chart started as podman containers, as a kubelet would start them: each
container with its own ``command`` (the image's entrypoint replaced) and ``args`` (its CMD replaced), its
environment (values, ``$(VAR)`` references, the Secrets' keys), its mounts (ConfigMaps and Secrets as
files, every other volume a folder of its own), the pod's user and hostname; init containers first, each
to its end; then every probe command run in its container, as the kubelet runs it.

What differs from a cluster, because every container here shares the host's network (the metadata
database and the broker are the host's): a Service's name resolves to 127.0.0.1 (``--add-host``), and
the ports two pods of a cluster may both listen on (a worker's log server, a triggerer's) are given free
ones here, and Airflow takes a container's hostname for its name rather than the reverse lookup of its
address, which is every pod's here (:func:`host_network_env`).
"""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mop_airflow.deployment.local import free_port
from tests.deploy.podman import Podman

WORKLOADS = ("Deployment", "StatefulSet", "Job")
PROBE_COMMAND_TIMEOUT = 300
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class Pod:
    kind: str
    name: str  # the workload's
    spec: dict  # the pod template's spec

    @property
    def hostname(self) -> str:
        """A StatefulSet's first pod is <name>-0; the others get a name of this form too."""
        return f"{self.name}-0"

    def containers(self, init: bool = False) -> list[dict]:
        return self.spec.get("initContainers", []) if init else self.spec["containers"]


def pods(docs: list[dict]) -> list[Pod]:
    return [Pod(d["kind"], d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs if d["kind"] in WORKLOADS]


def secrets(docs: list[dict]) -> dict[str, dict[str, str]]:
    """Every Secret the chart renders, its keys decoded."""
    out = {}
    for doc in docs:
        if doc["kind"] == "Secret":
            data = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
            out[doc["metadata"]["name"]] = {**data, **(doc.get("stringData") or {})}
    return out


def config_maps(docs: list[dict]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"}


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes's ``$(VAR)`` in a value, a command or an argument: the variable's value where it is set."""
    return _REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def host_network_env(container: dict) -> dict[str, str]:
    """The ports two pods may both listen on, each a free one here; and a container's name for Airflow its
    hostname, which in a cluster the reverse lookup of its pod's address gives (module docstring)."""
    env = {"AIRFLOW__CORE__HOSTNAME_CALLABLE": "socket.gethostname"}
    line = " ".join(container.get("command", []) + container.get("args", []))
    if "celery worker" in line:
        env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(free_port())
    if "airflow triggerer" in line:
        env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"] = str(free_port())
    return env


@dataclass
class Cluster:
    """The rendered objects of one or more releases, started on ``podman``."""

    podman: Podman
    docs: list[dict]
    workdir: Path
    hosts: dict[str, str]  # Service names (and pod names) -> 127.0.0.1
    extra_secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # the user's own (kubectl create secret)
    started: dict[str, tuple[Pod, dict]] = field(default_factory=dict)  # container name -> its pod and spec

    def __post_init__(self) -> None:
        self.secrets = {**secrets(self.docs), **self.extra_secrets}
        self.config_maps = config_maps(self.docs)

    def env(self, container: dict, pod: Pod) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in container.get("env", []):
            source = item.get("valueFrom")
            if source is None:
                env[item["name"]] = expand(str(item.get("value", "")), env)
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = self.secrets.get(ref["name"], {}).get(ref["key"])
                if value is None:
                    assert ref.get("optional"), f"{pod.name}/{container['name']}: no Secret {ref['name']}/{ref['key']}"
                    continue
                env[item["name"]] = value
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                env[item["name"]] = {"metadata.name": pod.hostname, "status.podIP": "127.0.0.1",
                                     "metadata.namespace": "default"}.get(path, "")
            else:
                raise AssertionError(f"{pod.name}/{container['name']}: env {item['name']} from {source}: not handled")
        assert not container.get("envFrom"), f"{pod.name}/{container['name']}: envFrom not handled"
        return {**env, **host_network_env(container)}

    def mounts(self, container: dict, pod: Pod) -> list[tuple[str, str]]:
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        out = []
        for mount in container.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {"name": mount["name"]})  # else a volume claim template
            folder = self.workdir / "volumes" / pod.name / mount["name"]
            files = None
            if "configMap" in volume:
                files = self.config_maps[volume["configMap"]["name"]]
            elif "secret" in volume:
                files = self.secrets[volume["secret"]["secretName"]]
            if files is not None:
                folder.mkdir(parents=True, exist_ok=True)
                for key, text in files.items():
                    (folder / key).write_text(text)
                    (folder / key).chmod(0o644)
            elif not folder.exists():
                folder.mkdir(parents=True)
                subprocess.run(["chown", "50000:0", str(folder)], check=True)
            source = folder / mount["subPath"] if mount.get("subPath") else folder
            if not source.exists():  # as the kubelet does for a subPath the volume lacks: an empty folder
                source.mkdir(parents=True)
            out.append((f"{source}", f"{mount['mountPath']}{':ro' if mount.get('readOnly') else ''}"))
        return out

    def run(self, pod: Pod, container: dict, *, detach: bool) -> subprocess.CompletedProcess:
        env = self.env(container, pod)
        user = pod.spec.get("securityContext", {}).get("runAsUser")
        group = pod.spec.get("securityContext", {}).get("runAsGroup", 0)
        name = f"{pod.name}-{container['name']}"
        done = self.podman.run(
            name, container["image"], [expand(a, env) for a in container.get("args", [])],
            entrypoint=[expand(c, env) for c in container["command"]] if container.get("command") else None,
            env=env, mounts=self.mounts(container, pod), hostname=pod.hostname, hosts=self.hosts,
            user=f"{user}:{group}" if user is not None else None, detach=detach, timeout=900)
        if detach:
            self.started[name] = (pod, container)
        return done

    def start(self, pod: Pod) -> None:
        """The pod's init containers, each to its end, then its containers."""
        for container in pod.containers(init=True):
            done = self.run(pod, container, detach=False)
            assert done.returncode == 0, (f"{pod.name}/{container['name']} exited {done.returncode}:\n"
                                          + (done.stdout + done.stderr)[-3000:])
        for container in pod.containers():
            self.run(pod, container, detach=True)

    def probes(self) -> list[tuple[str, str, dict]]:
        """(container, probe kind, probe) of every started container."""
        return [(name, kind, container[kind]) for name, (_, container) in self.started.items()
                for kind in ("startupProbe", "livenessProbe", "readinessProbe") if kind in container]

    def probe_once(self, name: str, probe: dict) -> tuple[bool, str]:
        if "exec" in probe:
            # The probe's command must pass, not within the chart's timeoutSeconds: on a busy 2-core machine
            # an Airflow command takes a minute or more to import what it needs.
            try:
                done = self.podman.exec(name, *probe["exec"]["command"], timeout=PROBE_COMMAND_TIMEOUT)
            except subprocess.TimeoutExpired:
                return False, f"still running after {PROBE_COMMAND_TIMEOUT} s"
            return done.returncode == 0, (done.stdout + done.stderr)[-1500:]
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = get["port"]
            url = f"{get.get('scheme', 'HTTP').lower()}://127.0.0.1:{port}{get.get('path', '/')}"
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    return 200 <= response.status < 400, f"HTTP {response.status}"
            except OSError as exc:
                return False, f"{url}: {exc}"
        raise AssertionError(f"{name}: probe {probe}: not handled")

    def wait_for_probe(self, name: str, probe: dict, timeout: float) -> tuple[bool, str]:
        deadline = time.monotonic() + timeout
        while True:
            ok, said = self.probe_once(name, probe)
            if ok or time.monotonic() > deadline or not self.podman.running(name):
                return ok, said
            time.sleep(5)


def command_line(container: dict) -> str:
    return shlex.join(container.get("command", []) + container.get("args", []))
