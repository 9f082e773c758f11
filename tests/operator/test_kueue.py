"""Trainers under the real Kueue (v0.17.0) and Kubeflow's real training operator, on a cluster
of their own: Kueue's webhooks stand in front of every Job and PyTorchJob created there.

HyperPod task governance is Kueue, with HyperPod's names: a LocalQueue
`hyperpod-ns-<team>-localqueue` and a WorkloadPriorityClass per task type (docs/hyperpod.md).
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mtrl_testbed import chart_identity
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import EXECUTION_ROLE_ARN, MotoServer
from mtrl_testbed.operator import OperatorProcess
from mtrl_testbed.ports import wait_until
from tests.conftest import ARTIFACTS, TEST_PRICE, started_cluster
from tests.operator.runs import (
    apply,
    condition,
    get,
    names_of,
    run_manifest,
    wait_clean,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]
STANDIN_TRAINER = ["python", "-m", "mtrl_testbed.standin_trainer", "--step-seconds", "0.2"]
QUEUE = "hyperpod-ns-team-a-localqueue"
CLUSTER_QUEUE = "hyperpod-ns-team-a-clusterqueue"  # the names HyperPod task governance gives
PRIORITY = "training-priority"


@pytest.fixture(scope="module")
def kueue_cluster(tmp_path_factory: pytest.TempPathFactory,
                  moto_server: MotoServer) -> Iterator[LocalCluster]:
    with started_cluster(tmp_path_factory.mktemp("kueue-cluster"), "kueue-cluster-logs",
                         training_operator=True, kueue=True) as local:
        (local.root / "pod-env.json").write_text(json.dumps(moto_server.env()))
        yield local


@pytest.fixture(scope="module")
def kueue_operator(kueue_cluster: LocalCluster, moto_server: MotoServer,
                   aws_env: dict[str, str]) -> Iterator[OperatorProcess]:
    """The operator as the chart's ServiceAccount (default values: its RBAC reads Workloads)."""
    identity = chart_identity.install(kueue_cluster)
    subnet, group = moto_server.prepare_fargate()
    proc = OperatorProcess(kueue_cluster, {
        **aws_env, **identity.env, "MTRL_ECS_SUBNETS": subnet, "MTRL_ECS_SECURITY_GROUPS": group,
        "MTRL_ECS_EXECUTION_ROLE_ARN": EXECUTION_ROLE_ARN, "MTRL_OPERATOR_ID": "kueue",
        "MTRL_NAMESPACES": "t-*", "MTRL_INSTANCE_PRICES": f"ml.p5.48xlarge={TEST_PRICE}"},
        ARTIFACTS / "operator-kueue.log", identity.kubeconfig).start()
    wait_until(lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{proc.health_port}/healthz", timeout=2).status == 200,
        60, "the Kueue test operator's liveness endpoint")
    yield proc
    proc.stop()


def _kueue(kind: str, name: str, spec: dict[str, Any] | None = None,
           namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": meta,
            **({"spec": spec} if spec is not None else {}), **extra}


def _cluster_queue(cpu: str, name: str = CLUSTER_QUEUE) -> dict[str, Any]:
    return _kueue("ClusterQueue", name, {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
            "name": "default", "resources": [{"name": "cpu", "nominalQuota": cpu},
                                             {"name": "memory", "nominalQuota": "64Gi"}]}]}]})


def _put(cluster: LocalCluster, *objs: dict[str, Any]) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": list(objs)}))


def test_a_trainer_kueue_holds_for_quota_says_so_costs_nothing_then_trains(
        kueue_cluster: LocalCluster, kueue_operator: OperatorProcess) -> None:
    cluster = kueue_cluster
    with cluster.namespace(f"t-kueue-{uuid.uuid4().hex[:6]}") as namespace:
        _put(cluster, _kueue("ResourceFlavor", "default", {}), _cluster_queue(cpu="1"),
             _kueue("LocalQueue", QUEUE, {"clusterQueue": CLUSTER_QUEUE}, namespace=namespace),
             _kueue("WorkloadPriorityClass", PRIORITY, value=100,
                    description="HyperPod task governance's training tasks"))
        apply(cluster, namespace, run_manifest("queued", trainer={
            "launcher": "PyTorchJob", "command": STANDIN_TRAINER,
            "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
            scheduling={"queueName": QUEUE, "priorityClass": PRIORITY}))
        # Held: the ClusterQueue has 1 CPU and the trainer asks for 2.
        # First "waiting for Kueue admission in queue ...", then Kueue's reason once its
        # Workload has one.
        run = _saying(cluster, namespace, "queued", "insufficient quota for cpu")
        status = run["status"]
        assert status["message"].startswith(
            f"waiting for the trainer (attempt 1): waiting for Kueue admission in queue {QUEUE}: "
            "couldn't assign flavors to pod set master: insufficient quota for cpu in flavor "
            "default"), status["message"]
        assert status["phase"] == "Provisioning" and status["attempts"] == 1, status
        assert condition(run, "TrainerReady")["reason"] == "AwaitingAdmission"
        assert status["cost"]["nodeSeconds"] == 0, status["cost"]
        assert ("Normal", "TrainerQueued") in _events(cluster, namespace, "queued")
        job = json.loads(cluster.kubectl("get", "pytorchjobs", "-n", namespace, "-o",
                                         "json").stdout)["items"][0]
        assert job["spec"]["runPolicy"]["suspend"] is True  # Kueue's webhook suspended it
        assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == PRIORITY
        assert not cluster.kubectl("get", "pods", "-n", namespace, "-l",
                                   "mtrl.dev/component=trainer", "-o", "name").stdout.strip()
        # Quota arrives: Kueue admits the workload, the trainer trains, the run succeeds.
        _put(cluster, _cluster_queue(cpu="4"))
        run = wait_phase(cluster, namespace, "queued", "Succeeded", timeout=180)
        assert run["status"]["attempts"] == 1 and run["status"]["failedAttempts"] == 0, \
            run["status"]
        wait_clean(cluster, names_of(run, operator_id="kueue"))


@pytest.mark.parametrize("launcher", ["PyTorchJob", "Job"])
def test_a_trainer_kueue_preempts_waits_for_readmission_in_the_same_attempt(
        kueue_cluster: LocalCluster, kueue_operator: OperatorProcess, launcher: str) -> None:
    """A higher-priority workload in the same ClusterQueue evicts the running trainer: Kueue
    suspends its PyTorchJob, whose controller deletes the pods. The run says so and waits; once
    the other workload is done, Kueue admits the trainer again and it finishes in the same
    attempt, with no failure counted."""
    cluster = kueue_cluster
    with cluster.namespace(f"t-kueue-{uuid.uuid4().hex[:6]}") as namespace:
        cq = f"hyperpod-ns-team-b-{launcher.lower()}-clusterqueue"
        queue = _cluster_queue(cpu="2", name=cq)
        queue["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
        _put(cluster, _kueue("ResourceFlavor", "default", {}), queue,
             _kueue("LocalQueue", QUEUE, {"clusterQueue": cq}, namespace=namespace),
             _kueue("WorkloadPriorityClass", "low", value=10),
             _kueue("WorkloadPriorityClass", "high", value=1000))
        apply(cluster, namespace, run_manifest("preempted", trainer={
            "launcher": launcher, "command": STANDIN_TRAINER,
            "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
            grpo={"maxSteps": 60}, scheduling={"queueName": QUEUE, "priorityClass": "low"}))
        wait_phase(cluster, namespace, "preempted", "Running", timeout=120)
        urgent = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": "urgent", "namespace": namespace,
            "labels": {"kueue.x-k8s.io/queue-name": QUEUE,
                       "kueue.x-k8s.io/priority-class": "high"}},
            "spec": {"backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never", "containers": [{
                    "name": "urgent", "image": "busybox", "command": ["sleep", "3"],
                    "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}]}}}}
        _put(cluster, urgent)
        run = _saying(cluster, namespace, "preempted", "evicted (Preempted)")
        status = run["status"]
        assert status["message"].startswith(
            f"waiting for the trainer (attempt 1): waiting for Kueue admission in queue {QUEUE}: "
            "evicted (Preempted): Preempted to accommodate a workload"), status["message"]
        assert status["attempts"] == 1 and status["failedAttempts"] == 0, status
        assert status["phase"] == "Running", status
        assert ("Warning", "TrainerQueued") in _events(cluster, namespace, "preempted")
        run = wait_phase(cluster, namespace, "preempted", "Succeeded", timeout=240)
        assert run["status"]["attempts"] == 1 and run["status"]["failedAttempts"] == 0, \
            run["status"]
        wait_clean(cluster, names_of(run, operator_id="kueue"))


def test_kueues_webhooks_are_installed_for_the_kinds_its_integrations_manage(
        kueue_cluster: LocalCluster) -> None:
    """Only Jobs, PyTorchJobs and Kueue's own kinds go through its webhooks here."""
    names = cluster_webhooks(kueue_cluster)
    assert {"mjob.kb.io", "vjob.kb.io", "mpytorchjob.kb.io", "vpytorchjob.kb.io",
            "vworkload.kb.io"} <= names, names
    assert not {"mpod.kb.io", "mdeployment.kb.io"} & names, names


def _saying(cluster: LocalCluster, namespace: str, run: str, words: str) -> dict[str, Any]:
    """The run, once its message says `words`."""
    return wait_for(lambda: (r := get(cluster, namespace, run)) and words in (
        r.get("status") or {}).get("message", "") and r, 120, f"{run} to say {words!r}")


def _events(cluster: LocalCluster, namespace: str, run: str) -> list[tuple[str, str]]:
    """(type, reason) of the run's Events."""
    items = json.loads(cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                                       f"involvedObject.name={run}", "-o", "json").stdout)["items"]
    return [(e["type"], e["reason"]) for e in items]


def cluster_webhooks(cluster: LocalCluster) -> set[str]:
    out = set()
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        items = json.loads(cluster.kubectl("get", kind, "-o", "json").stdout)["items"]
        out |= {w["name"] for item in items for w in item.get("webhooks") or []}
    return out
