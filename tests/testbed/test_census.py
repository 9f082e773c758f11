"""The leak census finds each kind of leak when one is planted, in both scopes, and stops
finding it once it is gone: a census that cannot fail proves nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import boto3
import pytest

from mtrl_operator.naming import RunNames
from mtrl_testbed import census
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import MotoServer

pytestmark = [pytest.mark.cluster, pytest.mark.aws]


@pytest.fixture
def names(namespace: str, aws_env: dict[str, str]) -> RunNames:
    return RunNames(namespace, "leaky", str(uuid.uuid4()), "census")


@pytest.fixture
def fargate(moto_server: MotoServer, aws_env: dict[str, str]) -> tuple[str, str]:
    return moto_server.prepare_fargate()


def _tags(names: RunNames) -> dict[str, str]:
    return {"mtrl.dev/run-uid": names.uid, "mtrl.dev/operator-id": names.operator_id}


@pytest.fixture
def planted_definition(names: RunNames) -> Iterator[str]:
    ecs = boto3.client("ecs")
    arn = ecs.register_task_definition(
        family=names.task_family, requiresCompatibilities=["FARGATE"], networkMode="awsvpc",
        cpu="256", memory="512", tags=[{"key": k, "value": v} for k, v in _tags(names).items()],
        containerDefinitions=[{"name": "worker", "image": "busybox", "cpu": 256,
                               "memory": 512}])["taskDefinition"]["taskDefinitionArn"]
    yield arn
    ecs.deregister_task_definition(taskDefinition=arn)  # a second time is harmless


def test_a_planted_queue_is_found_until_it_is_deleted(names: RunNames) -> None:
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName=names.queue("rollout"), tags=_tags(names))["QueueUrl"]
    assert census.run_aws(names)["queues"] == [url]
    assert url in census.all_aws()["queues"]
    assert census.all_aws(names.operator_id)["tagged_queues"]
    sqs.delete_queue(QueueUrl=url)
    assert census.run_aws(names) == {}


def test_a_planted_log_group_is_found_until_it_is_deleted(names: RunNames) -> None:
    logs = boto3.client("logs")
    logs.create_log_group(logGroupName=names.log_group, tags=_tags(names))
    assert census.run_logs(names) == [names.log_group]
    assert names.log_group in census.all_aws()["log_groups"]
    logs.delete_log_group(logGroupName=names.log_group)
    assert census.run_logs(names) == []


def test_a_planted_task_definition_is_found_by_family_not_prefix(
        names: RunNames, planted_definition: str) -> None:
    assert census.run_aws(names)["task_definitions"] == [planted_definition]
    assert planted_definition in census.all_aws()["task_definitions"]
    boto3.client("ecs").deregister_task_definition(taskDefinition=planted_definition)
    assert "task_definitions" not in census.run_aws(names)


def test_a_planted_task_is_found(names: RunNames, fargate: tuple[str, str],
                                 planted_definition: str) -> None:
    ecs = boto3.client("ecs")
    subnet, group = fargate
    task = ecs.run_task(cluster="default", taskDefinition=planted_definition, launchType="FARGATE",
                        startedBy=names.started_by, networkConfiguration={"awsvpcConfiguration": {
                            "subnets": [subnet], "securityGroups": [group]}})["tasks"][0]["taskArn"]
    try:
        assert census.run_aws(names)["tasks"] == [task]
        assert task in census.all_aws()["tasks"]
    finally:
        ecs.stop_task(cluster="default", task=task)
    assert "tasks" not in census.run_aws(names)


def test_a_planted_kubernetes_object_is_found(cluster: LocalCluster, namespace: str,
                                              names: RunNames) -> None:
    labels = {"app.kubernetes.io/managed-by": "mtrl-operator", "mtrl.dev/run-uid": names.uid}
    for kind, extra in (("ConfigMap", {"data": {"a": "b"}}),
                        ("Role", {"rules": []})):
        manifest = {"apiVersion": "v1" if kind == "ConfigMap" else "rbac.authorization.k8s.io/v1",
                    "kind": kind, "metadata": {"name": f"leaky-{kind.lower()}",
                                               "labels": labels}, **extra}
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    assert census.run_k8s(cluster, namespace, names.uid) == {
        "ConfigMap": ["leaky-configmap"], "Role": ["leaky-role"]}
    assert census.all_k8s(cluster, namespace) == {
        "ConfigMap": ["leaky-configmap"], "Role": ["leaky-role"]}
    cluster.kubectl("delete", "configmap,role", "-n", namespace, "--all")
    assert census.run_k8s(cluster, namespace, names.uid) == {}
