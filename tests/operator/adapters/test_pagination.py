"""Every AWS list the operator reads is read to its last page: ECS answers at most 100 tasks or
task definitions a page, SQS 1000 queues, while a run may have 1000 workers (and as many reply
queues). moto answers everything in one page, so these pages are stubbed (botocore's Stubber):
each test fails when the adapter reads only the first one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from botocore.stub import Stubber

from mtrl_operator.adapters.aws import Aws, all_pages
from mtrl_operator.naming import RunNames

NAMES = RunNames("team-a", "big", "0b7e3c9e-2a65-4f1c-9d55-3b1f7e8d2c11")
CLUSTER = "arn:aws:ecs:us-west-2:123456789012:cluster/default"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Aws]:
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    yield Aws("us-west-2")


def _task_arn(i: int) -> str:
    return f"arn:aws:ecs:us-west-2:123456789012:task/default/{i:032x}"


def _described(arns: list[str]) -> dict:
    return {"tasks": [{"taskArn": a, "lastStatus": "RUNNING", "desiredStatus": "RUNNING",
                       "healthStatus": "HEALTHY", "taskDefinitionArn": "td"} for a in arns],
            "failures": []}


def test_more_than_100_worker_tasks_are_all_seen(aws: Aws) -> None:
    """150 workers: ListTasks answers 100 and a nextToken, then 50. Reading one page, the
    operator saw 100, and the run stayed short of maxReplicas (WorkersUnavailable, or 50 more
    tasks started by the next re-ask)."""
    arns = [_task_arn(i) for i in range(150)]
    with Stubber(aws.ecs) as ecs:
        ecs.add_response("list_tasks", {"taskArns": arns[:100], "nextToken": "t1"},
                         {"cluster": CLUSTER, "startedBy": NAMES.started_by,
                          "desiredStatus": "RUNNING"})
        ecs.add_response("list_tasks", {"taskArns": arns[100:]},
                         {"cluster": CLUSTER, "startedBy": NAMES.started_by,
                          "desiredStatus": "RUNNING", "nextToken": "t1"})
        ecs.add_response("describe_tasks", _described(arns[:100]),
                         {"cluster": CLUSTER, "tasks": arns[:100]})
        ecs.add_response("describe_tasks", _described(arns[100:]),
                         {"cluster": CLUSTER, "tasks": arns[100:]})
        tasks = asyncio.run(aws.worker_tasks(NAMES, CLUSTER, desired=("RUNNING",)))
        ecs.assert_no_pending_responses()
    assert [t.arn for t in tasks] == arns


def test_every_queue_of_a_run_with_many_workers_is_deleted(aws: Aws) -> None:
    """1000 workers' reply queues and the run's four: ListQueues answers 1000 and a NextToken.
    Reading one page, teardown left the rest (the last of them the run's own queues)."""
    base = f"https://sqs.us-west-2.amazonaws.com/123456789012/{NAMES.aws_prefix}"
    urls = [f"{base}-reply-w{i:04d}" for i in range(1000)] + \
        [f"{base}-{role}" for role in ("dlq", "generate", "result", "rollout")]
    with Stubber(aws.sqs) as sqs:
        sqs.add_response("list_queues", {"QueueUrls": urls[:1000], "NextToken": "n1"},
                         {"QueueNamePrefix": NAMES.aws_prefix, "MaxResults": 1000})
        sqs.add_response("list_queues", {"QueueUrls": urls[1000:]},
                         {"QueueNamePrefix": NAMES.aws_prefix, "MaxResults": 1000,
                          "NextToken": "n1"})
        for url in urls:
            sqs.add_response("delete_queue", {}, {"QueueUrl": url})
        assert asyncio.run(aws.delete_queues(NAMES)) == len(urls)
        sqs.assert_no_pending_responses()


def test_the_run_queues_are_found_past_the_first_page(aws: Aws) -> None:
    base = f"https://sqs.us-west-2.amazonaws.com/123456789012/{NAMES.aws_prefix}"
    urls = [f"{base}-reply-w{i:04d}" for i in range(1000)] + [f"{base}-rollout"]
    with Stubber(aws.sqs) as sqs:
        sqs.add_response("list_queues", {"QueueUrls": urls[:1000], "NextToken": "n1"})
        sqs.add_response("list_queues", {"QueueUrls": urls[1000:]})
        assert asyncio.run(aws.queues(NAMES)) == {"rollout": f"{base}-rollout"}


def test_every_active_task_definition_revision_is_deregistered(aws: Aws) -> None:
    family = NAMES.task_family
    arns = [f"arn:aws:ecs:us-west-2:123456789012:task-definition/{family}:{i}"
            for i in range(130, 0, -1)]
    with Stubber(aws.ecs) as ecs:
        ecs.add_response("list_task_definitions", {"taskDefinitionArns": arns[:100],
                                                   "nextToken": "d1"})
        ecs.add_response("list_task_definitions", {"taskDefinitionArns": arns[100:]})
        for arn in arns:
            ecs.add_response("deregister_task_definition", {"taskDefinition": {}},
                             {"taskDefinition": arn})
        assert asyncio.run(aws.deregister_task_definitions(NAMES)) == len(arns)
        ecs.assert_no_pending_responses()


def test_all_pages_follows_the_token_and_passes_it_back() -> None:
    pages = {None: {"items": [1, 2], "next": "a"}, "a": {"items": [3], "next": "b"},
             "b": {"items": []}}
    seen: list[str | None] = []

    def fetch(**kwargs: str) -> dict:
        seen.append(kwargs.get("token"))
        return pages[kwargs.get("token")]

    assert all_pages(fetch, "items", "token", "next") == [1, 2, 3]
    assert seen == [None, "a", "b"]
