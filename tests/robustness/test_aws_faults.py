"""Runs finish and leave nothing behind while a quarter of the operator's AWS calls fail.

The operator talks to moto through a fault-injecting proxy (`faults.FaultProxy`): throttling,
500 and 503 answers, connections reset before the request reaches moto, and connections cut
after moto acted but before the answer arrived. botocore's standard retries and the operator's
level-triggered reconcile must absorb all of it. Pods and the test itself reach moto directly,
so the leak checks see AWS as it is, not through the faults.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest

from mtrl_operator.naming import RunNames
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import MotoServer
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import (
    apply,
    aws_leftovers,
    get,
    k8s_leftovers,
    names_of,
    run_manifest,
    wait_for,
)
from tests.robustness.faults import KINDS, FaultPlan, FaultProxy

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]

OPERATOR_ID = "faults"
FAULT_RATE = 0.25
SEED = 20240607
RUN_TIMEOUT_S = 120  # generous: another test run may share the CPUs
ECS = {"backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1, "maxReplicas": 3}
# name -> workers section; the kubernetes backend is run_manifest's default.
RUNS: dict[str, dict[str, Any] | None] = {"ecs-a": ECS, "ecs-b": {**ECS, "maxReplicas": 12},
                                          "kube-a": None, "kube-b": None}


@pytest.fixture
def own_namespace(cluster: LocalCluster) -> Iterator[str]:
    """Not `t-*`: the shared operator must not race this test's operator for the runs."""
    with cluster.namespace(f"robust-aws-{uuid.uuid4().hex[:6]}") as name:
        yield name


@pytest.fixture
def proxy(moto_server: MotoServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto_server.endpoint, FaultPlan(FAULT_RATE, seed=SEED)) as running:
        yield running


def _phases(cluster: LocalCluster, namespace: str) -> dict[str, str | None]:
    return {name: ((get(cluster, namespace, name) or {}).get("status") or {}).get("phase")
            for name in RUNS}


def _reconcile_errors(cluster: LocalCluster, namespace: str) -> int:
    """ReconcileError Events: faults that outlasted botocore's retries and were retried by
    the operator's work queue instead."""
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                          "reason=ReconcileError", "-o", "json")
    return sum(e.get("count") or 1 for e in json.loads(out.stdout)["items"])


def _tasks_started(names: RunNames) -> int:
    """ECS tasks a run ever started. A RunTask whose answer was lost is repeated by botocore
    with the same clientToken, which ECS (and the test bed's moto) answers with the first
    attempt's tasks; no task stops on its own here, so every run started maxReplicas."""
    return len(boto3.client("ecs").list_tasks(cluster="default", startedBy=names.started_by,
                                              desiredStatus="STOPPED")["taskArns"])


def _all_succeeded(cluster: LocalCluster, namespace: str) -> Callable[[], bool]:
    def check() -> bool:
        phases = _phases(cluster, namespace)
        assert "Failed" not in phases.values(), f"a run failed under AWS faults: {phases}"
        return all(p == "Succeeded" for p in phases.values())
    return check


def test_runs_succeed_and_nothing_leaks_under_aws_faults(
        cluster: LocalCluster, own_namespace: str, proxy: FaultProxy,
        operator_factory: Callable[..., OperatorProcess]) -> None:
    operator = operator_factory(AWS_ENDPOINT_URL=proxy.endpoint, MTRL_OPERATOR_ID=OPERATOR_ID,
                                MTRL_NAMESPACES=own_namespace)
    for name, workers in RUNS.items():
        overrides = {"workers": workers} if workers else {}
        apply(cluster, own_namespace, run_manifest(name, **overrides))
    wait_for(_all_succeeded(cluster, own_namespace), RUN_TIMEOUT_S, "every run to succeed",
             interval=1)
    names = [names_of(get(cluster, own_namespace, name), OPERATOR_ID) for name in RUNS]
    cluster.kubectl("delete", "mtrlrun", "--all", "-n", own_namespace, "--timeout=120s")
    for run in names:  # boto3 in this process reaches moto directly, past the proxy
        wait_for(lambda r=run: not aws_leftovers(r) and not k8s_leftovers(
            cluster, own_namespace, r.uid), 60, f"nothing left of {run.name}", interval=1)
    assert operator.alive
    started = {n.name: f"{_tasks_started(n)}/{RUNS[n.name]['maxReplicas']}"
               for n in names if RUNS[n.name]}
    plan = proxy.plan
    print(f"\nAWS faults: {plan.summary()}; "
          f"ReconcileError events: {_reconcile_errors(cluster, own_namespace)}; "
          f"faulted operations: {dict(plan.by_operation.most_common())}; "
          f"ECS tasks started/maxReplicas: {started}")
    assert sum(plan.injected.values()) > 0
    assert all(plan.injected[kind] > 0 for kind in KINDS), plan.injected
    assert all(s == f"{RUNS[n]['maxReplicas']}/{RUNS[n]['maxReplicas']}"
               for n, s in started.items()), started
