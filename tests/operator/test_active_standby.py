"""Two operator processes with one operator id: one leads, the other stands by and does
nothing; SIGKILL the leader and the standby takes over, without provisioning anything twice.

The replicas are real `mtrl operator` processes against the local API server and moto; the
Lease is a real `coordination.k8s.io/v1` Lease (the test bed's lease timings are in
`mtrl_testbed.operator.TEST_DEFAULTS`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
import uuid
from collections.abc import Callable

import boto3
import pytest

from mtrl_testbed import chart_identity
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import (
    HANG,
    apply,
    get,
    names_of,
    run_manifest,
    wait_clean,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]
ECS_WORKERS = {"backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1,
               "maxReplicas": 2}


def _health(proc: OperatorProcess) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.health_port}/healthz",
                                    timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def _metric(proc: OperatorProcess, name: str, labels: str = "") -> float:
    """The sum of a metric over the label sets that contain `labels`, from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics",
                                timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(m[2]) for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M)
               if labels in (m[1] or ""))


def _created(proc: OperatorProcess, kind: str = "") -> float:
    return _metric(proc, "mtrl_resources_created_total", f'kind="{kind}"' if kind else "")


def _started_tasks(run: dict) -> int:
    names = names_of(run, operator_id="ha")
    ecs = boto3.client("ecs")
    return sum(len(ecs.list_tasks(cluster="default", startedBy=names.started_by,
                                  desiredStatus=status)["taskArns"])
               for status in ("RUNNING", "STOPPED"))


def _task_definitions(run: dict) -> list[str]:
    family = names_of(run, operator_id="ha").task_family
    ecs = boto3.client("ecs")
    return [arn for status in ("ACTIVE", "INACTIVE") for arn in ecs.list_task_definitions(
        familyPrefix=family, status=status)["taskDefinitionArns"]]


def _trainers(cluster: LocalCluster, namespace: str, run: dict) -> list[str]:
    items = json.loads(cluster.kubectl(
        "get", "jobs", "-n", namespace, "-l", f"mtrl.dev/run-uid={run['metadata']['uid']}",
        "-o", "json").stdout)["items"]
    return [i["metadata"]["name"] for i in items]


def test_the_standby_takes_over_from_a_killed_leader_without_doing_anything_twice(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess]) -> None:
    namespace = f"ha-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    env = {"MTRL_OPERATOR_ID": "ha", "MTRL_NAMESPACES": namespace,
           "MTRL_SWEEP_INTERVAL_SECONDS": "5"}
    replicas = [operator_factory(MTRL_POD_NAME="replica-a", **env),
                operator_factory(MTRL_POD_NAME="replica-b", **env)]
    try:
        wait_for(lambda: all(_health(p) for p in replicas), 60, "both replicas to answer")
        leaders = wait_for(lambda: [p for p in replicas if (_health(p) or {}).get("leader")],
                           60, "a leader")
        assert len(leaders) == 1, [_health(p) for p in replicas]
        (leader,) = leaders
        (standby,) = [p for p in replicas if p is not leader]
        lease = json.loads(cluster.kubectl("get", "lease", "mtrl-operator-ha", "-n",
                                           chart_identity.NAMESPACE, "-o", "json").stdout)
        assert lease["spec"]["holderIdentity"].startswith(
            "replica-a_" if leader is replicas[0] else "replica-b_")

        # Runs before the kill: the leader provisions them, the standby touches nothing.
        before = ["ecs-1", "kube-1"]
        apply(cluster, namespace, run_manifest("ecs-1", workers=ECS_WORKERS,
                                               trainer={"command": HANG}))
        apply(cluster, namespace, run_manifest("kube-1", trainer={"command": HANG}))
        for name in before:
            wait_phase(cluster, namespace, name, "Running", timeout=120)
        assert _created(standby) == 0
        assert _metric(standby, "mtrl_cloud_api_requests_total") == 0
        assert _metric(standby, "mtrl_leader") == 0 and _metric(leader, "mtrl_leader") == 1

        # SIGKILL: no release, so the standby must wait out the lease and then take over.
        assert leader.proc is not None
        killed_at = time.monotonic()
        os.kill(leader.proc.pid, signal.SIGKILL)
        leader.proc.wait(10)
        apply(cluster, namespace, run_manifest("ecs-2", workers=ECS_WORKERS,
                                               trainer={"command": HANG}))
        wait_for(lambda: (_health(standby) or {}).get("leader"), 60, "the standby to lead")
        takeover = time.monotonic() - killed_at
        wait_phase(cluster, namespace, "ecs-2", "Running", timeout=120)
        new_run_running = time.monotonic() - killed_at
        print(f"\ntakeover after SIGKILL: {takeover:.1f}s (lease duration 8 s); "
              f"a run created at the kill Running after {new_run_running:.1f}s")

        # Exactly one of everything per run, whoever made it.
        for name in [*before, "ecs-2"]:
            run = get(cluster, namespace, name)
            assert run is not None and run["status"]["attempts"] == 1, name
            assert len(_trainers(cluster, namespace, run)) == 1, name
            if name.startswith("ecs"):
                assert _started_tasks(run) == ECS_WORKERS["maxReplicas"], name
                assert len(_task_definitions(run)) == 1, name
        # The new leader created the new run's resources and nothing of the old runs'.
        new_leader = standby
        assert (_created(new_leader, "queue"), _created(new_leader, "task-definition"),
                _created(new_leader, "task"), _created(new_leader, "Job")) == (4, 1, 2, 1)
        for name in [*before, "ecs-2"]:
            run = get(cluster, namespace, name)
            assert run is not None
            cluster.kubectl("delete", "mtrlrun", name, "-n", namespace, "--wait=false")
            wait_clean(cluster, names_of(run, operator_id="ha"), timeout=120)
    finally:
        for proc in replicas:
            proc.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
