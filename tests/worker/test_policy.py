"""The worker's end of the generation channel (`mtrl_worker.policy.PolicyClient`) against the
moto server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

import boto3
import pytest

from mtrl_rollout.batching import Outbox
from mtrl_rollout.generation import error_response
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import (
    ChatMessage,
    GenerateRequest,
    PayloadPointer,
    encode,
    parse_message,
)
from mtrl_rollout.queues import create_run_queues, resource_tags
from mtrl_rollout.sqs import Outgoing, Sqs
from mtrl_worker.policy import GenerationError, PolicyClient

pytestmark = pytest.mark.aws


async def until(check, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"no {what} after {timeout_s:g}s"
        await asyncio.sleep(0.05)


async def test_a_reply_it_cannot_fetch_leaves_the_poller_polling(aws_env, unreachable_s3,
                                                                 caplog) -> None:
    """A reply whose payload S3 cannot serve now (its endpoint refuses connections) is logged
    and left for SQS to deliver again; the one poller goes on and delivers the next reply. A
    poller that died of it would deliver no more replies (and the worker's liveness check would
    fail, restarting the worker with its episodes)."""
    prefix = f"p-{uuid.uuid4().hex[:10]}"
    sqs_client = boto3.client("sqs")
    queues = create_run_queues(sqs_client, prefix, resource_tags(f"uid-{prefix}", "default",
                                                                 prefix, "test"))
    reply_url = sqs_client.create_queue(QueueName=f"{prefix}-reply-w1")["QueueUrl"]
    sqs = Sqs(pool_size=8)
    outbox = Outbox(sqs)
    client = PolicyClient(sqs, outbox, Codec(unreachable_s3, prefix),
                          generate_queue_url=queues.generate_url, reply_queue_url=reply_url,
                          dlq_url=queues.dlq_url, pollers=1, poll_wait_s=1)
    polling = asyncio.create_task(client.run())
    pointer = PayloadPointer(bucket=prefix, key="mtrl-payloads/x.json", size_bytes=300_000,
                             sha256="0" * 64)
    with caplog.at_level(logging.ERROR, logger="mtrl_worker.policy"):
        await sqs.send(reply_url, Outgoing(encode(pointer)))
        await until(lambda: "could not take reply" in caplog.text, 30, "log line")

    async def trainer() -> None:  # answers the one generate request it gets
        while not (messages := await sqs.receive(queues.generate_url, wait_s=1)):
            pass
        request = parse_message(messages[0].body)
        assert isinstance(request, GenerateRequest)
        await sqs.send(request.reply_queue_url, Outgoing(encode(error_response(request, "answered"))))

    answering = asyncio.create_task(trainer())
    request = GenerateRequest(run_id="uid", step=0, group_id="g", sample_id="s", policy_version=0,
                              turn=0, reply_queue_url=reply_url, request_id=uuid.uuid4().hex,
                              messages=[ChatMessage(role="user", content="hi")])
    with pytest.raises(GenerationError, match="answered"):
        await client.generate(request, timeout_s=60)
    await answering
    assert not polling.done()
    polling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await polling
    await outbox.aclose()
    sqs.close()
