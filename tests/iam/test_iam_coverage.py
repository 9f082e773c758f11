"""The IAM policies in manifests/iam/ grant every AWS call the code really makes.

The operator runs a real lifecycle (an ECS-backed run, a Kubernetes-backed run, a trigger, the
orphan sweepers) with AWS_ENDPOINT_URL pointing at a recording proxy in front of moto. Each recorded
call is mapped to the permissions AWS would check (tests/iam/calls.py) and evaluated against the
rendered policy (tests/iam/policy.py). The Kubernetes-backed run's workers go through a second
proxy (via spec.workers.env), so the worker policy is checked the same way.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from mtrl_operator.naming import RunNames, TriggerNames
from mtrl_testbed.aws_proxy import Exchange, RecordingProxy
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import REGION, MotoServer
from mtrl_testbed.operator import OperatorProcess
from tests.iam.calls import Mapper, Permission
from tests.iam.policy import (
    IAM_DIR,
    POLICY_FILES,
    denied,
    rendered,
    renderer,
    without_action,
)
from tests.operator.runs import apply, names_of, run_manifest, wait_clean, wait_for, wait_phase
from tests.operator.triggers import events as trigger_events
from tests.operator.triggers import (
    queue_exists,
    runs_of,
    trigger_manifest,
    upload,
    wait_reason,
)

ACCOUNT = "123456789012"  # moto's default account
ECS_CLUSTER = "mtrl-iam"  # not "default", so the policy's cluster scoping is exercised
TASK_ROLE = f"arn:aws:iam::{ACCOUNT}:role/mtrl-worker-task"
EXECUTION_ROLE = f"arn:aws:iam::{ACCOUNT}:role/mtrl-worker-execution"
OUTPUT_BUCKET = "mtrl-test-outputs"  # tests/operator/runs.py's output.s3Uri
TRIGGER_BUCKETS = "mtrl-iam-trg-*"  # a glob, as a role shared by several triggers would use
OPERATOR_VALUES = {"Region": REGION, "Account": ACCOUNT, "EcsCluster": ECS_CLUSTER,
                   "WorkerTaskRoleArn": TASK_ROLE, "WorkerExecutionRoleArn": EXECUTION_ROLE,
                   "TriggerBucket": TRIGGER_BUCKETS, "RunBuckets": "mtrl-*"}
MUST_RECORD = {"sqs:CreateQueue", "sqs:DeleteQueue", "ecs:RegisterTaskDefinition",
               "ecs:DeregisterTaskDefinition", "ecs:RunTask", "ecs:StopTask", "tag:GetResources",
               "s3:GetBucketNotification", "s3:PutBucketNotification", "sqs:ReceiveMessage",
               "s3:ListBucket", "ecs:DescribeClusters", "logs:CreateLogGroup",
               "logs:DeleteLogGroup",
               "sqs:DeleteMessage", "sqs:SendMessage"}
WORKER_MUST_RECORD = {"sqs:CreateQueue", "sqs:GetQueueAttributes", "sqs:ReceiveMessage"}


@dataclass(frozen=True)
class Recording:
    operator: list[Exchange]
    worker: list[Exchange]
    run_prefix: str  # aws_prefix of the Kubernetes-backed run, whose workers were recorded

    def permissions(self, exchanges: list[Exchange]) -> list[Permission]:
        return Mapper(ACCOUNT, REGION).permissions(exchanges)


# ---------------------------------------------------------------------- the lifecycle


def _plant_orphans(operator_id: str, network: dict[str, str], namespace: str,
                   cluster_id: str) -> RunNames:
    """A queue, a task definition and a task tagged by this operator in this cluster for a
    run in its namespace that does not exist, made behind the operator's back: the sweeper
    has to delete them."""
    names = RunNames(namespace, "orphan", str(uuid.uuid4()), operator_id, cluster_id)
    boto3.client("sqs").create_queue(QueueName=names.queue("dlq"), tags=names.tags("queue-dlq"))
    ecs = boto3.client("ecs")
    definition = ecs.register_task_definition(
        family=names.task_family, networkMode="awsvpc", requiresCompatibilities=["FARGATE"],
        cpu="256", memory="512",
        containerDefinitions=[{"name": "worker", "image": "worker", "cpu": 256, "memory": 512}],
        tags=[{"key": k, "value": v} for k, v in names.tags("task-definition").items()],
    )["taskDefinition"]["taskDefinitionArn"]
    ecs.run_task(cluster=ECS_CLUSTER, taskDefinition=definition, launchType="FARGATE",
                 startedBy=names.started_by,
                 networkConfiguration={"awsvpcConfiguration": {
                     "subnets": [network["MTRL_ECS_SUBNETS"]],
                     "securityGroups": [network["MTRL_ECS_SECURITY_GROUPS"]]}},
                 tags=[{"key": k, "value": v} for k, v in names.tags("worker-task").items()])
    return names


def _orphans_swept(names: RunNames) -> bool:
    queues = boto3.client("sqs").list_queues(QueueNamePrefix=names.aws_prefix).get("QueueUrls")
    ecs = boto3.client("ecs")
    definitions = ecs.list_task_definitions(familyPrefix=names.task_family,
                                            status="ACTIVE")["taskDefinitionArns"]
    tasks = ecs.list_tasks(cluster=ECS_CLUSTER, startedBy=names.started_by,
                           desiredStatus="RUNNING")["taskArns"]
    return not queues and not definitions and not tasks


def _run_on_ecs(cluster: LocalCluster, namespace: str, operator_id: str) -> None:
    apply(cluster, namespace, run_manifest("on-ecs", workers={
        "backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1, "maxReplicas": 2,
        "ecs": {"taskRoleArn": TASK_ROLE}}))
    names = names_of(wait_phase(cluster, namespace, "on-ecs", "Succeeded"), operator_id)
    wait_clean(cluster, names)
    # wait_clean looks for tasks in the "default" cluster; these ran in ECS_CLUSTER.
    wait_for(lambda: not boto3.client("ecs").list_tasks(
        cluster=ECS_CLUSTER, startedBy=names.started_by, desiredStatus="RUNNING")["taskArns"],
        30, "the run's ECS tasks to stop")


def _run_on_kubernetes(cluster: LocalCluster, namespace: str, operator_id: str,
                       worker_endpoint: str) -> RunNames:
    # Container env wins over the node agent's pod-env.json: these workers reach moto
    # through the worker proxy, and nothing shared with other tests changes.
    apply(cluster, namespace, run_manifest("on-kube", workers={
        "backend": "kubernetes", "cpu": 256, "memory": 512, "minReplicas": 1, "maxReplicas": 1,
        "env": [{"name": "AWS_ENDPOINT_URL", "value": worker_endpoint}]}))
    names = names_of(wait_phase(cluster, namespace, "on-kube", "Succeeded"), operator_id)
    wait_clean(cluster, names)
    return names


def _trigger_lifecycle(cluster: LocalCluster, namespace: str, operator_id: str) -> None:
    """A trigger makes its queues and bucket entry, consumes an upload and a malformed
    message, and removes both on deletion; an orphaned trigger queue is swept."""
    bucket = f"mtrl-iam-trg-{uuid.uuid4().hex[:8]}"
    boto3.client("s3").create_bucket(Bucket=bucket,
                                     CreateBucketConfiguration={"LocationConstraint": REGION})
    ghost = TriggerNames(namespace, "ghost", str(uuid.uuid4()), operator_id, cluster.identity())
    boto3.client("sqs").create_queue(QueueName=ghost.queue,
                                     tags=ghost.tags("trigger-queue", bucket))
    apply(cluster, namespace, trigger_manifest("on-upload", bucket))
    status = wait_reason(cluster, namespace, "on-upload")["status"]
    upload(bucket, "incoming/iam.jsonl")
    wait_for(lambda: runs_of(cluster, namespace, "on-upload"), 60, "a run from the upload")
    boto3.client("sqs").send_message(QueueUrl=status["queueUrl"], MessageBody="garbage")
    wait_for(lambda: any(r == "MalformedNotification"
                         for r, _ in trigger_events(cluster, namespace, "on-upload")), 60,
             "the malformed message to be dead-lettered")
    cluster.kubectl("delete", "mtrltrigger", "on-upload", "-n", namespace, "--timeout=60s")
    wait_for(lambda: not queue_exists(ghost.queue), 30, "the orphaned trigger queue to be swept")


@pytest.fixture(scope="module")
def recording(cluster: LocalCluster, moto_server: MotoServer,
              operator_factory: Callable[..., OperatorProcess]) -> Iterator[Recording]:
    suffix = uuid.uuid4().hex[:6]
    namespace, operator_id = f"iam-{suffix}", f"iam-{suffix}"
    boto3.client("ecs").create_cluster(clusterName=ECS_CLUSTER)
    cluster.kubectl("create", "namespace", namespace)
    with RecordingProxy(moto_server.endpoint) as operator_proxy, \
            RecordingProxy(moto_server.endpoint) as worker_proxy:
        operator = operator_factory(
            AWS_ENDPOINT_URL=operator_proxy.endpoint, MTRL_NAMESPACES=namespace,
            MTRL_OPERATOR_ID=operator_id, MTRL_ECS_CLUSTER=ECS_CLUSTER,
            MTRL_ECS_EXECUTION_ROLE_ARN=EXECUTION_ROLE, MTRL_SWEEP_INTERVAL_SECONDS="2")
        try:
            orphans = _plant_orphans(operator_id, operator.env, namespace, cluster.identity())
            _run_on_ecs(cluster, namespace, operator_id)
            kube_run = _run_on_kubernetes(cluster, namespace, operator_id, worker_proxy.endpoint)
            _trigger_lifecycle(cluster, namespace, operator_id)
            wait_for(lambda: _orphans_swept(orphans), 30, "the sweeper to delete the orphans")
            # Deleting the runs walks the finalizer path too, while the operator still runs.
            cluster.kubectl("delete", "mtrlrun", "--all", "-n", namespace, "--timeout=60s")
        finally:
            operator.stop()
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        yield Recording(operator_proxy.exchanges, worker_proxy.exchanges, kube_run.aws_prefix)


# ---------------------------------------------------------------------- the checks


def _summary(permissions: list[Permission]) -> str:
    counts: dict[str, int] = {}
    for p in permissions:
        counts[p.action] = counts.get(p.action, 0) + 1
    return ", ".join(f"{a} x{n}" for a, n in sorted(counts.items()))


@pytest.mark.cluster
@pytest.mark.aws
@pytest.mark.slow
def test_operator_policy_allows_every_recorded_call(recording: Recording) -> None:
    permissions = recording.permissions(recording.operator)
    print(f"\noperator: {len(recording.operator)} calls -> {_summary(permissions)}")
    assert permissions, "the proxy recorded nothing: is the operator using AWS_ENDPOINT_URL?"
    missing = MUST_RECORD - {p.action for p in permissions}
    assert not missing, f"the lifecycle never made {sorted(missing)}"
    refused = denied(rendered("operator-policy.json", OPERATOR_VALUES), permissions)
    assert not refused, "operator-policy.json denies:\n" + "\n".join(map(str, refused))


@pytest.mark.cluster
@pytest.mark.aws
@pytest.mark.slow
def test_checker_reports_a_removed_permission(recording: Recording) -> None:
    permissions = recording.permissions(recording.operator)
    policy = without_action(rendered("operator-policy.json", OPERATOR_VALUES), "ecs:StopTask")
    refused = denied(policy, permissions)
    print("\nwithout ecs:StopTask the policy denies:\n" + "\n".join(map(str, refused)))
    assert refused and {p.action for p in refused} == {"ecs:StopTask"}


@pytest.mark.cluster
@pytest.mark.aws
@pytest.mark.slow
def test_checker_reports_a_call_outside_the_cluster_scope(recording: Recording) -> None:
    """The Resource and Condition scoping is evaluated, not only the action names."""
    permissions = recording.permissions(recording.operator)
    policy = rendered("operator-policy.json", {**OPERATOR_VALUES, "EcsCluster": "elsewhere"})
    refused = {p.action for p in denied(policy, permissions)}
    assert {"ecs:RunTask", "ecs:StopTask", "ecs:DescribeTasks", "ecs:ListTasks"} <= refused


@pytest.mark.cluster
@pytest.mark.aws
@pytest.mark.slow
def test_worker_policy_allows_every_recorded_call(recording: Recording) -> None:
    permissions = recording.permissions(recording.worker)
    print(f"\nworker: {len(recording.worker)} calls -> {_summary(permissions)}")
    missing = WORKER_MUST_RECORD - {p.action for p in permissions}
    assert not missing, f"the worker never made {sorted(missing)}"
    values = {"Region": REGION, "Account": ACCOUNT, "QueuePrefix": recording.run_prefix,
              "OutputBucket": OUTPUT_BUCKET}
    refused = denied(rendered("worker-policy.json", values), permissions)
    assert not refused, "worker-policy.json denies:\n" + "\n".join(map(str, refused))


# ---------------------------------------------------------------------- grammar and docs

_ACTION = re.compile(r"^[a-z0-9-]+:[A-Za-z*?]+$")
_RESOURCE = re.compile(r"^(\*|arn:aws:[a-z0-9-]+:[^\s]*|\$\{[A-Za-z]+\})$")


def _check_grammar(document: dict[str, Any]) -> None:
    assert document["Version"] == "2012-10-17"
    sids = [s["Sid"] for s in document["Statement"]]
    assert len(sids) == len(set(sids)), "every statement has a unique Sid"
    for statement in document["Statement"]:
        assert re.fullmatch(r"[A-Za-z0-9]+", statement["Sid"])
        assert statement["Effect"] in ("Allow", "Deny")
        assert set(statement) <= {"Sid", "Effect", "Action", "Resource", "Condition"}
        actions = [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]
        resources = ([statement["Resource"]] if isinstance(statement["Resource"], str)
                     else statement["Resource"])
        assert actions and all(_ACTION.match(a) for a in actions), actions
        assert resources and all(_RESOURCE.match(r) for r in resources), resources


@pytest.mark.parametrize("file", POLICY_FILES)
def test_policy_templates_are_valid_and_documented(file: str) -> None:
    template = (IAM_DIR / file).read_text()
    _check_grammar(json.loads(template))
    docs = (IAM_DIR.parents[1] / "docs" / "iam.md").read_text()
    undocumented = {p for p in renderer().placeholders(template) if f"`${{{p}}}`" not in docs}
    assert not undocumented, f"docs/iam.md does not explain {sorted(undocumented)}"
    # Rendered without optional values, the Optional* statements go and nothing is left over.
    values = {p: f"arn:aws:iam::{ACCOUNT}:role/{p}" if p.endswith("Arn") else "x"
              for p in renderer().placeholders(template)
              if p not in ("QueueKmsKeyArn", "InputBucket", "InputPrefix", "TriggerBucket",
                           "GivenTriggerQueueArn", "RunBuckets")}
    document = rendered(file, values)
    _check_grammar(document)
    assert "${" not in json.dumps(document)
    assert not any(s["Sid"].startswith("Optional") for s in document["Statement"])
