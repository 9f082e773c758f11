"""`mtrl logs`: the trainer's and the workers' pods through pods/log (as `kubectl logs`), the
workers' CloudWatch Logs on ECS, and one sentence when there is nothing to read."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest

from mtrl_operator.builders.trainer import kept_log
from mtrl_operator.naming import RunNames
from mtrl_testbed.cluster import LocalCluster
from tests.cli.conftest import VENV_BIN, Result, buffered_env, make_pod, make_run, pod_phase
from tests.operator.runs import wait_for

pytestmark = pytest.mark.cluster
PRINT_THREE = "for i in range(3): print(f'trainer line {i}', flush=True)"


def _finished(cluster: LocalCluster, namespace: str, pod: str) -> None:
    wait_for(lambda: pod_phase(cluster, namespace, pod) == "Succeeded", 60,
             f"pod {pod} to succeed", interval=0.2)


def test_kubectl_logs_and_mtrl_logs_read_the_trainers_output(
        cluster: LocalCluster, cli_namespace: str, mtrl: Callable[..., Result]) -> None:
    run = make_run(cluster, cli_namespace, "talker")
    make_pod(cluster, run, "talker-t1-0", PRINT_THREE)
    make_pod(cluster, run, "talker-worker", "print('worker says hi')", component="worker")
    _finished(cluster, cli_namespace, "talker-t1-0")
    _finished(cluster, cli_namespace, "talker-worker")

    kubectl = cluster.kubectl("logs", "talker-t1-0", "-n", cli_namespace)
    assert kubectl.stdout == "trainer line 0\ntrainer line 1\ntrainer line 2\n"
    logs = mtrl("logs", "talker", "-n", cli_namespace)
    assert (logs.code, logs.out, logs.err) == (0, kubectl.stdout, "")
    assert mtrl("logs", "talker", "-n", cli_namespace, "--tail", "1").out == "trainer line 2\n"
    workers = mtrl("logs", "talker", "-n", cli_namespace, "--worker")
    assert (workers.code, workers.out) == (0, "worker says hi\n")


def test_logs_of_several_pods_come_under_a_header_each(
        cluster: LocalCluster, cli_namespace: str, mtrl: Callable[..., Result]) -> None:
    run = make_run(cluster, cli_namespace, "retried")
    make_pod(cluster, run, "retried-t2-0", "print('second attempt')", attempt=2)
    make_pod(cluster, run, "retried-t1-0", "print('first attempt')", attempt=1)
    _finished(cluster, cli_namespace, "retried-t1-0")
    _finished(cluster, cli_namespace, "retried-t2-0")
    logs = mtrl("logs", "retried", "-n", cli_namespace)
    assert logs.out.splitlines() == ["==> pod/retried-t1-0 (attempt 1) <==", "first attempt",
                                     "==> pod/retried-t2-0 (attempt 2) <==", "second attempt"]
    # Workers have no attempts: their headers name the pod only.
    for worker in ("retried-workers-a", "retried-workers-b"):
        make_pod(cluster, run, worker, f"print('{worker}')", component="worker")
        _finished(cluster, cli_namespace, worker)
    workers = mtrl("logs", "retried", "-n", cli_namespace, "--worker")
    assert workers.out.splitlines() == ["==> pod/retried-workers-a <==", "retried-workers-a",
                                        "==> pod/retried-workers-b <==", "retried-workers-b"]


def test_follow_prints_lines_as_they_come_until_the_container_exits(
        cluster: LocalCluster, cli_namespace: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    run = make_run(cluster, cli_namespace, "slow")
    # Pods are local processes: this one waits for the test to create a file.
    make_pod(cluster, run, "slow-t1-0", "import os, time\nprint('before', flush=True)\n"
             f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('after')")
    wait_for(lambda: pod_phase(cluster, cli_namespace, "slow-t1-0") == "Running", 60,
             "the pod to run", interval=0.2)
    follow = subprocess.Popen(
        [str(VENV_BIN / "mtrl"), "logs", "slow", "-n", cli_namespace, "-f"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=buffered_env(KUBECONFIG=str(cluster.kubeconfig)))
    try:
        assert follow.stdout is not None
        assert follow.stdout.readline() == "before\n"  # while the container still runs
        go.touch()
        assert follow.stdout.readline() == "after\n"
        assert follow.wait(timeout=30) == 0
    finally:
        follow.kill()
        follow.wait()


def test_a_finished_run_without_pods_says_where_its_output_is(
        cluster: LocalCluster, cli_namespace: str, mtrl: Callable[..., Result]) -> None:
    make_run(cluster, cli_namespace, "done", status={
        "phase": "Succeeded", "completionTime": "2026-01-02T12:00:00Z",
        "outputUri": "s3://mtrl-test-outputs/runs/done"})
    gone = mtrl("logs", "done", "-n", cli_namespace)
    assert (gone.code, gone.out) == (1, "")
    assert gone.err == "mtrl logs: the trainer's pods are gone (run Succeeded at " \
                       "2026-01-02T12:00:00Z); its output folder is " \
                       "s3://mtrl-test-outputs/runs/done\n"
    make_run(cluster, cli_namespace, "early")
    early = mtrl("logs", "early", "-n", cli_namespace, "--worker")
    assert early.err == "mtrl logs: the run has no worker pods (phase Pending)\n"


def test_ecs_workers_without_a_log_group_say_so(
        cluster: LocalCluster, cli_namespace: str, mtrl: Callable[..., Result]) -> None:
    make_run(cluster, cli_namespace, "fargate", workers={"backend": "ecs-fargate", "cpu": 256,
                                                         "memory": 512})
    logs = mtrl("logs", "fargate", "-n", cli_namespace, "--worker")
    assert (logs.code, logs.out) == (1, "")
    assert logs.err == 'mtrl logs: run "fargate" has no status.resources.logGroup, so its ' \
                       "workers' CloudWatch Logs cannot be found\n"


@pytest.mark.aws
def test_ecs_workers_logs_come_from_cloudwatch(
        aws_env: dict[str, str], cluster: LocalCluster, cli_namespace: str,
        mtrl: Callable[..., Result]) -> None:
    """Through a stored run: the group its status names, streams as the awslogs driver names
    them (<prefix>/<container>/<task id>), lines in time order with their task."""
    group = f"/mtrl/runs/team-a/fargate-{os.urandom(3).hex()}"
    logs = boto3.client("logs")
    logs.create_log_group(logGroupName=group)
    now = int(time.time() * 1000)  # CloudWatch refuses events older than 14 days
    for task, lines in (("0a1b", ["a1", "a2"]), ("9f8e", ["b1"])):
        stream = f"worker/worker/{task}"
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
        logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[
            {"timestamp": now + 10 * i + (5 if task == "9f8e" else 0),
             "message": line} for i, line in enumerate(lines)])
    make_run(cluster, cli_namespace, "fargate", workers={"backend": "ecs-fargate", "cpu": 256,
                                                         "memory": 512},
             status={"phase": "Running", "resources": {"logGroup": group}})
    every = mtrl("logs", "fargate", "-n", cli_namespace, "--worker")
    assert (every.code, every.out) == (0, "[0a1b] a1\n[9f8e] b1\n[0a1b] a2\n"), every
    last = mtrl("logs", "fargate", "-n", cli_namespace, "--worker", "--tail", "1")
    assert (last.code, last.out) == (0, "[0a1b] a2\n"), last


def test_a_failed_attempts_kept_log_is_shown_when_its_pods_are_gone(
        cluster: LocalCluster, cli_namespace: str, mtrl: Callable[..., Result]) -> None:
    """The operator keeps a failed attempt's log tail in a ConfigMap the run owns (as
    builders/trainer.kept_log makes it) before the workload and its pods go."""
    run = make_run(cluster, cli_namespace, "crashed", status={
        "phase": "Failed", "completionTime": "2026-01-02T12:00:00Z"})
    meta = run["metadata"]
    names = RunNames(meta["namespace"], meta["name"], meta["uid"])
    owner = {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun", "name": meta["name"],
             "uid": meta["uid"]}
    for attempt in (2, 1):
        kept = kept_log(names, attempt, f"crashed-t{attempt}-0-abcde", "trainer",
                        f"loading shard 1\nMemoryError: attempt {attempt}\n", owner)
        cluster.kubectl("apply", "-f", "-", input=json.dumps(kept))
    shown = mtrl("logs", "crashed", "-n", cli_namespace)
    assert (shown.code, shown.err) == (0, ""), shown
    assert shown.out == (
        "==> attempt 1: pod/crashed-t1-0-abcde (trainer), kept when it failed <==\n"
        "loading shard 1\nMemoryError: attempt 1\n"
        "==> attempt 2: pod/crashed-t2-0-abcde (trainer), kept when it failed <==\n"
        "loading shard 1\nMemoryError: attempt 2\n"), shown.out
    last = mtrl("logs", "crashed", "-n", cli_namespace, "--tail", "1")
    assert last.out.splitlines()[1::2] == ["MemoryError: attempt 1", "MemoryError: attempt 2"]
