"""The evaluator and the request mapper on hand-made inputs (no servers)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mtrl_testbed.aws_proxy import Exchange
from tests.iam.calls import UNSCOPED, Mapper, Permission
from tests.iam.policy import UnsupportedGrammar, allows, denied

QUEUE = "arn:aws:sqs:us-west-2:123456789012:mtrl-a-rollout"


def _policy(*statements: dict[str, Any]) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": list(statements)}


def _allow(action: str | list[str], resource: str | list[str], **extra: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


def test_wildcards_and_case() -> None:
    policy = _policy(_allow("SQS:Create*", "arn:aws:sqs:us-west-2:123456789012:mtrl-?-*"))
    assert allows(policy, Permission("sqs:CreateQueue", QUEUE))
    assert not allows(policy, Permission("sqs:CreateQueue", QUEUE.replace("mtrl-a", "MTRL-a")))
    assert not allows(policy, Permission("sqs:DeleteQueue", QUEUE))


def test_conditions_need_their_key() -> None:
    policy = _policy(_allow("ecs:RunTask", "*", Condition={
        "ArnEquals": {"ecs:cluster": "arn:aws:ecs:us-west-2:123456789012:cluster/a"}}))
    in_a = (("ecs:cluster", "arn:aws:ecs:us-west-2:123456789012:cluster/a"),)
    assert allows(policy, Permission("ecs:RunTask", "x", in_a))
    assert not allows(policy, Permission("ecs:RunTask", "x"))
    assert not allows(policy, Permission("ecs:RunTask", "x", (("ecs:cluster", "b"),)))


def test_explicit_deny_wins_and_unknown_grammar_raises() -> None:
    policy = _policy(_allow("sqs:*", "*"), {"Effect": "Deny", "Action": "sqs:DeleteQueue",
                                             "Resource": QUEUE})
    assert denied(policy, [Permission("sqs:DeleteQueue", QUEUE)])
    with pytest.raises(UnsupportedGrammar):
        allows(_policy({"Effect": "Allow", "NotAction": "s3:*", "Action": "*", "Resource": "*"}),
               Permission("sqs:SendMessage", QUEUE))


def _json_call(target: str, body: dict[str, Any], response: dict[str, Any] | None = None
               ) -> Exchange:
    return Exchange("POST", "/", "", {"x-amz-target": target}, json.dumps(body).encode(), 200,
                    json.dumps(response or {}).encode())


def test_tagged_create_and_batch_calls_map_to_their_checks() -> None:
    mapper = Mapper("123456789012", "us-west-2")
    create = mapper.of(_json_call("AmazonSQS.CreateQueue",
                                  {"QueueName": "mtrl-a-rollout", "tags": {"k": "v"}}))
    assert [(p.action, p.resource) for p in create] == [("sqs:CreateQueue", QUEUE),
                                                        ("sqs:TagQueue", QUEUE)]
    batch = mapper.of(_json_call("AmazonSQS.DeleteMessageBatch", {
        "QueueUrl": "http://127.0.0.1:1/123456789012/mtrl-a-rollout", "Entries": []}))
    assert [(p.action, p.resource) for p in batch] == [("sqs:DeleteMessage", QUEUE)]


def test_run_task_passes_the_roles_its_definition_named() -> None:
    mapper = Mapper("123456789012", "us-west-2")
    target = "AmazonEC2ContainerServiceV20141113."
    definition = "arn:aws:ecs:us-west-2:123456789012:task-definition/mtrl-a-workers:1"
    mapper.of(_json_call(target + "RegisterTaskDefinition",
                         {"family": "mtrl-a-workers", "taskRoleArn": "arn:role/t"},
                         {"taskDefinition": {"taskDefinitionArn": definition}}))
    run = mapper.of(_json_call(target + "RunTask", {"cluster": "c", "taskDefinition": definition}))
    assert [(p.action, p.resource) for p in run] == [("ecs:RunTask", definition),
                                                     ("iam:PassRole", "arn:role/t")]


def test_an_unknown_request_is_denied_not_skipped() -> None:
    unknown = Mapper("123456789012", "us-west-2").of(
        Exchange("GET", "/somewhere", "", {}, b"", 200, b""))
    assert unknown[0].action.startswith("unmapped:") and unknown[0].resource == UNSCOPED
    assert denied(_policy(_allow("sqs:*", "*")), unknown)
