"""Every pod the operator creates is admitted in a namespace that enforces the "restricted" Pod
Security Standard: the API server's own PodSecurity admission judges each pod template, as
the pod a ReplicaSet, a Job, the training operator or HyperPod would make from it (a server-
side dry run, so nothing runs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_operator import launchers
from mtrl_operator.builders import workers
from mtrl_operator.builders.env import trainer_env, worker_env
from mtrl_operator.naming import RunNames
from mtrl_testbed.cluster import LocalCluster

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
SPEC = yaml.safe_load((REPO / "manifests" / "examples" / "wordle-hyperpod.yaml").read_text())
OWNER = {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun", "name": "run",
         "uid": "0f9e8d7c-1111-2222-3333-444455556666", "controller": True}
QUEUES = {role: f"https://sqs/{role}" for role in ("rollout", "result", "generate", "dlq")}


@pytest.fixture(scope="module")
def restricted(cluster: LocalCluster) -> Iterator[str]:
    with cluster.namespace("pss-restricted") as ns:
        cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
                        "pod-security.kubernetes.io/enforce-version=latest")
        cluster.kubectl("create", "serviceaccount", SPEC["spec"]["trainer"]["serviceAccountName"],
                        "-n", ns)
        yield ns


def pod_templates(namespace: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, pod template) for the workers and for each launcher's trainer pods."""
    names = RunNames(namespace, "run", OWNER["uid"])
    for launcher in ("Job", "PyTorchJob", "HyperPodPyTorchJob"):
        spec = MultiTurnRLRunSpec.model_validate(
            SPEC["spec"] | {"trainer": SPEC["spec"]["trainer"] | {"launcher": launcher}})
        env = trainer_env(names, spec, QUEUES, "us-west-2", attempt=1)
        for obj in launchers.build(names, spec, env, 1, OWNER):
            body = obj["spec"]
            if obj["kind"] == "Job":
                yield "Job", body["template"]
            for role, replica in (body.get("pytorchReplicaSpecs") or {}).items():
                yield f"PyTorchJob {role}", replica["template"]
            for replica in body.get("replicaSpecs") or []:
                yield "HyperPodPyTorchJob", replica["template"]
    spec = MultiTurnRLRunSpec.model_validate(
        SPEC["spec"] | {"workers": SPEC["spec"]["workers"] | {"backend": "kubernetes"}})
    deployment = workers.deployment(names, spec, worker_env(names, spec, QUEUES, "us-west-2"),
                                    OWNER)
    yield "worker Deployment", deployment["spec"]["template"]


def test_every_pod_the_operator_creates_is_admitted_under_restricted(
        cluster: LocalCluster, restricted: str) -> None:
    seen = []
    for i, (where, template) in enumerate(pod_templates(restricted)):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"pod-{i}", "namespace": restricted,
                            "labels": template["metadata"]["labels"]},
               "spec": template["spec"]}
        out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(pod),
                              check=False)
        assert out.returncode == 0, f"{where}: {out.stderr}"
        seen.append(where)
    assert seen == ["Job", "PyTorchJob Master", "PyTorchJob Worker", "HyperPodPyTorchJob",
                    "worker Deployment"]
