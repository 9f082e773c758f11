"""Per-test SQS queues and S3 bucket on the session's moto server, under unique names so
tests never see each other's messages (the server itself is shared and never reset)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest

from mtrl_rollout.queues import RunQueues, create_run_queues, resource_tags


@pytest.fixture
def sqs_client(aws_env: dict[str, str]):
    return boto3.client("sqs")


@pytest.fixture
def s3_client(aws_env: dict[str, str]):
    return boto3.client("s3")


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def queues(sqs_client, prefix: str) -> Iterator[RunQueues]:
    tags = resource_tags(f"uid-{prefix}", "default", prefix, "test")
    yield create_run_queues(sqs_client, prefix, tags, visibility_timeout_s=2, max_receive_count=3)


@pytest.fixture
def bucket(s3_client, prefix: str) -> str:
    s3_client.create_bucket(Bucket=prefix, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    return prefix
