"""Runs that go partly wrong end, say why, and lose no GPU time: on the local control plane,
with ECS failing the way real ECS does (`mtrl_testbed.aws_faults`: RunTask answering HTTP
200 with `failures`, tasks that stop with a stoppedReason and an exit code) and workers that
crash through the node agent (CrashLoopBackOff, as the kubelet reports it)."""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest

from mtrl_testbed.aws_faults import CAPACITY_REASON, ESSENTIAL_EXITED, EcsFaultProxy
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import MotoServer
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import (
    HANG,
    SUCCEED,
    apply,
    condition,
    get,
    k8s_leftovers,
    names_of,
    run_manifest,
    wait_clean,
    wait_for,
    wait_phase,
)
from tests.operator.test_lifecycle import _messages

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]
OPERATOR_ID = "halffail"


@pytest.fixture(scope="module")
def ecs_faults(moto_server: MotoServer) -> Iterator[EcsFaultProxy]:
    with EcsFaultProxy(moto_server.endpoint) as proxy:
        yield proxy  # type: ignore[misc]


@pytest.fixture(scope="module")
def half_operator(operator_factory: Callable[..., OperatorProcess],
                  ecs_faults: EcsFaultProxy) -> OperatorProcess:
    """An operator whose AWS is ECS failing half-way, for runs in hf-* namespaces only (the
    shared operator watches t-*)."""
    return operator_factory(MTRL_OPERATOR_ID=OPERATOR_ID, MTRL_NAMESPACES="hf-*",
                            AWS_ENDPOINT_URL=ecs_faults.endpoint,
                            MTRL_INSTANCE_PRICES="ml.p5.48xlarge=3600")


@pytest.fixture
def hf_namespace(cluster: LocalCluster, half_operator: OperatorProcess) -> Iterator[str]:
    with cluster.namespace(f"hf-{uuid.uuid4().hex[:8]}") as name:
        yield name


def _ecs_cluster(name: str) -> str:
    boto3.client("ecs").create_cluster(clusterName=name)
    return name


def _fargate(cluster_name: str, minimum: int, maximum: int, **more: object) -> dict:
    return {"backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": minimum,
            "maxReplicas": maximum, "ecs": {"cluster": cluster_name}, **more}


def _status(cluster: LocalCluster, namespace: str, name: str) -> dict:
    return (get(cluster, namespace, name) or {}).get("status") or {}


def test_a_run_whose_workers_only_partly_start_trains_and_names_the_shortfall(
        cluster: LocalCluster, ecs_faults: EcsFaultProxy, hf_namespace: str) -> None:
    scarce = _ecs_cluster(f"scarce-{uuid.uuid4().hex[:6]}")
    ecs_faults.plan.capacity[scarce] = 1  # Fargate places one task, then none
    apply(cluster, hf_namespace, run_manifest("partial", workers=_fargate(scarce, 1, 3),
                                              trainer={"command": SUCCEED}))
    run = wait_phase(cluster, hf_namespace, "partial", "Succeeded")
    assert run["status"]["attempts"] == 1 and run["status"]["launchedAttempt"] == 1
    said = _messages(cluster, hf_namespace, "partial")
    assert said["CapacityUnavailable"] == [
        f"ECS RunTask could not start every task: {CAPACITY_REASON}"], said
    assert ecs_faults.plan.shortfalls[scarce] >= 2
    wait_clean(cluster, names_of(run, OPERATOR_ID))


def test_a_run_that_can_get_no_worker_names_the_capacity_failure_and_starts_no_trainer(
        cluster: LocalCluster, ecs_faults: EcsFaultProxy, hf_namespace: str) -> None:
    none_left = _ecs_cluster(f"full-{uuid.uuid4().hex[:6]}")
    ecs_faults.plan.capacity[none_left] = 0
    apply(cluster, hf_namespace, run_manifest("starved", trainer={"command": SUCCEED},
                                              workers=_fargate(none_left, 1, 3,
                                                               readyTimeoutSeconds=40)))
    started = time.monotonic()
    status = wait_for(lambda: (s := _status(cluster, hf_namespace, "starved")) and
                      CAPACITY_REASON in s.get("message", "") and s, 60,
                      "the run to name the capacity failure")
    named_after = time.monotonic() - started
    assert status["phase"] == "Provisioning"
    assert status["message"] == ("waiting for workers: 0/3 ready (minimum 1): ECS RunTask "
                                 f"could not start every task: {CAPACITY_REASON}")
    assert condition({"status": status}, "WorkersReady")["reason"] == "CapacityUnavailable"
    run = wait_phase(cluster, hf_namespace, "starved", "Failed", timeout=120)
    assert condition(run, "Failed")["reason"] == "WorkersUnavailable"
    assert run["status"]["message"] == (
        "fewer than spec.workers.minReplicas (1) workers were ready for 40s: ECS RunTask could "
        f"not start every task: {CAPACITY_REASON}")
    assert run["status"].get("launchedAttempt", 0) == 0, "no GPU was ever asked for"
    # Backed off: 10 s, 20 s, ... between tries, not one RunTask every reconcile.
    assert 2 <= ecs_faults.plan.run_tasks[none_left] <= 6, ecs_faults.plan.run_tasks
    assert _messages(cluster, hf_namespace, "starved")["CapacityUnavailable"] == [
        f"ECS RunTask could not start every task: {CAPACITY_REASON}"]
    print(f"capacity failure named after {named_after:.1f}s; "
          f"{ecs_faults.plan.run_tasks[none_left]} RunTask calls in 40s")


def test_a_worker_task_that_stops_is_named_and_replaced(
        cluster: LocalCluster, ecs_faults: EcsFaultProxy, hf_namespace: str) -> None:
    apply(cluster, hf_namespace, run_manifest("stopping", trainer={"command": HANG},
                                              workers=_fargate("default", 1, 2)))
    run = wait_phase(cluster, hf_namespace, "stopping", "Running")
    names = names_of(run, OPERATOR_ID)
    ecs, logs = boto3.client("ecs"), boto3.client("logs")
    live = wait_for(lambda: (t := ecs.list_tasks(cluster="default", startedBy=names.started_by,
                                                 desiredStatus="RUNNING")["taskArns"])
                    and len(t) == 2 and t, 30, "two worker tasks")
    ecs_faults.stop_task(ecs, logs, "default", live[0], 1,
                         "RuntimeError: the sandbox could not start", names.log_group)
    task_id = live[0].rsplit("/", 1)[-1]
    expected = (f"ECS task {task_id} stopped: {ESSENTIAL_EXITED} (exit code 1): "
                "RuntimeError: the sandbox could not start")
    wait_for(lambda: expected in _messages(cluster, hf_namespace, "stopping").get(
        "TaskStopped", []), 60, "a TaskStopped event in the worker's words")
    # Replaced (after the crash back-off), and the run went on training throughout.
    wait_for(lambda: len(ecs.list_tasks(cluster="default", startedBy=names.started_by,
                                        desiredStatus="RUNNING")["taskArns"]) == 2, 60,
             "the stopped task to be replaced")
    assert _status(cluster, hf_namespace, "stopping")["phase"] == "Running"
    cluster.kubectl("delete", "mtrlrun", "stopping", "-n", hf_namespace, "--timeout=90s")
    wait_clean(cluster, names)


def test_workers_that_crash_loop_fail_the_run_in_their_own_words_within_the_bound(
        cluster: LocalCluster, hf_namespace: str) -> None:
    """A worker that refuses its configuration exits 2 at every start; the node agent
    restarts it with a back-off, as the kubelet does, and reports CrashLoopBackOff."""
    apply(cluster, hf_namespace, run_manifest("crashloop", trainer={"command": SUCCEED},
                                              workers={"readyTimeoutSeconds": 30, "env": [
                                                  {"name": "MTRL_POLL_WAIT_S", "value": "99"}]}))
    run = wait_phase(cluster, hf_namespace, "crashloop", "Failed", timeout=120)
    assert condition(run, "Failed")["reason"] == "WorkersUnavailable"
    message = run["status"]["message"]
    assert message.startswith("fewer than spec.workers.minReplicas (1) workers were ready for "
                              "30s: a worker container is crash-looping: exit code 2: mtrl "
                              "worker: invalid worker configuration: "
                              "MTRL_POLL_WAIT_S: Input should be less than or equal to 20"), \
        message
    assert run["status"].get("launchedAttempt", 0) == 0
    assert "CrashLoopBackOff" in _messages(cluster, hf_namespace, "crashloop")
    wait_clean(cluster, names_of(run, OPERATOR_ID))


# Reports step 1, then never another: a collective that never returns. The second attempt
# finishes at once.
HANGS_AFTER_A_STEP = ["python", "-c", (
    "import os, sys, time\n"
    "from mtrl_trainer.progress import ConfigMapSink\n"
    "if os.environ['MTRL_ATTEMPT'] == '2':\n"
    "    from mtrl_testbed.standin_trainer import main\n"
    "    sys.exit(main(['--step-seconds', '0.1']))\n"
    "sink = ConfigMapSink(os.environ['MTRL_PROGRESS_CONFIGMAP'], os.environ['MTRL_NAMESPACE'])\n"
    "sink.report({'step': 1, 'totalSteps': 4, 'attempt': 1})\n"
    "time.sleep(600)\n")]


def test_a_hung_trainer_is_restarted_after_the_progress_timeout(
        cluster: LocalCluster, hf_namespace: str) -> None:
    apply(cluster, hf_namespace, run_manifest("hung", trainer={"command": HANGS_AFTER_A_STEP},
                                              lifecycle={"progressTimeoutSeconds": 8,
                                                         "backoffLimit": 1}))
    run = wait_phase(cluster, hf_namespace, "hung", "Succeeded", timeout=120)
    assert run["status"]["attempts"] == 2 and run["status"]["failedAttempts"] == 1
    said = _messages(cluster, hf_namespace, "hung")
    assert said["TrainerHung"] == ["attempt 1 hung (no step for 8s since step 1); starting "
                                   "attempt 2 from the latest checkpoint"], said
    wait_clean(cluster, names_of(run, OPERATOR_ID))


# Takes 4 s to stop after SIGTERM (a checkpoint being written), then exits as the trainer does.
SLOW_TO_STOP = ["python", "-c", (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(4), sys.exit(143)))\n"
    "while True:\n"
    "    time.sleep(1)\n")]


def stops_when_released(release: Path) -> list[str]:
    """A trainer that, told to stop, goes on stopping until the test creates `release` (the
    node agent runs pods as local processes): the test, not a clock, decides how long the
    run stays Suspending, however slow the machine."""
    return ["python", "-c", (
        "import os, signal, sys, time\n"
        "def stop(*_):\n"
        f"    while not os.path.exists({str(release)!r}):\n"
        "        time.sleep(0.2)\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "while True:\n"
        "    time.sleep(1)\n")]


def test_resuming_while_the_trainer_is_being_suspended_is_no_failed_attempt(
        cluster: LocalCluster, hf_namespace: str, tmp_path: Path) -> None:
    release = tmp_path / "release"
    apply(cluster, hf_namespace, run_manifest(
        "pause", trainer={"command": stops_when_released(release)}))
    run = wait_phase(cluster, hf_namespace, "pause", "Running")
    cluster.kubectl("patch", "mtrlrun", "pause", "-n", hf_namespace, "--type=merge",
                    "-p", '{"spec":{"lifecycle":{"suspend":true}}}')
    wait_phase(cluster, hf_namespace, "pause", "Suspending")
    cluster.kubectl("patch", "mtrlrun", "pause", "-n", hf_namespace, "--type=merge",
                    "-p", '{"spec":{"lifecycle":{"suspend":false}}}')
    release.touch()  # only now may the old trainer finish stopping
    run = wait_phase(cluster, hf_namespace, "pause", "Running")
    assert run["status"]["attempts"] == 1 and run["status"].get("failedAttempts", 0) == 0
    reasons = _messages(cluster, hf_namespace, "pause")
    assert "TrainerFailed" not in reasons and "Suspending" in reasons, reasons
    cluster.kubectl("delete", "mtrlrun", "pause", "-n", hf_namespace, "--timeout=90s")
    wait_clean(cluster, names_of(run, OPERATOR_ID))


def test_an_evicted_trainer_is_replaced_in_the_same_attempt(
        cluster: LocalCluster, hf_namespace: str) -> None:
    """The eviction API marks the pod DisruptionTarget; the trainer has its grace period
    (to save a checkpoint), and the Job replaces the pod without counting a failure."""
    apply(cluster, hf_namespace, run_manifest("evicted", trainer={"command": SLOW_TO_STOP}))
    run = wait_phase(cluster, hf_namespace, "evicted", "Running")
    names = names_of(run, OPERATOR_ID)
    pods = json.loads(cluster.kubectl("get", "pods", "-n", hf_namespace, "-l",
                                      f"mtrl.dev/run-uid={names.uid},mtrl.dev/component=trainer",
                                      "-o", "json").stdout)["items"]
    first = pods[0]["metadata"]["name"]
    cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{hf_namespace}/pods/{first}/"
                    "eviction", "-f", "-", input=json.dumps({
                        "apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": first, "namespace": hf_namespace}}))

    def replaced() -> bool:
        out = json.loads(cluster.kubectl("get", "pods", "-n", hf_namespace, "-l",
                                         f"mtrl.dev/run-uid={names.uid}", "-o", "json").stdout)
        return any(p["metadata"]["name"] != first and p["status"].get("phase") == "Running"
                   for p in out["items"])

    wait_for(replaced, 60, "a new trainer pod")
    run = wait_phase(cluster, hf_namespace, "evicted", "Running")
    assert run["status"]["attempts"] == 1 and run["status"].get("failedAttempts", 0) == 0
    job = json.loads(cluster.kubectl("get", "job", names.trainer(1), "-n", hf_namespace, "-o",
                                     "json").stdout)
    assert not any(c["type"] == "Failed" for c in job["status"].get("conditions", []))
    cluster.kubectl("delete", "mtrlrun", "evicted", "-n", hf_namespace, "--timeout=90s")
    wait_for(lambda: not k8s_leftovers(cluster, hf_namespace, names.uid), 60, "compute to go")


def _figures(operator: OperatorProcess, namespace: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics",
                                    timeout=5) as resp:
            text = resp.read().decode()
    except OSError:  # not serving yet
        return {}
    pattern = rf'^(mtrl_run_\w+)\{{namespace="{namespace}",run="[^"]+"\}} (\S+)$'
    return {name: float(value) for name, value in re.findall(pattern, text, re.M)}


REPORTS_AND_ENDS = ["python", "-c", (
    "import os\n"
    "from mtrl_trainer.progress import ConfigMapSink\n"
    "sink = ConfigMapSink(os.environ['MTRL_PROGRESS_CONFIGMAP'], os.environ['MTRL_NAMESPACE'])\n"
    "sink.report({'step': 3, 'totalSteps': 3, 'rewardMean': 0.75, 'trainedSteps': 3,\n"
    "             'launch': int(os.environ['MTRL_LAUNCH']), 'outcome': 'Succeeded'})\n")]


def test_the_cost_keeps_up_while_a_hung_rendezvous_changes_nothing_else(
        cluster: LocalCluster, hf_namespace: str) -> None:
    apply(cluster, hf_namespace, run_manifest("meter", trainer={"command": HANG}))
    wait_phase(cluster, hf_namespace, "meter", "Running")
    # At a dollar a node-second: the shown cost moves although no step is ever reported.
    costs = wait_for(lambda: (c := _status(cluster, hf_namespace, "meter").get("cost") or {})
                     and (c.get("usd") or 0) >= 5 and c, 60, "the cost to keep up")
    assert costs["display"].startswith("$")
    cluster.kubectl("delete", "mtrlrun", "meter", "-n", hf_namespace, "--timeout=90s")


def test_a_restarted_operator_exports_the_figures_of_finished_runs(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess],
        ecs_faults: EcsFaultProxy) -> None:
    namespace = f"gauges-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    first = operator_factory(MTRL_OPERATOR_ID="gauges", MTRL_NAMESPACES=namespace)
    apply(cluster, namespace, run_manifest("done", trainer={"command": REPORTS_AND_ENDS}))
    wait_phase(cluster, namespace, "done", "Succeeded")
    wait_for(lambda: _figures(first, namespace).get("mtrl_run_step") == 3, 30, "the gauges")
    first.stop()
    second = operator_factory(MTRL_OPERATOR_ID="gauges", MTRL_NAMESPACES=namespace)
    figures = wait_for(lambda: _figures(second, namespace), 60,
                       "the restarted operator's gauges for the finished run")
    assert figures["mtrl_run_step"] == 3 and figures["mtrl_run_reward_mean"] == 0.75
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
