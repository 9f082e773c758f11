"""Two operator processes with one operator id: one leads, the other stands by and does
nothing; SIGKILL the leader and the standby takes over, without provisioning anything twice.

The replicas are real `mtrl operator` processes against the local API server and moto; the
Lease is a real `coordination.k8s.io/v1` Lease (the test bed's lease timings are in
`mtrl_testbed.operator.TEST_DEFAULTS`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from mtrl_testbed import chart_identity
from mtrl_testbed.chart_identity import ChartIdentity
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
from tests.robustness.kubeproxy import KubeProxy

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


def _logged_at(proc: OperatorProcess, text: str) -> dt.datetime | None:
    """When the operator's JSON log last said `text` (the file is appended to across runs)."""
    found = None
    for line in proc.log_path.read_text().splitlines():
        if text in line:
            found = dt.datetime.fromisoformat(json.loads(line)["ts"])
    return found


def test_a_leader_cut_off_from_the_api_server_stops_before_the_standby_starts(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess],
        operator_identity: ChartIdentity, tmp_path: Path) -> None:
    """A partition longer than the renew deadline: the leader exits (its kubelet would restart
    it as a standby) before its Lease can expire, so the standby never acts beside it."""
    namespace = f"ha-cut-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    env = {"MTRL_OPERATOR_ID": "ha-cut", "MTRL_NAMESPACES": namespace}
    with KubeProxy(cluster, tmp_path, token=operator_identity.token) as proxy:
        leader = operator_factory(kubeconfig=proxy.kubeconfig, MTRL_POD_NAME="cut-off", **env)
        wait_for(lambda: (_health(leader) or {}).get("leader"), 60, "the first to lead")
        standby = operator_factory(MTRL_POD_NAME="standby", **env)
        try:
            wait_for(lambda: _health(standby), 60, "the standby to answer")
            with proxy.partition():
                wait_for(lambda: not leader.alive, 60, "the cut-off leader to exit")
                assert leader.wait(5) == 1
            wait_for(lambda: (_health(standby) or {}).get("leader"), 60, "the standby to lead")
            lost = _logged_at(leader, "leadership lost")
            acquired = _logged_at(standby, "acquired the lease")
            assert lost is not None and acquired is not None
            print(f"\nthe cut-off leader exited {(acquired - lost).total_seconds():.1f}s before "
                  "the standby took the Lease")
            assert lost < acquired
        finally:
            standby.stop()
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
