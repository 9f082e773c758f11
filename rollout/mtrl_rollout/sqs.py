"""Async facade over boto3's SQS client.

boto3 is synchronous; each call runs in a thread pool sized like botocore's connection pool, so
many concurrent episodes share a bounded number of connections instead of queueing behind the
event loop's small default executor.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config

MAX_BATCH = 10  # SQS's limit for every *Batch call and for one ReceiveMessage
MAX_WAIT_S = 20  # SQS's longest long poll
SQS_MAX_BYTES = 256 * 1024  # one message, body plus attributes


def aws_client(service: str, pool_size: int) -> Any:
    """A boto3 client with standard retries and a bounded connection pool."""
    config = Config(retries={"mode": "standard"}, max_pool_connections=pool_size)
    return boto3.session.Session().client(service, config=config)


@dataclass(frozen=True)
class Received:
    queue_url: str
    message_id: str
    receipt_handle: str
    body: str
    receive_count: int
    attributes: dict[str, str]


@dataclass(frozen=True)
class Outgoing:
    body: str
    attributes: dict[str, str] | None = None

    def size(self) -> int:
        attrs = self.attributes or {}
        return len(self.body.encode()) + sum(len(k) + len(v.encode()) for k, v in attrs.items())


# Error codes that mean a receipt handle no longer names this consumer's hold on the message:
# its visibility lapsed and SQS redelivered it (to another worker, or to us under a new
# receipt), or it was deleted already. The query protocol prefixes some codes with
# "AWS.SimpleQueueService.".
STALE_RECEIPT_CODES = frozenset({"ReceiptHandleIsInvalid", "MessageNotInflight"})


def is_stale_receipt(code: str) -> bool:
    return code.rsplit(".", 1)[-1] in STALE_RECEIPT_CODES


@dataclass(frozen=True)
class BatchFailure:
    index: int
    code: str
    message: str
    sender_fault: bool


class Sqs:
    def __init__(self, pool_size: int = 16, client: Any | None = None) -> None:
        self.client = client or aws_client("sqs", pool_size)
        self._executor = ThreadPoolExecutor(pool_size, thread_name_prefix="sqs")

    async def call(self, fn: Callable[..., Any], **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, **kwargs))

    async def receive(
        self,
        queue_url: str,
        max_messages: int = MAX_BATCH,
        wait_s: int = MAX_WAIT_S,
        visibility_timeout_s: int | None = None,
    ) -> list[Received]:
        kwargs: dict[str, Any] = {
            "QueueUrl": queue_url,
            "MaxNumberOfMessages": max(1, min(MAX_BATCH, max_messages)),
            "WaitTimeSeconds": max(0, min(MAX_WAIT_S, wait_s)),
            "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
            "MessageAttributeNames": ["All"],
        }
        if visibility_timeout_s is not None:
            kwargs["VisibilityTimeout"] = visibility_timeout_s
        reply = await self.call(self.client.receive_message, **kwargs)
        return [
            Received(
                queue_url=queue_url,
                message_id=m["MessageId"],
                receipt_handle=m["ReceiptHandle"],
                body=m["Body"],
                receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", "1")),
                attributes={
                    k: v["StringValue"]
                    for k, v in m.get("MessageAttributes", {}).items()
                    if "StringValue" in v
                },
            )
            for m in reply.get("Messages", [])
        ]

    async def send(self, queue_url: str, message: Outgoing) -> None:
        await self.call(self.client.send_message, QueueUrl=queue_url, **_send_fields(message))

    async def send_batch(self, queue_url: str, messages: Sequence[Outgoing]) -> list[BatchFailure]:
        entries = [{"Id": str(i), **_send_fields(m)} for i, m in enumerate(messages)]
        reply = await self.call(self.client.send_message_batch, QueueUrl=queue_url, Entries=entries)
        return _failures(reply)

    async def delete_batch(self, queue_url: str, receipts: Sequence[str]) -> list[BatchFailure]:
        entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts)]
        reply = await self.call(self.client.delete_message_batch, QueueUrl=queue_url, Entries=entries)
        return _failures(reply)

    async def change_visibility_batch(
        self, queue_url: str, receipts: Sequence[str], timeout_s: int
    ) -> list[BatchFailure]:
        entries = [
            {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": timeout_s} for i, r in enumerate(receipts)
        ]
        reply = await self.call(
            self.client.change_message_visibility_batch, QueueUrl=queue_url, Entries=entries
        )
        return _failures(reply)

    async def visibility_timeout_s(self, queue_url: str) -> int:
        reply = await self.call(
            self.client.get_queue_attributes,
            QueueUrl=queue_url,
            AttributeNames=["VisibilityTimeout"],
        )
        return int(reply["Attributes"]["VisibilityTimeout"])

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _send_fields(message: Outgoing) -> dict[str, Any]:
    fields: dict[str, Any] = {"MessageBody": message.body}
    if message.attributes:
        fields["MessageAttributes"] = {
            k: {"DataType": "String", "StringValue": v} for k, v in message.attributes.items()
        }
    return fields


def _failures(reply: dict[str, Any]) -> list[BatchFailure]:
    return [
        BatchFailure(int(f["Id"]), f.get("Code", ""), f.get("Message", ""), f.get("SenderFault"))
        for f in reply.get("Failed", [])
    ]
