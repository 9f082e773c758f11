"""Messages larger than SQS allows travel through S3 behind a small pointer message.

The pointer is itself a protocol message (`kind: payload_pointer`) carrying bucket, key, size and
sha256, so a reader verifies what it fetched. The consumer deletes the object after it deleted
the SQS message. A run's payloads live under its own prefix (`run_payload_prefix`, which the
operator hands to workers and trainer as MTRL_PAYLOAD_PREFIX), and the operator deletes that
prefix when it tears the run down: what readers that died in between left goes with the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from mtrl_rollout.protocol import (
    M,
    Message,
    PayloadPointer,
    ProtocolError,
    encode,
    expect,
    parse_message,
)
from mtrl_rollout.settings import PAYLOAD_ROOT

DEFAULT_THRESHOLD_BYTES = 240 * 1024  # leaves room for message attributes under SQS_MAX_BYTES
_GONE = {"NoSuchKey", "NoSuchBucket", "404"}
# S3 answers a missing key with 403, not 404, to a reader without s3:ListBucket on it.
_DENIED = {"AccessDenied", "403"}

log = logging.getLogger("mtrl.offload")


class PayloadTooLarge(ValueError):
    pass


@dataclass
class Codec:
    """Message <-> SQS body, offloading to S3 above `threshold_bytes` when a bucket is set."""

    s3: Any | None = None
    bucket: str | None = None
    prefix: str = PAYLOAD_ROOT
    threshold_bytes: int = DEFAULT_THRESHOLD_BYTES

    async def to_body(self, message: Message) -> str:
        body = encode(message)
        size = len(body.encode())
        if size <= self.threshold_bytes:
            return body
        if self.s3 is None or not self.bucket:
            raise PayloadTooLarge(
                f"{type(message).__name__} is {size} bytes (> {self.threshold_bytes}) and no "
                "payload bucket is configured (MTRL_PAYLOAD_BUCKET)"
            )
        key = f"{self.prefix}/{uuid.uuid4().hex}.json"
        data = body.encode()
        await asyncio.to_thread(self.s3.put_object, Bucket=self.bucket, Key=key, Body=data)
        pointer = PayloadPointer(
            bucket=self.bucket, key=key, size_bytes=size, sha256=hashlib.sha256(data).hexdigest()
        )
        return encode(pointer)

    async def from_body(self, body: str) -> tuple[Message, PayloadPointer | None]:
        """Parse a body, fetching offloaded payloads; ProtocolError if anything is malformed."""
        message = parse_message(body)
        if not isinstance(message, PayloadPointer):
            return message, None
        if self.s3 is None:
            raise ProtocolError("payload pointer received but no S3 client configured")
        try:
            reply = await asyncio.to_thread(self.s3.get_object, Bucket=message.bucket, Key=message.key)
            data = await asyncio.to_thread(reply["Body"].read)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in _DENIED:
                # Not transient, and not the message's fault: the reader's role is missing
                # s3:GetObject, or s3:ListBucket without which a missing key answers 403 too.
                # The message stays for SQS to deliver again (and to dead-letter).
                log.error("reading payload s3://%s/%s was denied (%s): the reader's role needs "
                          "s3:GetObject on the run's payload prefix, and s3:ListBucket on the "
                          "bucket for that prefix so a missing payload answers 404 "
                          "(docs/iam.md, worker and trainer policies)",
                          message.bucket, message.key, code)
                raise
            if code not in _GONE:
                raise  # transient: the message becomes visible again and is retried
            raise ProtocolError(f"payload s3://{message.bucket}/{message.key}: {code}") from None
        if hashlib.sha256(data).hexdigest() != message.sha256:
            raise ProtocolError(f"payload s3://{message.bucket}/{message.key}: sha256 mismatch")
        inner = parse_message(data)
        if isinstance(inner, PayloadPointer):
            raise ProtocolError("payload pointer points at another pointer")
        return inner, message

    async def read(self, body: str, model: type[M]) -> tuple[M, PayloadPointer | None]:
        """`from_body` for a consumer of one kind of message: any other is a ProtocolError."""
        message, pointer = await self.from_body(body)
        return expect(message, model), pointer

    async def discard(self, pointer: PayloadPointer | None) -> None:
        if pointer is not None and self.s3 is not None:
            await asyncio.to_thread(self.s3.delete_object, Bucket=pointer.bucket, Key=pointer.key)
