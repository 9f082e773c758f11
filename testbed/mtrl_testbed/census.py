"""What the operator left behind, in AWS (moto) and in the cluster: the one census every test
and benchmark uses, each part shown to find a planted leak (tests/testbed/test_census.py).

Two scopes: one run (by its deterministic names and UID), or everything the project makes
(queue and task-definition names start with `mtrl-`; Kubernetes objects carry the managed-by
label). Listings are complete: every page is read, and task definitions are listed whole and
filtered by family here, because ListTaskDefinitions' `familyPrefix` is an exact family name in
AWS and in moto, not a prefix.
"""

from __future__ import annotations

import json
from typing import Any

import boto3

from mtrl_operator.naming import LABEL_MANAGED_BY, LABEL_RUN_UID, MANAGED_BY, QUEUE_PREFIX, RunNames
from mtrl_testbed.cluster import LocalCluster

# What costs money while it exists: gone once a run has finished.
COMPUTE = ("jobs", "deployments", "pods", "services")
# Every kind the operator creates in a run's namespace, by the name kubectl knows it under:
# the run's configuration and progress channel (ConfigMaps, Role, RoleBinding) live as long as
# the run, and go with it (owner references).
KINDS = (*COMPUTE, "configmaps", "roles", "rolebindings")


def _pages(client: Any, op: str, key: str, **kwargs: Any) -> list[Any]:
    return [item for page in client.get_paginator(op).paginate(**kwargs) for item in page.get(key, [])]


def _queues(prefix: str) -> list[str]:
    sqs = boto3.client("sqs")
    return _pages(sqs, "list_queues", "QueueUrls", QueueNamePrefix=prefix)


def _family(arn: str) -> str:
    return arn.rsplit("/", 1)[-1].rsplit(":", 1)[0]


def _task_definitions(match: Any) -> list[str]:
    ecs = boto3.client("ecs")
    return [arn for arn in _pages(ecs, "list_task_definitions", "taskDefinitionArns",
                                  status="ACTIVE") if match(_family(arn))]


def _live_tasks(started_by: str | None = None) -> list[str]:
    ecs = boto3.client("ecs")
    tasks: list[str] = []
    for cluster in _pages(ecs, "list_clusters", "clusterArns"):
        kwargs: dict[str, Any] = {"cluster": cluster, "desiredStatus": "RUNNING"}
        if started_by:
            kwargs["startedBy"] = started_by
        found = _pages(ecs, "list_tasks", "taskArns", **kwargs)
        if found and not started_by:  # only ours: tasks from our task-definition families
            described = [t for i in range(0, len(found), 100) for t in ecs.describe_tasks(
                cluster=cluster, tasks=found[i:i + 100])["tasks"]]
            found = [t["taskArn"] for t in described
                     if _family(t["taskDefinitionArn"]).startswith(QUEUE_PREFIX)]
        tasks += found
    return tasks


def _tagged_queues(key: str, value: str) -> list[str]:
    """Queues by tag, whatever their name. (Tasks and task definitions are found by status
    above: the tagging API also lists stopped tasks and inactive definitions, which cost
    nothing.)"""
    tagging = boto3.client("resourcegroupstaggingapi")
    return [r["ResourceARN"] for r in _pages(
        tagging, "get_resources", "ResourceTagMappingList",
        TagFilters=[{"Key": key, "Values": [value]}], ResourceTypeFilters=["sqs"])]


def _log_groups(prefix: str) -> list[str]:
    return [g["logGroupName"] for g in _pages(boto3.client("logs"), "describe_log_groups",
                                              "logGroups", logGroupNamePrefix=prefix)]


def run_logs(names: RunNames) -> list[str]:
    """The run's own worker log group, if it exists: it outlives the finished run (that is
    when its logs are read) and goes with the run, so it is not in `run_aws`."""
    return [g for g in _log_groups(names.log_group) if g == names.log_group]


def _nonempty(found: dict[str, list[str]]) -> dict[str, list[str]]:
    return {k: v for k, v in found.items() if v}


def run_aws(names: RunNames) -> dict[str, list[str]]:
    """Everything in AWS that still belongs to one run: its queues, live tasks, active task
    definitions, and anything else carrying its UID tag."""
    return _nonempty({
        "queues": _queues(names.aws_prefix),
        "tasks": _live_tasks(names.started_by),
        "task_definitions": _task_definitions(lambda family: family == names.task_family),
        "tagged_queues": _tagged_queues("mtrl.dev/run-uid", names.uid),
    })


def all_aws(operator_id: str | None = None) -> dict[str, list[str]]:
    """Everything of any run in AWS (of one operator's, when `operator_id` is given, for the
    tagged resources)."""
    found = {
        "queues": _queues(QUEUE_PREFIX),
        "tasks": _live_tasks(),
        "task_definitions": _task_definitions(lambda family: family.startswith(QUEUE_PREFIX)),
        "log_groups": _log_groups(f"/mtrl/{QUEUE_PREFIX}"),
    }
    if operator_id:
        found["tagged_queues"] = _tagged_queues("mtrl.dev/operator-id", operator_id)
    return _nonempty(found)


def _objects(cluster: LocalCluster, namespace: str, selector: str,
             kinds: tuple[str, ...]) -> dict[str, list[str]]:
    out = json.loads(cluster.kubectl("get", ",".join(kinds), "-n", namespace, "-l", selector,
                                     "-o", "json").stdout)
    found: dict[str, list[str]] = {}
    for item in out["items"]:
        if item["kind"] == "Pod" and item["status"].get("phase") in ("Succeeded", "Failed") \
                and item["metadata"].get("deletionTimestamp"):
            continue  # a finished pod on its way out
        found.setdefault(item["kind"], []).append(item["metadata"]["name"])
    return found


def run_k8s(cluster: LocalCluster, namespace: str, uid: str,
            kinds: tuple[str, ...] = KINDS) -> dict[str, list[str]]:
    """The run's objects of `kinds` still in its namespace."""
    return _objects(cluster, namespace, f"{LABEL_RUN_UID}={uid}", kinds)


def all_k8s(cluster: LocalCluster, namespace: str,
            kinds: tuple[str, ...] = KINDS) -> dict[str, list[str]]:
    """Every object of `kinds` the operator made in `namespace`, and the runs still there."""
    found = _objects(cluster, namespace, f"{LABEL_MANAGED_BY}={MANAGED_BY}", kinds)
    runs = json.loads(cluster.kubectl("get", "mtrlruns", "-n", namespace, "-o",
                                      "json").stdout)["items"]
    if runs:
        found["MultiTurnRLRun"] = [r["metadata"]["name"] for r in runs]
    return found
