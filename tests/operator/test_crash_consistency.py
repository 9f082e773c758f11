"""Kill the operator after every single mutating call in turn; restart it; nothing is done
twice and nothing leaks.

The operator counts its cloud and API mutations (queue creates, task-definition registers,
RunTask calls, object creates and deletes, ...) and exits abruptly after the k-th when
MTRL_CRASH_AFTER_STEP=k. For k = 1, 2, ... until a run completes without reaching k, a fresh
operator then takes over and must finish the run with exactly one of everything.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable

import boto3
import pytest

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import (
    apply,
    aws_leftovers,
    get,
    k8s_leftovers,
    names_of,
    run_manifest,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]
MAX_STEPS = 60  # a safety net; the loop ends when a run finishes before its crash point


def _finished_and_clean(cluster: LocalCluster, namespace: str) -> bool:
    run = get(cluster, namespace, "crashy")
    if not run or (run.get("status") or {}).get("phase") != "Succeeded":
        return False
    names = names_of(run, operator_id="crash")
    return not aws_leftovers(names) and not k8s_leftovers(cluster, namespace, names.uid)


def test_kill_at_every_step(cluster: LocalCluster,
                            operator_factory: Callable[..., OperatorProcess]) -> None:
    ecs = boto3.client("ecs")
    crashed_at: list[int] = []
    for k in range(1, MAX_STEPS + 1):
        namespace = f"crash-{k}-{uuid.uuid4().hex[:5]}"
        cluster.kubectl("create", "namespace", namespace)
        env = {"MTRL_OPERATOR_ID": "crash", "MTRL_NAMESPACES": namespace,
               "MTRL_SWEEP_INTERVAL_SECONDS": "0"}
        apply(cluster, namespace, run_manifest("crashy", workers={
            "backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1,
            "maxReplicas": 3}))
        first = operator_factory(MTRL_CRASH_AFTER_STEP=str(k), **env)
        wait_for(lambda f=first, ns=namespace: not f.alive or _finished_and_clean(cluster, ns),
                 120, f"step {k}: a crash or a clean finish")
        if first.alive:  # the whole lifecycle took fewer than k steps: all covered
            first.stop()
            break
        assert first.wait(5) == 137
        crashed_at.append(k)
        second = operator_factory(**env)
        try:
            wait_for(lambda ns=namespace: _finished_and_clean(cluster, ns), 120,
                     f"recovery after a crash at step {k}")
        finally:
            second.stop()
        run = wait_phase(cluster, namespace, "crashy", "Succeeded")
        names = names_of(run, operator_id="crash")
        started = ecs.list_tasks(cluster="default", startedBy=names.started_by,
                                 desiredStatus="STOPPED")["taskArns"]
        assert len(started) == 3, f"crash at step {k}: {len(started)} tasks started, not 3"
        definitions = ecs.list_task_definitions(familyPrefix=names.task_family,
                                                status="INACTIVE")["taskDefinitionArns"]
        assert len(definitions) == 1, f"crash at step {k}: {definitions}"
        assert run["status"]["attempts"] == 1, f"crash at step {k}: trainer ran twice"
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    else:
        pytest.fail(f"the lifecycle did not finish within {MAX_STEPS} steps")
    print(f"crashed and recovered at steps {crashed_at}")
    assert len(crashed_at) >= 15, "provisioning and teardown have at least 15 mutations"


def test_crash_hook_is_off_by_default() -> None:
    out = subprocess.run([sys.executable, "-c", "from mtrl_operator.adapters import crashpoints; "
                          "crashpoints.step('x'); print('alive')"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "alive"
