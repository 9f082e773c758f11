"""Security contexts that satisfy the Pod Security Standard "restricted", for every pod the
operator creates, so runs work in namespaces labelled
`pod-security.kubernetes.io/enforce: restricted`.

"restricted" (https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted)
refuses a pod unless it runs as non-root, has the RuntimeDefault (or a Localhost) seccomp
profile, and each container forbids privilege escalation and drops ALL capabilities. GPU and
EFA devices need none of that: the NVIDIA and EFA device plugins hand their device nodes to the
container through the resources it requests (`nvidia.com/gpu`, `vpc.amazonaws.com/efa`), as in
the EKS user guide's EFA example, which requests them and sets no privilege (docs/security.md).
"""

from __future__ import annotations

from typing import Any

# The images' USER (images/*/Dockerfile). Set on the pod as well, so an image built with a
# root USER still starts (runAsNonRoot alone would refuse it) instead of failing the run.
NON_ROOT_UID = 65532


def pod_security_context() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
