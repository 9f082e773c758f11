"""Third-party controllers beside the local control plane (`controller_homes` finds their
builds), and what their Deployments give their webhook servers in a cluster, made on loopback.

Kubeflow's training operator and Kueue both keep their webhook certificates with
open-policy-agent/cert-controller: a rotator reads a CA and a serving pair from a Secret,
expects the Secret mounted as files in a cert directory, and injects the CA into its webhook
configurations (and conversion CRDs). Here the pair is made beforehand, for the in-cluster
Service name and 127.0.0.1 (`certs.webhook_pki`), so the rotator keeps it, and every webhook
points at `https://127.0.0.1:<port><path>` instead of the Service.
"""

from __future__ import annotations

import base64
import functools
import json
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from mtrl_testbed import certs
from mtrl_testbed.ports import free_port

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "build-controllers.sh"


@functools.cache
def controller_homes() -> dict[str, Path]:
    """Each third-party controller's folder (`training-operator`, `kueue`), building them on
    first use (hack/build-controllers.sh prints `<name>=<folder>` lines)."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True)
    return {name: Path(path) for name, _, path in
            (line.partition("=") for line in out.stdout.splitlines()) if path}


class KubectlFn(Protocol):
    """LocalCluster.kubectl."""

    def __call__(self, *args: str, input: str | None = None, check: bool = True
                 ) -> subprocess.CompletedProcess[str]: ...


def apply(kubectl: KubectlFn, *objs: dict[str, Any]) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))


def install_secret(kubectl: KubectlFn, namespace: str, name: str, service: str,
                   ca_name: str) -> certs.WebhookPki:
    """The rotator's Secret, in its namespace (made if missing), with a pair it accepts."""
    dns = f"{service}.{namespace}.svc"
    pki = certs.webhook_pki(ca_name, [dns, f"{dns}.cluster.local"])
    if kubectl("get", "namespace", namespace, check=False).returncode:
        kubectl("create", "namespace", namespace)
    apply(kubectl, {"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": name, "namespace": namespace},
                    "data": {k: base64.b64encode(v).decode()
                             for k, v in pki.secret_data().items()}})
    return pki


def mount(directory: Path, pki: certs.WebhookPki) -> None:
    """The Secret's volume: the serving pair where the webhook server reads it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(pki.cert)
    (directory / "tls.key").write_bytes(pki.key)
    (directory / "tls.key").chmod(0o600)


def client_config(port: int, path: str, pki: certs.WebhookPki) -> dict[str, str]:
    return {"url": f"https://127.0.0.1:{port}{path}",
            "caBundle": base64.b64encode(pki.ca_cert).decode()}


@dataclass
class Controller:
    """A third-party controller beside one cluster: its files under `root`, its build in
    `home` (hack/build-controllers.sh), its webhook and health ports on loopback."""

    root: Path
    home: Path
    webhook_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)

    BINARY: ClassVar[str]  # its file name in `home`/bin

    @property
    def binary(self) -> Path:
        return self.home / "bin" / self.BINARY

    def ready(self) -> bool:
        """Its /readyz: controller-runtime's, which waits for the webhook server and certs."""
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
