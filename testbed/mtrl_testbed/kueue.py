"""Kueue (v0.17.0), the real one, on the local control plane: what HyperPod task governance
runs (docs/hyperpod.md).

`hack/build-controllers.sh` builds `kueue` from its Go module and renders its release manifests
(`config/default`, as its Makefile does). `LocalCluster(..., kueue=True)` installs the CRDs,
serves the webhooks over TLS on loopback and runs Kueue as a child of the cluster, with the
integrations this operator's trainers use (`batch/job`, `kubeflow.org/pytorchjob`).

What stands in for its Deployment:
- the Secret `kueue-system/kueue-webhook-server-cert`, with a pair its cert rotator keeps (see
  `webhooks`), mounted as files in a cert directory of this cluster's own (`webhook.certDir`);
- the five CRDs with a conversion webhook, and the mutating and validating webhook
  configurations, point at `https://127.0.0.1:<port>` with that CA (the rotator refuses to
  start while a conversion CRD has no client config). Only the webhooks of Kueue's own kinds and
  of the enabled integrations are installed: those of pods, Deployments, StatefulSets and the
  rest would put every pod in the cluster behind Kueue for nothing;
- a Configuration file: leader election off, health and webhook on 127.0.0.1, metrics off;
  `VisibilityOnDemand` off (its API server writes certificates outside any temporary folder).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mtrl_testbed import certs, webhooks

NAMESPACE = "kueue-system"
SECRET = "kueue-webhook-server-cert"
SERVICE = "kueue-webhook-service"
CA_NAME = "kueue-ca"  # pkg/util/cert/cert.go: caName
FRAMEWORKS = ("batch/job", "kubeflow.org/pytorchjob")
# The resources whose webhooks are installed: Kueue's own and the enabled integrations'.
WEBHOOK_RESOURCES = {("batch", "jobs"), ("kubeflow.org", "pytorchjobs")}


@dataclass
class Kueue(webhooks.Controller):
    BINARY = "kueue"
    home: Path = field(default_factory=lambda: webhooks.controller_homes()["kueue"])


    def _manifests(self) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all((self.home / "manifests.yaml").read_text()) if d]

    def crds(self, pki: certs.WebhookPki) -> list[dict[str, Any]]:
        out = []
        for doc in self._manifests():
            if doc["kind"] != "CustomResourceDefinition":
                continue
            crd = copy.deepcopy(doc)
            webhook = (crd["spec"].get("conversion") or {}).get("webhook")
            if webhook:
                webhook["clientConfig"] = webhooks.client_config(
                    self.webhook_port, webhook["clientConfig"]["service"]["path"], pki)
            out.append(crd)
        return out

    def webhook_configurations(self, pki: certs.WebhookPki) -> list[dict[str, Any]]:
        out = []
        for doc in self._manifests():
            if not doc["kind"].endswith("WebhookConfiguration"):
                continue
            config = copy.deepcopy(doc)
            config["webhooks"] = [w for w in config["webhooks"] if _ours(w)]
            for w in config["webhooks"]:
                w["clientConfig"] = webhooks.client_config(
                    self.webhook_port, w["clientConfig"]["service"]["path"], pki)
            out.append(config)
        return out

    def prepare(self, kubectl: webhooks.KubectlFn) -> certs.WebhookPki:
        self.root.mkdir(parents=True, exist_ok=True)
        pki = webhooks.install_secret(kubectl, NAMESPACE, SECRET, SERVICE, CA_NAME)
        webhooks.mount(self.root / "certs", pki)
        (self.root / "config.yaml").write_text(yaml.safe_dump({
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port,
                        "certDir": str(self.root / "certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE,
                                       "webhookSecretName": SECRET},
            "integrations": {"frameworks": list(FRAMEWORKS)},
        }))
        return pki

    def args(self) -> list[str]:
        return ["--config", str(self.root / "config.yaml"),
                "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info"]


def _ours(webhook: dict[str, Any]) -> bool:
    """A webhook for Kueue's own kinds or an enabled integration's."""
    return any(group == "kueue.x-k8s.io" or (group, resource) in WEBHOOK_RESOURCES
               for rule in webhook.get("rules") or []
               for group in rule.get("apiGroups") or []
               for resource in rule.get("resources") or [])
