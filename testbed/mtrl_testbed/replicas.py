"""The chart's operator replicas on the test bed: who holds the Lease, and killing a replica's
container the way a node failure or an OOM kill would (SIGKILL, no chance to release).

The node agent runs each container as a process and reports its PID as the container ID
(`process://<pid>`), where a kubelet reports the runtime's; restartPolicy Always then restarts
it, as a kubelet would.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from mtrl_testbed.cluster import LocalCluster


def lease(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "lease", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def holder_pod(cluster: LocalCluster, namespace: str, name: str) -> str | None:
    """The pod holding the Lease: its holder identity is `<pod name>_<random suffix>`."""
    found = lease(cluster, namespace, name)
    holder = ((found or {}).get("spec") or {}).get("holderIdentity") or ""
    return holder.rsplit("_", 1)[0] or None


def pods(cluster: LocalCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector,
                                           "-o", "json").stdout)["items"])


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def kill(cluster: LocalCluster, namespace: str, pod: str) -> int:
    """SIGKILL the pod's (first) container; returns the killed PID."""
    found = json.loads(cluster.kubectl("get", "pod", pod, "-n", namespace, "-o",
                                       "json").stdout)
    container_id = found["status"]["containerStatuses"][0]["containerID"]
    pid = int(container_id.removeprefix("process://"))
    os.kill(pid, signal.SIGKILL)
    return pid
