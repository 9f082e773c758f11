"""Run lifecycles against the real API server, the node agent and moto: nothing leaks."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Callable

import boto3
import pytest

from mtrl_testbed import census
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from mtrl_testbed.ports import free_port
from tests.operator.runs import (
    FAIL,
    HANG,
    SUCCEED,
    apply,
    aws_leftovers,
    condition,
    get,
    k8s_leftovers,
    names_of,
    run_manifest,
    wait_clean,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]


def _messages(cluster: LocalCluster, namespace: str, name: str) -> dict[str, list[str]]:
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={name}", "-o", "json")
    said: dict[str, list[str]] = {}
    for event in json.loads(out.stdout)["items"]:
        said.setdefault(event["reason"], []).append(event["message"])
    return said


def _events(cluster: LocalCluster, namespace: str, name: str) -> list[str]:
    """The reasons of the run's Events, one per Event."""
    return [reason for reason, messages in _messages(cluster, namespace, name).items()
            for _ in messages]


def test_happy_path_kubernetes_workers(cluster: LocalCluster, operator: OperatorProcess,
                                       namespace: str) -> None:
    s3 = boto3.client("s3")  # the bucket is the operator fixture's
    s3.put_object(Bucket="mtrl-test-outputs", Key="runs/adapter/adapter_model.safetensors",
                  Body=b"weights")
    apply(cluster, namespace, run_manifest("happy"))
    seen = set()

    def phases() -> bool:
        run = get(cluster, namespace, "happy")
        phase = (run.get("status") or {}).get("phase") if run else None
        seen.add(phase)
        return phase == "Succeeded"

    wait_for(phases, 90, "happy to succeed", interval=0.2)
    run = get(cluster, namespace, "happy")
    assert {"Provisioning", "Succeeded"} <= seen
    assert run["status"]["completionTime"] and run["status"]["attempts"] == 1
    assert run["status"]["outputUri"] == \
        f"s3://mtrl-test-outputs/runs/{namespace}/happy/{run['metadata']['uid']}"
    assert condition(run, "Complete")["status"] == "True"
    assert condition(run, "QueuesReady")["status"] == "True"
    names = names_of(run)
    wait_clean(cluster, names)
    assert {"Provisioning", "Succeeded", "TrainerDeleted", "WorkersDeleted", "QueuesDeleted"} <= \
        set(_events(cluster, namespace, "happy"))
    # Outputs are kept.
    assert s3.get_object(Bucket="mtrl-test-outputs",
                         Key="runs/adapter/adapter_model.safetensors")["Body"].read() == b"weights"


def test_happy_path_ecs_fargate_workers(cluster: LocalCluster, operator: OperatorProcess,
                                        namespace: str) -> None:
    apply(cluster, namespace, run_manifest("fargate", workers={
        "backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 2,
        "maxReplicas": 12}))
    run = wait_phase(cluster, namespace, "fargate", "Succeeded")
    names = names_of(run)
    # Succeeded is written before teardown runs: count what was started once it is over.
    wait_clean(cluster, names)
    ecs = boto3.client("ecs")
    stopped = ecs.list_tasks(cluster="default", startedBy=names.started_by,
                             desiredStatus="STOPPED")["taskArns"]
    assert len(stopped) == 12, "exactly maxReplicas tasks were started, in two RunTask batches"
    task = ecs.describe_tasks(cluster="default", tasks=stopped[:1], include=["TAGS"])["tasks"][0]
    assert {"key": "mtrl.dev/run-uid", "value": names.uid} in task["tags"]
    inactive = ecs.list_task_definitions(familyPrefix=names.task_family,
                                         status="INACTIVE")["taskDefinitionArns"]
    assert len(inactive) == 1, "one task definition was registered, and deregistered"
    said = _messages(cluster, namespace, "fargate")
    assert said["WorkersDeleted"] == [
        f"deleted 12 ECS tasks in cluster default, 1 revision(s) of task definition "
        f"{names.task_family}"], said  # named once, however often teardown looked
    assert said["QueuesDeleted"] == [f"deleted 4 queues named {names.aws_prefix}-*"], said
    # The status names nothing that is gone (a merge patch must null what went away), but
    # the workers' logs, which stay until the run is deleted.
    resources = wait_for(lambda: (r := ((get(cluster, namespace, "fargate") or {})
                                        .get("status", {}).get("resources") or {})) and
                         not any(v for k, v in r.items() if k != "logGroup") and r, 30,
                         "status.resources to name nothing after teardown but the logs")
    assert resources["logGroup"] == names.log_group
    logs = boto3.client("logs")
    group = logs.describe_log_groups(logGroupNamePrefix=names.log_group)["logGroups"][0]
    assert group["retentionInDays"] == 30
    definition = ecs.describe_task_definition(taskDefinition=inactive[0])["taskDefinition"]
    assert definition["containerDefinitions"][0]["logConfiguration"]["options"][
        "awslogs-group"] == names.log_group
    tags = logs.list_tags_for_resource(resourceArn=group["arn"].removesuffix(":*"))["tags"]
    assert tags["mtrl.dev/run-uid"] == names.uid
    cluster.kubectl("delete", "mtrlrun", "fargate", "-n", namespace, "--timeout=60s")
    assert not logs.describe_log_groups(logGroupNamePrefix=names.log_group)["logGroups"]
    assert _messages(cluster, namespace, "fargate")["LogsDeleted"] == [
        f"deleted log group {names.log_group}"]


def test_failure_is_retried_from_a_new_attempt(cluster: LocalCluster, operator: OperatorProcess,
                                               namespace: str) -> None:
    flaky = ["python", "-c", "import os, sys\nif os.environ['MTRL_ATTEMPT'] != '2':\n"
             "    sys.exit(1)\nfrom mtrl_testbed.standin_trainer import main\n"
             "sys.exit(main(['--step-seconds', '0.1']))"]
    apply(cluster, namespace, run_manifest("flaky", trainer={"command": flaky},
                                           lifecycle={"backoffLimit": 2}))
    run = wait_phase(cluster, namespace, "flaky", "Succeeded")
    assert run["status"]["attempts"] == 2
    assert "TrainerFailed" in _events(cluster, namespace, "flaky")
    wait_clean(cluster, names_of(run))


def test_backoff_limit_then_failed(cluster: LocalCluster, operator: OperatorProcess,
                                   namespace: str) -> None:
    apply(cluster, namespace, run_manifest("doomed", trainer={"command": FAIL},
                                           lifecycle={"backoffLimit": 1}))
    run = wait_phase(cluster, namespace, "doomed", "Failed")
    assert run["status"]["attempts"] == 2
    assert condition(run, "Failed")["reason"] == "BackoffLimitExceeded"
    wait_clean(cluster, names_of(run))


def test_the_trainers_own_words_reach_the_run(cluster: LocalCluster, operator: OperatorProcess,
                                              namespace: str) -> None:
    """A configuration error is said in the trainer's words and not retried (the Job fails at
    once by its podFailurePolicy, the operator starts no other attempt); a crash that wrote
    nothing is told by the last line of its log (FallbackToLogsOnError)."""
    misconfigured = ["python", "-c", "import os, sys; open(os.environ["
                     "'MTRL_TERMINATION_MESSAGE_PATH'], 'w').write('configuration error: "
                     "spec.model.name: no model nope/nope'); sys.exit(2)"]
    crashing = ["python", "-c", "print('loading shard 1', flush=True); "
                "raise MemoryError('CUDA out of memory on rank 3')"]
    apply(cluster, namespace, run_manifest("misconfigured", trainer={"command": misconfigured},
                                           lifecycle={"backoffLimit": 2}))
    apply(cluster, namespace, run_manifest("crashing", trainer={"command": crashing},
                                           lifecycle={"backoffLimit": 0}))
    run = wait_phase(cluster, namespace, "misconfigured", "Failed")
    assert run["status"]["attempts"] == 1
    assert condition(run, "Failed")["reason"] == "TrainerConfigError"
    assert "not retried: configuration error: spec.model.name: no model nope/nope (exit code 2)" \
        in run["status"]["message"], run["status"]["message"]
    run = wait_phase(cluster, namespace, "crashing", "Failed")
    assert condition(run, "Failed")["reason"] == "BackoffLimitExceeded"
    assert "last: MemoryError: CUDA out of memory on rank 3 (exit code 1)" in \
        run["status"]["message"], run["status"]["message"]
    for name in ("misconfigured", "crashing"):
        wait_clean(cluster, names_of(get(cluster, namespace, name)))
    # The pods are gone, and the GPUs with them; each failed attempt's log is kept with the run.
    crashed = names_of(get(cluster, namespace, "crashing"))
    for attempt in range(1, run["status"]["attempts"] + 1):
        kept = json.loads(cluster.kubectl("get", "configmap", crashed.trainer_log(attempt), "-n",
                                          namespace, "-o", "json").stdout)
        assert kept["data"]["log"].startswith("loading shard 1\n"), kept["data"]
        assert "MemoryError: CUDA out of memory on rank 3" in kept["data"]["log"], kept["data"]
        assert kept["metadata"]["ownerReferences"][0]["uid"] == crashed.uid


def test_a_trainer_no_node_can_take_says_so(cluster: LocalCluster, operator: OperatorProcess,
                                             namespace: str) -> None:
    """A node selector no node matches (preflight checks the instance type, not every label):
    the real scheduler says so, and the run says it too, instead of waiting for trainer pods
    in silence."""
    apply(cluster, namespace, run_manifest("nowhere", trainer={
        "command": SUCCEED,
        "nodeSelector": {"sagemaker.amazonaws.com/instance-group-name": "no-such-group"}}))
    run = wait_for(lambda: (r := get(cluster, namespace, "nowhere")) and
                   "cannot be scheduled" in (r.get("status") or {}).get("message", "") and r,
                   90, "the run to say its trainer cannot be scheduled")
    assert run["status"]["phase"] == "Provisioning"
    assert "didn't match Pod's node affinity/selector" in run["status"]["message"], \
        run["status"]["message"]
    assert condition(run, "TrainerReady")["reason"] == "Unschedulable"
    cluster.kubectl("delete", "mtrlrun", "nowhere", "-n", namespace, "--timeout=60s")
    wait_clean(cluster, names_of(run))


# A trainer that reports two steps to its progress ConfigMap, then waits to be told to finish.
REPORTS_THEN_WAITS = ["python", "-c", (
    "import os, time\n"
    "from mtrl_trainer.progress import ConfigMapSink\n"
    "sink = ConfigMapSink(os.environ['MTRL_PROGRESS_CONFIGMAP'], os.environ['MTRL_NAMESPACE'])\n"
    "for step in (1, 2):\n"
    "    sink.report({'step': step, 'totalSteps': 4, 'rewardMean': step / 4,\n"
    "                 'successRate': 0.5, 'zeroVarianceFraction': 0.25})\n"
    "time.sleep(600)\n")]


def _figures(operator: OperatorProcess, namespace: str, run: str) -> dict[str, float]:
    """The run's series on the operator's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics",
                                timeout=5) as resp:
        text = resp.read().decode()
    pattern = rf'^(mtrl_run_\w+)\{{namespace="{namespace}",run="{run}"\}} (\S+)$'
    return {name: float(value) for name, value in re.findall(pattern, text, re.M)}


def test_each_runs_training_figures_are_on_the_metrics_endpoint(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    apply(cluster, namespace, run_manifest("measured", trainer={"command": REPORTS_THEN_WAITS}))
    figures = wait_for(lambda: (f := _figures(operator, namespace, "measured")) and
                       f.get("mtrl_run_step") == 2 and f, 90, "step 2 on /metrics")
    assert figures == {"mtrl_run_step": 2, "mtrl_run_reward_mean": 0.5,
                       "mtrl_run_success_rate": 0.5, "mtrl_run_zero_variance_fraction": 0.25}
    cluster.kubectl("delete", "mtrlrun", "measured", "-n", namespace, "--timeout=90s")
    wait_for(lambda: not _figures(operator, namespace, "measured"), 30,
             "the deleted run's series to go")


def test_deadline_exceeded(cluster: LocalCluster, operator: OperatorProcess,
                           namespace: str) -> None:
    apply(cluster, namespace, run_manifest("slow", trainer={"command": HANG},
                                           lifecycle={"activeDeadlineSeconds": 8}))
    run = wait_phase(cluster, namespace, "slow", "Failed", timeout=60)
    assert condition(run, "Failed")["reason"] == "DeadlineExceeded"
    wait_clean(cluster, names_of(run))


def test_suspend_keeps_queues_and_resume_finishes(cluster: LocalCluster, operator: OperatorProcess,
                                                  namespace: str) -> None:
    apply(cluster, namespace, run_manifest("pausable", trainer={"command": HANG}))
    run = wait_phase(cluster, namespace, "pausable", "Running")
    names = names_of(run)
    cluster.kubectl("patch", "mtrlrun", "pausable", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"lifecycle":{"suspend":true}}}')
    wait_phase(cluster, namespace, "pausable", "Suspended")
    wait_for(lambda: not k8s_leftovers(cluster, namespace, names.uid), 30, "compute to go")
    assert len(aws_leftovers(names)["queues"]) == 4, "queues survive a suspension"
    # Resume with a trainer that finishes (the command may change: trainer is immutable
    # only once started, so use a fresh run's semantics: resume re-creates attempt 1).
    cluster.kubectl("patch", "mtrlrun", "pausable", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"lifecycle":{"suspend":false}}}')
    wait_phase(cluster, namespace, "pausable", "Running")
    cluster.kubectl("delete", "mtrlrun", "pausable", "-n", namespace, "--timeout=60s")
    wait_clean(cluster, names)


def test_delete_while_provisioning_leaves_nothing(cluster: LocalCluster, operator: OperatorProcess,
                                                  namespace: str) -> None:
    apply(cluster, namespace, run_manifest("hasty", workers={
        "backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1,
        "maxReplicas": 3}))
    run = wait_for(lambda: (r := get(cluster, namespace, "hasty")) and
                   (r.get("status") or {}).get("phase") == "Provisioning" and r, 30,
                   "hasty to start provisioning", interval=0.05)
    cluster.kubectl("delete", "mtrlrun", "hasty", "-n", namespace, "--timeout=60s")
    assert get(cluster, namespace, "hasty") is None
    wait_clean(cluster, names_of(run))


def test_deeper_spec_errors_fail_the_run_not_the_operator(cluster: LocalCluster, operator: OperatorProcess,
                                                          namespace: str) -> None:
    apply(cluster, namespace, run_manifest("noenv", rollout={"environment": "chess"}))
    apply(cluster, namespace, run_manifest("nosubnet", workers={
        "backend": "ecs-fargate", "cpu": 256, "memory": 512, "ecs": {"subnets": []}}))
    apply(cluster, namespace, run_manifest("noreward", reward={"components": [
        {"name": "target_fraction"}, {"name": "win", "weight": 2}]}))
    bad = wait_phase(cluster, namespace, "noenv", "Failed")
    assert condition(bad, "Failed")["reason"] == "UnknownEnvironment"
    assert "chess" in bad["status"]["message"]
    # Refused up front, not by every worker at start: the message names the known ones.
    bad = wait_phase(cluster, namespace, "noreward", "Failed")
    assert condition(bad, "Failed")["reason"] == "UnknownRewardComponent"
    assert "'win'" in bad["status"]["message"]
    assert "(it has: target_fraction)" in bad["status"]["message"]
    assert bad["status"].get("launchedAttempt", 0) == 0  # no trainer was ever asked for
    apply(cluster, namespace, run_manifest("fine"))
    wait_phase(cluster, namespace, "fine", "Succeeded")
    assert operator.alive


def test_orphans_are_swept(cluster: LocalCluster, operator: OperatorProcess) -> None:
    from mtrl_operator.naming import RunNames

    # In a namespace the shared operator watches (t-*), made by it in this cluster.
    ghost = RunNames("t-gone", "ghost", "00000000-0000-4000-8000-00000000dead", "shared",
                     cluster.identity())
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName=ghost.queue("rollout"),
                           tags=ghost.tags("queue-rollout"))["QueueUrl"]
    # A queue of another operator (different operator-id) is never touched.
    other = RunNames("t-gone", "ghost", "00000000-0000-4000-8000-00000000beef", "someone-else",
                     cluster.identity())
    other_url = sqs.create_queue(QueueName=other.queue("rollout"),
                                 tags=other.tags("queue-rollout"))["QueueUrl"]
    logs = boto3.client("logs")  # and the workers' log group of a run that is gone
    logs.create_log_group(logGroupName=ghost.log_group, tags=ghost.tags("logs"))
    wait_for(lambda: url not in sqs.list_queues(QueueNamePrefix="mtrl-t-gone").get("QueueUrls",
                                                                                  []),
             30, "the orphaned queue to be swept")
    wait_for(lambda: not census.run_logs(ghost), 30, "the orphaned log group to be swept")
    assert other_url in sqs.list_queues(QueueNamePrefix="mtrl-t-gone")["QueueUrls"]
    sqs.delete_queue(QueueUrl=other_url)


def test_unreachable_aws_is_reported_and_force_release_unblocks_deletion(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess]) -> None:
    """AWS down for good: the run says so in Events, deletion waits behind the finalizer, and
    the documented annotation lets an admin release it."""
    namespace = f"noaws-{uuid.uuid4().hex[:5]}"
    cluster.kubectl("create", "namespace", namespace)
    operator_factory(MTRL_OPERATOR_ID="noaws", MTRL_NAMESPACES=namespace,
                     MTRL_SWEEP_INTERVAL_SECONDS="0",
                     AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",  # nothing listens
                     AWS_MAX_ATTEMPTS="1")
    apply(cluster, namespace, run_manifest("stranded"))
    wait_for(lambda: "ReconcileError" in _events(cluster, namespace, "stranded"), 90,
             "a ReconcileError event")
    # The phase is never blank: Pending, saying what failed.
    status = wait_for(lambda: ((get(cluster, namespace, "stranded") or {}).get("status") or {})
                      .get("message") and get(cluster, namespace, "stranded")["status"], 60,
                      "the run to say what failed")
    assert status["phase"] == "Pending"
    assert "EndpointConnectionError" in status["message"] and \
        status["message"].endswith("; retrying"), status["message"]
    cluster.kubectl("delete", "mtrlrun", "stranded", "-n", namespace, "--wait=false")
    run = wait_for(lambda: (r := get(cluster, namespace, "stranded")) and
                   r["metadata"].get("deletionTimestamp") and r, 30, "deletion to start")
    assert "mtrl.dev/cleanup" in run["metadata"]["finalizers"], "held until cleaned up"
    # Terminating, and after a few failed teardowns, how to let go.
    run = wait_for(lambda: (r := get(cluster, namespace, "stranded")) and
                   "mtrl.dev/force-release=true" in r["status"]["message"] and r, 120,
                   "the status to say how to release the run")
    assert run["status"]["phase"] == "Terminating"
    assert run["status"]["message"].startswith("waiting to delete the run's resources: ")
    cluster.kubectl("annotate", "mtrlrun", "stranded", "-n", namespace,
                    "mtrl.dev/force-release=true")
    wait_for(lambda: get(cluster, namespace, "stranded") is None, 60, "the forced release")
    assert "ForceReleased" in _events(cluster, namespace, "stranded")
