"""The chart as installed by default: two replicas, one leader. The leader's container is
killed with SIGKILL; the standby takes over, and no run is provisioned twice: one trainer Job,
`maxReplicas` ECS tasks started, one set of queues and one task-definition revision per run.

The only value set is `watchNamespaces`, so that this release's operator leaves the other
tests' runs alone (they share the control plane); everything else is the chart's default.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from pathlib import Path

import boto3
import pytest

from mtrl_operator.naming import QUEUE_ROLES
from mtrl_testbed import census, replicas
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import EXECUTION_ROLE_ARN, MotoServer
from tests.operator.runs import HANG, apply, get, names_of, run_manifest, wait_for, wait_phase

CHART = Path(__file__).resolve().parents[2] / "charts" / "mtrl-operator"
SELECTOR = "app.kubernetes.io/name=mtrl-operator"
LEASE = "mtrl-operator-default"
pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]


def _leader_metric(pod: dict) -> float:
    """mtrl_leader from the pod's /metrics, on its pod IP and the chart's default port."""
    url = f"http://{pod['status']['podIP']}:8080/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    found = re.search(r"^mtrl_leader (\S+)$", text, re.M)
    assert found, text[:500]
    return float(found[1])


def _aws_counts(run: dict) -> tuple[int, int, int]:
    """(ECS tasks ever started, queues, task-definition revisions) of a run."""
    names = names_of(run, operator_id="default")
    ecs = boto3.client("ecs")
    started = sum(len(ecs.list_tasks(cluster="default", startedBy=names.started_by,
                                     desiredStatus=s)["taskArns"]) for s in ("RUNNING", "STOPPED"))
    found = census.run_aws(names)
    return started, len(found.get("queues", [])), len(found.get("task_definitions", []))


def _jobs(cluster: LocalCluster, run: dict) -> int:
    meta = run["metadata"]
    return len(json.loads(cluster.kubectl(
        "get", "jobs", "-n", meta["namespace"], "-l", f"mtrl.dev/run-uid={meta['uid']}",
        "-o", "json").stdout)["items"])


def test_default_install_fails_over_to_the_standby_without_double_provisioning(
        cluster: LocalCluster, moto_server: MotoServer, pods_reach_moto: None,
        aws_env: dict[str, str]) -> None:
    subnet, group = moto_server.prepare_fargate()
    suffix = uuid.uuid4().hex[:5]
    release_ns, runs_ns = f"mtrl-ha-{suffix}", f"ha-runs-{suffix}"
    cluster.kubectl("create", "namespace", runs_ns)
    cluster.helm("install", "mtrl-operator", str(CHART), "-n", release_ns, "--create-namespace",
                 "--wait", "--timeout", "300s", "--set-json", f'watchNamespaces=["{runs_ns}"]')
    try:
        pods = wait_for(lambda: (p := replicas.pods(cluster, release_ns, SELECTOR)) and
                        len(p) == 2 and all(replicas.ready(x) for x in p) and p, 120,
                        "two Ready replicas")
        leader = wait_for(lambda: replicas.holder_pod(cluster, release_ns, LEASE), 60,
                          "a Lease holder")
        by_name = {p["metadata"]["name"]: p for p in pods}
        assert set(by_name) >= {leader} and len({p["status"]["podIP"] for p in pods}) == 2
        assert {n: _leader_metric(p) for n, p in by_name.items()} == {
            n: 1.0 if n == leader else 0.0 for n in by_name}

        ecs_workers = {"backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1,
                       "maxReplicas": 2, "ecs": {"subnets": [subnet], "securityGroups": [group],
                                "executionRoleArn": EXECUTION_ROLE_ARN}}
        apply(cluster, runs_ns, run_manifest("before", workers=ecs_workers,
                                             trainer={"command": HANG}))
        wait_phase(cluster, runs_ns, "before", "Running", timeout=180)

        killed_at = time.monotonic()
        replicas.kill(cluster, release_ns, leader)
        apply(cluster, runs_ns, run_manifest("after", workers=ecs_workers,
                                             trainer={"command": HANG}))
        new_leader = wait_for(lambda: (h := replicas.holder_pod(cluster, release_ns, LEASE))
                              not in (None, leader) and h, 120, "the standby to take over",
                              interval=0.1)
        takeover = time.monotonic() - killed_at
        wait_phase(cluster, runs_ns, "after", "Running", timeout=180)
        print(f"\ntakeover by {new_leader} {takeover:.1f}s after SIGKILL (lease 15 s); the run "
              f"created at the kill Running after {time.monotonic() - killed_at:.1f}s")

        for name in ("before", "after"):
            run = get(cluster, runs_ns, name)
            assert run is not None
            assert (run["status"]["attempts"], _jobs(cluster, run), *_aws_counts(run)) == (
                1, 1, 2, len(QUEUE_ROLES), 1), name
        # The killed container is restarted by its kubelet (here the node agent) and stands by.
        wait_for(lambda: all(replicas.ready(p) for p in replicas.pods(
            cluster, release_ns, SELECTOR)) and replicas.holder_pod(
            cluster, release_ns, LEASE) == new_leader, 120, "the old leader to stand by")
        cluster.kubectl("delete", "mtrlruns", "--all", "-n", runs_ns, "--timeout=180s")
    finally:
        cluster.helm("uninstall", "mtrl-operator", "-n", release_ns, "--wait", "--timeout",
                     "300s", check=False)
        cluster.kubectl("delete", "namespace", runs_ns, release_ns, "--wait=false", check=False)
