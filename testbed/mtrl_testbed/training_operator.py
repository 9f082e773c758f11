"""Kubeflow's training operator (v1.9.3), the real one, on the local control plane.

`hack/build-controllers.sh` builds `training-operator.v1` from its Go module and copies the
CRDs of its standalone install. `LocalCluster(..., training_operator=True)` installs the
PyTorchJob CRD, serves the controller's validating webhook over TLS on loopback, and runs the
controller as a child of the cluster, with PyTorchJob as its only scheme.

What stands in for its Deployment (manifests/base/deployment.yaml in the module):
- the webhook's Secret `kubeflow/training-operator-webhook-cert` is made here, with a CA and a
  serving pair that its cert rotator accepts ("no cert refresh needed"), since the rotator's
  own pair would name only the in-cluster Service, and the API server calls 127.0.0.1;
- the Secret's volume mount: the serving pair is written where the webhook server reads it,
  `$TMPDIR/k8s-webhook-server/serving-certs` (controller-runtime's default, with TMPDIR set
  per cluster), and the rotator's fixed directory `/tmp/k8s-webhook-server/serving-certs`
  gets a copy only if it has none: the rotator only checks that `tls.crt` is there;
- the ValidatingWebhookConfiguration `validator.training-operator.kubeflow.org` points at
  `https://127.0.0.1:<port>/validate-kubeflow-org-v1-pytorchjob`. It is applied before the
  controller starts: the rotator reports ready only once it has injected its CA there
  (cert-controller's `ensureReady`), and the cluster waits for `/readyz` before any test
  creates a PyTorchJob;
- nothing replaces the worker's init container, which loops on `nslookup <job>-master-0`
  until the master's Service resolves: the node agent answers it as the cluster DNS would
  (`cluster_dns`, and `nslookup` in `podnet/bin`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from mtrl_testbed import certs, webhooks
from mtrl_testbed.ports import free_port

NAMESPACE = "kubeflow"
SECRET = "training-operator-webhook-cert"
SERVICE = "training-operator"
CA_NAME = "training-operator-ca"  # pkg/cert/cert.go: caName
WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"
ROTATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # pkg/cert/cert.go: certDir


@dataclass
class TrainingOperator(webhooks.Controller):
    """The files, ports and arguments of one training operator beside one cluster."""

    BINARY = "training-operator.v1"
    home: Path = field(default_factory=lambda: webhooks.controller_homes()["training-operator"])
    metrics_port: int = field(default_factory=free_port)

    @property
    def crd(self) -> Path:
        return self.home / "crds" / "kubeflow.org_pytorchjobs.yaml"

    @property
    def tmpdir(self) -> Path:
        return self.root / "tmp"

    def args(self, kubeconfig: Path) -> list[str]:
        return ["--kubeconfig", str(kubeconfig), "--enable-scheme=pytorchjob",
                "--metrics-bind-address", f"127.0.0.1:{self.metrics_port}",
                "--health-probe-bind-address", f"127.0.0.1:{self.health_port}",
                "--webhook-server-port", str(self.webhook_port), "--leader-elect=false",
                "--zap-log-level=info"]

    def env(self) -> dict[str, str]:
        return {"MY_POD_NAMESPACE": NAMESPACE, "TMPDIR": str(self.tmpdir)}

    def prepare(self, kubectl: webhooks.KubectlFn) -> certs.WebhookPki:
        """The Secret and the mounted serving pair, before the controller starts."""
        self.root.mkdir(parents=True, exist_ok=True)
        pki = webhooks.install_secret(kubectl, NAMESPACE, SECRET, SERVICE, CA_NAME)
        webhooks.mount(self.tmpdir / "k8s-webhook-server" / "serving-certs", pki)
        with contextlib.suppress(FileExistsError):  # another cluster's training operator
            ROTATOR_CERT_DIR.mkdir(parents=True, exist_ok=True)
            with open(ROTATOR_CERT_DIR / "tls.crt", "xb") as f:
                f.write(pki.cert)
        return pki

    def webhook_configuration(self, pki: certs.WebhookPki) -> dict[str, object]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIG},
            "webhooks": [{
                "name": "validator.pytorchjob.training-operator.kubeflow.org",
                "admissionReviewVersions": ["v1"],
                "clientConfig": webhooks.client_config(
                    self.webhook_port, "/validate-kubeflow-org-v1-pytorchjob", pki),
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "rules": [{"apiGroups": ["kubeflow.org"], "apiVersions": ["v1"],
                           "operations": ["CREATE", "UPDATE"], "resources": ["pytorchjobs"]}],
            }],
        }
