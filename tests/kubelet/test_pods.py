"""Pods under a real kubelet (tests/kubelet/conftest.py): the worker image runs under the
restricted Pod Security profile as the chart and the operator set it, its logs come back
through `kubectl logs`, and an image that does not exist is reported as the kubelet reports it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from tests.kubelet.conftest import Node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

RESTRICTED = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
              "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}

# What the container proves about itself: its user, that its root is read-only, that it has
# no capabilities and runs under a seccomp filter, and that the worker's command runs.
PROBE = """
import os, subprocess
print("uid", os.getuid(), "gid", os.getgid())
try:
    open("/probe", "w")
except OSError as e:
    print("root write:", e.strerror)
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
print("CapEff", status["CapEff"].strip(), "Seccomp", status["Seccomp"].strip())
print(subprocess.run(["mtrl", "env", "list"], capture_output=True, text=True, check=True).stdout)
"""


@pytest.fixture
def restricted_namespace(real_node: Node) -> Iterator[str]:
    name = f"kubelet-{uuid.uuid4().hex[:6]}"
    with real_node.cluster.namespace(name):
        real_node.cluster.kubectl("label", "namespace", name,
                                  "pod-security.kubernetes.io/enforce=restricted")
        yield name


def _pod(name: str, image: str, command: list[str]) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                 "securityContext": {"runAsNonRoot": True,
                                     "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{"name": "main", "image": image, "command": command,
                                 "imagePullPolicy": "IfNotPresent",
                                 "securityContext": RESTRICTED}]}})


def test_the_worker_image_runs_restricted_to_completion(real_node: Node,
                                                         restricted_namespace: str) -> None:
    cluster, ns = real_node.cluster, restricted_namespace
    cluster.kubectl("apply", "-n", ns, "-f", "-",
                    input=_pod("probe", Node.image("worker"), ["python", "-c", PROBE]))
    cluster.kubectl("wait", "-n", ns, "pod/probe", "--timeout=100s",
                    "--for=jsonpath={.status.phase}=Succeeded")
    pod = json.loads(cluster.kubectl("get", "-n", ns, "pod/probe", "-o", "json").stdout)
    assert pod["spec"]["nodeName"] == real_node.node.name
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "Completed" and terminated["exitCode"] == 0
    assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert pod["status"]["podIP"].startswith("10.88."), pod["status"]  # the CNI bridge's
    wide = cluster.kubectl("get", "-n", ns, "pod/probe", "-o", "wide").stdout
    assert "Completed" in wide, wide
    logs = cluster.kubectl("logs", "-n", ns, "probe").stdout
    assert "uid 65532 gid 65532" in logs, logs
    assert "root write: Read-only file system" in logs, logs
    assert "CapEff 0000000000000000 Seccomp 2" in logs, logs  # 2: a seccomp filter
    assert "coding" in logs, logs  # `mtrl env list` ran


def test_an_image_that_does_not_exist_is_reported_by_the_kubelet(
        real_node: Node, restricted_namespace: str) -> None:
    cluster, ns = real_node.cluster, restricted_namespace
    image = "registry.invalid/mtrl/no-such-image:1"
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=_pod("missing", image, ["true"]))
    cluster.kubectl("wait", "-n", ns, "pod/missing", "--timeout=120s",
                    "--for=jsonpath={.status.containerStatuses[0].state.waiting.reason}"
                    "=ImagePullBackOff")
    pod = json.loads(cluster.kubectl("get", "-n", ns, "pod/missing", "-o", "json").stdout)
    assert pod["status"]["phase"] == "Pending"
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert image in waiting["message"], waiting
    events = cluster.kubectl("get", "events", "-n", ns, "--field-selector",
                             "involvedObject.name=missing", "-o", "json").stdout
    reasons = {(e["reason"], e["source"].get("component")) for e in json.loads(events)["items"]}
    assert ("Failed", "kubelet") in reasons, reasons  # ErrImagePull, in the kubelet's words
    failed = [e["message"] for e in json.loads(events)["items"] if e["reason"] == "Failed"]
    assert any(image in m for m in failed), failed
