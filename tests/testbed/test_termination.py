"""A container killed by a signal is reported as a container runtime reports it: exit code
128 + N, and with FallbackToLogsOnError the tail of its log as the message (the kubelet's
getTerminationMessage). The operator turns both into the run's message."""

from __future__ import annotations

import json
import uuid

import pytest

from mtrl_testbed.cluster import LocalCluster
from tests.operator.runs import wait_for

DIE = ("import os, signal\nprint('about to die', flush=True)\n"
       "os.kill(os.getpid(), signal.SIGKILL)")


@pytest.mark.cluster
def test_a_container_killed_by_sigkill_exits_137_with_its_log_tail(cluster: LocalCluster) -> None:
    with cluster.namespace(f"kill-{uuid.uuid4().hex[:6]}") as ns:
        cluster.kubectl("create", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "killed", "namespace": ns},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "local",
                                     "terminationMessagePolicy": "FallbackToLogsOnError",
                                     "command": ["python", "-c", DIE]}]}}))

        def terminated() -> dict | None:
            out = cluster.kubectl("get", "pod", "killed", "-n", ns, "-o",
                                  "jsonpath={.status.containerStatuses[0].state.terminated}").stdout
            return json.loads(out) if out else None
        state = wait_for(terminated, 60, "the container to be reported terminated")
        assert state["exitCode"] == 137, state
        assert state["message"].strip() == "about to die", state
