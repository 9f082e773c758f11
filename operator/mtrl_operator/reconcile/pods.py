"""What a pod says about itself, in the kubelet's and the scheduler's words. Pure; shared by
the trainer's pods and the workers' (the same kubelet tells both)."""

from __future__ import annotations

from typing import Any

# A container the kubelet cannot start, and will not start until something changes: its
# image, a Secret or ConfigMap it names, its command (kubelet's container waiting reasons,
# pkg/kubelet/images/types.go and pkg/kubelet/kuberuntime).
CANNOT_START = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull",
                "CreateContainerConfigError", "CreateContainerError", "RunContainerError")


def bound(pod: dict[str, Any]) -> bool:
    """The scheduler bound the pod to a node, and it has not finished: it holds that node
    (and its GPUs), whether its containers run or not."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def cannot_start(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, the kubelet's message) of the pod's first container, init containers first,
    that is waiting for a reason it will not get past alone."""
    status = pod.get("status") or {}
    for container in [*(status.get("initContainerStatuses") or []),
                      *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CANNOT_START:
            return waiting["reason"], " ".join((waiting.get("message") or "").split())
    return None


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's words when it cannot place the pod ("0/12 nodes are available: ...")."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                and condition.get("reason") == "Unschedulable":
            return (condition.get("message") or "").strip()
    return None
