"""PyTorchJob and HyperPodPyTorchJob launchers against the real API server with those kinds'
published (PyTorchJob) or reconstructed (HyperPodPyTorchJob, see tests/fixtures) CRDs. No
training operator runs here, so the test plays its status transitions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import apply, get, names_of, run_manifest, wait_clean, wait_for, wait_phase

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "thirdparty-crds"
pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]


@pytest.fixture(scope="module")
def launcher_crds(cluster: LocalCluster) -> None:
    cluster.install_crds(FIXTURES / "kubeflow.org_pytorchjobs.yaml")
    cluster.install_crds(FIXTURES / "sagemaker.amazonaws.com_hyperpodpytorchjobs.yaml")


def _set_conditions(cluster: LocalCluster, resource: str, namespace: str, name: str,
                    *types: str) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [{"type": t, "status": "True", "reason": t, "message": f"job {t.lower()}",
                   "lastTransitionTime": now, "lastUpdateTime": now} for t in types]
    cluster.kubectl("patch", resource, name, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"conditions": conditions}}))


def _workload(cluster: LocalCluster, resource: str, namespace: str) -> dict:
    def found() -> dict | None:
        items = json.loads(cluster.kubectl("get", resource, "-n", namespace, "-o",
                                           "json").stdout)["items"]
        return items[0] if items else None

    return wait_for(found, 60, f"a {resource} to be created")


@pytest.mark.parametrize(("launcher", "resource", "running", "done"), [
    ("PyTorchJob", "pytorchjobs.kubeflow.org", ("Created", "Running"),
     ("Created", "Succeeded")),
    ("HyperPodPyTorchJob", "hyperpodpytorchjobs.sagemaker.amazonaws.com",
     ("Created", "Running"), ("Created", "Completed")),
])
def test_launcher_lifecycle(cluster: LocalCluster, operator: OperatorProcess, namespace: str,
                            launcher_crds: None, launcher: str, resource: str,
                            running: tuple[str, ...], done: tuple[str, ...]) -> None:
    apply(cluster, namespace, run_manifest("gpu", trainer={
        "launcher": launcher, "gpusPerNode": 8, "efaPerNode": 32, "nodes": 2,
        "restrictedInstanceGroup": True}, scheduling={"queueName": "hyperpod-ns-a-localqueue"}))
    job = _workload(cluster, resource, namespace)
    meta = job["metadata"]
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "hyperpod-ns-a-localqueue"
    assert meta["ownerReferences"][0]["kind"] == "MultiTurnRLRun"
    if launcher == "PyTorchJob":
        assert meta["annotations"]["sagemaker.amazonaws.com/enable-job-auto-resume"] == "true"
        specs = job["spec"]["pytorchReplicaSpecs"]
        assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1
        pod = specs["Master"]["template"]["spec"]
    else:
        assert job["spec"]["runPolicy"]["jobMaxRetryCount"] == 3
        assert job["spec"]["replicaSpecs"][0]["replicas"] == 2
        pod = job["spec"]["replicaSpecs"][0]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] in (8, "8") and limits["vpc.amazonaws.com/efa"] in (32, "32")
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "node.kubernetes.io/instance-type", "operator": "In",
            "values": ["ml.p5.48xlarge"]} in terms
    assert any(t["key"] == "sagemaker.amazonaws.com/instance-group-type" for t in terms)
    assert {"key": "sagemaker.amazonaws.com/RestrictedNode", "operator": "Equal",
            "value": "Worker", "effect": "NoSchedule"} in pod["tolerations"]

    _set_conditions(cluster, resource, namespace, meta["name"], *running)
    wait_phase(cluster, namespace, "gpu", "Running")
    _set_conditions(cluster, resource, namespace, meta["name"], *done)
    run = wait_phase(cluster, namespace, "gpu", "Succeeded")
    wait_clean(cluster, names_of(run))
    gone = cluster.kubectl("get", resource, "-n", namespace, "-o", "name").stdout.strip()
    assert gone == ""


def test_restarting_then_failed_pytorchjob_is_retried(cluster: LocalCluster,
                                                     operator: OperatorProcess, namespace: str,
                                                     launcher_crds: None) -> None:
    resource = "pytorchjobs.kubeflow.org"
    apply(cluster, namespace, run_manifest("flaky-gpu", trainer={
        "launcher": "PyTorchJob", "gpusPerNode": 8}, lifecycle={"backoffLimit": 1}))
    first = _workload(cluster, resource, namespace)["metadata"]["name"]
    _set_conditions(cluster, resource, namespace, first, "Created", "Restarting")
    wait_for(lambda: (get(cluster, namespace, "flaky-gpu") or {}).get("status", {})
             .get("attempts") == 1, 10, "a Restarting job to stay the same attempt")
    _set_conditions(cluster, resource, namespace, first, "Created", "Failed")
    wait_for(lambda: (get(cluster, namespace, "flaky-gpu") or {}).get("status", {})
             .get("attempts") == 2, 60, "a second attempt")
    second = wait_for(lambda: [n for n in cluster.kubectl(
        "get", resource, "-n", namespace, "-o", "name").stdout.split() if not n.endswith(first)],
        60, "the second attempt's PyTorchJob")[0].split("/")[-1]
    _set_conditions(cluster, resource, namespace, second, "Created", "Succeeded")
    run = wait_phase(cluster, namespace, "flaky-gpu", "Succeeded")
    assert run["status"]["attempts"] == 2
    wait_clean(cluster, names_of(run))
