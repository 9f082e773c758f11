"""The AWS adapter against the moto server: what it answers is what AWS then holds."""

from __future__ import annotations

import asyncio
import os
import uuid

from mtrl_api.run import QueuesSpec
from mtrl_operator.adapters.aws import Aws
from mtrl_operator.builders import queues as queue_builders
from mtrl_operator.naming import RunNames


def test_ensure_queues_answers_every_queue_it_made_or_found(aws_env: dict[str, str]) -> None:
    aws = Aws(os.environ["AWS_DEFAULT_REGION"])
    names = RunNames("ns", "queues", str(uuid.uuid4()))
    spec = QueuesSpec()

    def ensure(existing: dict[str, str]) -> dict[str, str]:
        return asyncio.run(aws.ensure_queues(
            names, queue_builders.dead_letter_queue(names, spec),
            lambda role, arn: queue_builders.work_queue(names, spec, role, arn), existing))

    made = ensure({})
    assert made == asyncio.run(aws.queues(names))
    assert set(made) == {queue_builders.DLQ, *queue_builders.WORK_QUEUES}
    # A repeat after a crash: what was listed is kept, the rest is made (or found) again.
    assert ensure({queue_builders.DLQ: made[queue_builders.DLQ]}) == made


def test_teardown_deletes_every_payload_of_the_run_and_only_its(aws_env: dict[str, str]) -> None:
    """More than one page of payloads (ListObjectsV2 answers 1000 a page, DeleteObjects takes
    1000 keys): all go, and another run's stay. (They were written under no run's prefix, and
    nothing deleted them.)"""
    import boto3

    from mtrl_rollout.settings import run_payload_prefix

    aws = Aws(os.environ["AWS_DEFAULT_REGION"])
    bucket = f"payloads-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={
        "LocationConstraint": os.environ["AWS_DEFAULT_REGION"]})
    ours = RunNames("ns", "payloads", str(uuid.uuid4()))
    other = RunNames("ns", "payloads", str(uuid.uuid4()))
    for i in range(1003):
        s3.put_object(Bucket=bucket, Key=f"{run_payload_prefix(ours.aws_prefix)}/{i}.json", Body=b"x")
    s3.put_object(Bucket=bucket, Key=f"{run_payload_prefix(other.aws_prefix)}/0.json", Body=b"x")

    assert asyncio.run(aws.delete_payloads(bucket, run_payload_prefix(ours.aws_prefix))) == 1003
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert left == [f"{run_payload_prefix(other.aws_prefix)}/0.json"]
    assert asyncio.run(aws.delete_payloads(f"gone-{bucket}", "mtrl-payloads/x")) == 0
