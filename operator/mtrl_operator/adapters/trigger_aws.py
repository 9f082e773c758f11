"""AWS calls for triggers: the trigger's queues, the bucket's notification configuration, and
the look-up the sweeper needs. boto3 clients run in threads, with the operator's retries.

Like the runs' adapter, every create is preceded by a look-up by the deterministic name, and
every delete accepts "already gone", so a repeated call after a crash changes nothing.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from mtrl_api.trigger import S3Source
from mtrl_operator import metrics
from mtrl_operator.adapters.aws import QUEUE_GONE, call, client, tagged_resources
from mtrl_operator.builders import triggers as build
from mtrl_operator.builders.queues import QueueRequest
from mtrl_operator.errors import CloudError
from mtrl_operator.naming import TriggerNames
from mtrl_operator.reconcile.sweep import Owner, Tagged
from mtrl_operator.reconcile.trigger import QueueState
from mtrl_rollout.sqs import Outgoing, Received, Sqs

__all__ = ["NotificationQueue", "Received", "TriggerAws"]

log = logging.getLogger("mtrl.trigger.aws")

_BUCKET_GONE = ("NoSuchBucket",)


P = ParamSpec("P")
R = TypeVar("R")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "?"))


def _cloud_errors(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """botocore's errors leave as the operator's CloudError, naming the call, AWS's code and
    message (what the trigger's Ready condition shows)."""
    @functools.wraps(method)
    async def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(*args, **kwargs)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise CloudError("AwsError", f"{exc.operation_name}: {error.get('Code', '?')}: "
                                         f"{error.get('Message', '')}") from exc
        except BotoCoreError as exc:
            raise CloudError("AwsError", f"{type(exc).__name__}: {exc}") from exc
    return wrapped


class NotificationQueue:
    """One trigger's queue as its consumer uses it: long polls on two threads of its own, so
    triggers never wait behind each other's 20 s polls, over the shared client's connections."""

    def __init__(self, sqs_client: Any) -> None:
        self._sqs = Sqs(pool_size=2, client=sqs_client)

    async def receive(self, url: str, wait_s: int) -> list[Received]:
        return await self._sqs.receive(url, wait_s=wait_s)

    async def hand_back(self, url: str, receipts: Sequence[str]) -> None:
        """Visible again at once: for another consumer, or for us once unsuspended."""
        await self._sqs.change_visibility_batch(url, list(receipts), 0)

    async def delete(self, url: str, receipts: Sequence[str]) -> list[str]:
        """Delete handled messages; the reasons of those that could not be."""
        return [failure.message for failure in await self._sqs.delete_batch(url, receipts)]

    async def send(self, url: str, body: str, attributes: dict[str, str]) -> None:
        await self._sqs.send(url, Outgoing(body, attributes))

    def close(self) -> None:
        self._sqs.close()


class TriggerAws:
    def __init__(self, region: str) -> None:
        session = boto3.session.Session(region_name=region)
        self.sqs = client(session, "sqs")
        self.s3 = client(session, "s3")
        self.tagging = client(session, "resourcegroupstaggingapi")
        # One read-modify-write of a bucket's notification configuration at a time.
        self._bucket_locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def consumer(self) -> NotificationQueue:
        return NotificationQueue(self.sqs)

    # ------------------------------------------------------------------ queues

    async def _queue_url(self, name: str, account: str | None = None) -> str | None:
        kwargs = {"QueueName": name, **({"QueueOwnerAWSAccountId": account} if account else {})}
        try:
            return str((await call(self.sqs, "get_queue_url", **kwargs))["QueueUrl"])
        except ClientError as exc:
            if _code(exc) in QUEUE_GONE:
                return None
            raise

    async def _queue_attributes(self, url: str, *names: str) -> dict[str, str]:
        resp = await call(self.sqs, "get_queue_attributes", QueueUrl=url,
                          AttributeNames=list(names))
        return dict(resp.get("Attributes", {}))

    async def _ensure_queue(self, req: QueueRequest) -> str:
        url = await self._queue_url(req.name)
        if url:
            return url
        resp = await call(self.sqs, "create_queue", QueueName=req.name,
                          Attributes=req.attributes, tags=req.tags)
        metrics.RESOURCES_CREATED.labels(kind="queue").inc()
        return str(resp["QueueUrl"])

    @_cloud_errors
    async def ensure_queues(self, names: TriggerNames, bucket: str) -> QueueState:
        """The dead-letter queue first, then the queue S3 sends to, which redrives into it."""
        dlq_url = await self._ensure_queue(build.dead_letter_queue(names, bucket))
        dlq_arn = (await self._queue_attributes(dlq_url, "QueueArn"))["QueueArn"]
        url = await self._ensure_queue(build.notification_queue(names, bucket, dlq_arn))
        return QueueState(url, build.sibling_queue_arn(dlq_arn, names.queue), dlq_url)

    @_cloud_errors
    async def given_queue(self, url: str) -> QueueState:
        """A queue the user made: its ARN, and its redrive policy's dead-letter queue if any."""
        attrs = await self._queue_attributes(url, "QueueArn", "RedrivePolicy")
        dlq_url = None
        if attrs.get("RedrivePolicy"):
            dlq_arn = json.loads(attrs["RedrivePolicy"]).get("deadLetterTargetArn", "")
            parts = dlq_arn.split(":")
            if len(parts) == 6:
                dlq_url = await self._queue_url(parts[5], account=parts[4])
        return QueueState(url, attrs["QueueArn"], dlq_url)

    async def _delete_queue(self, url: str) -> bool:
        try:
            await call(self.sqs, "delete_queue", QueueUrl=url)
        except ClientError as exc:
            if _code(exc) in QUEUE_GONE:
                return False
            raise
        metrics.RESOURCES_DELETED.labels(kind="queue").inc()
        return True

    @_cloud_errors
    async def delete_queues(self, names: TriggerNames) -> int:
        """The notification queue, then its dead-letter queue (and what is in them)."""
        deleted = 0
        for name in (names.queue, names.dead_letter_queue):
            url = await self._queue_url(name)
            if url:
                deleted += await self._delete_queue(url)
        return deleted

    # ------------------------------------------------------------------ bucket notifications

    async def _notification_configuration(self, bucket: str) -> dict[str, Any]:
        resp = await call(self.s3, "get_bucket_notification_configuration", Bucket=bucket)
        return build.notification_configuration(resp)

    @_cloud_errors
    async def ensure_notification(self, names: TriggerNames, source: S3Source,
                                  queue_arn: str) -> bool:
        """Add or update our QueueConfiguration, keeping every other entry; True if it changed.
        (S3 has no conditional write here: another writer between our read and write would be
        overwritten, so one operator serializes its own writes per bucket and re-checks on
        every resync.)"""
        entry = build.queue_configuration(names, source, queue_arn)
        async with self._bucket_locks[source.bucket]:
            current = await self._notification_configuration(source.bucket)
            if build.has_queue_configuration(current, entry):
                return False
            await call(self.s3, "put_bucket_notification_configuration",
                       Bucket=source.bucket,
                       NotificationConfiguration=build.with_queue_configuration(current, entry))
        return True

    @_cloud_errors
    async def remove_notification(self, bucket: str, entry_id: str) -> bool:
        """Remove our QueueConfiguration only; True if there was one. A gone bucket has none."""
        async with self._bucket_locks[bucket]:
            try:
                current = await self._notification_configuration(bucket)
            except ClientError as exc:
                if _code(exc) in _BUCKET_GONE:
                    return False
                raise
            if not any(q.get("Id") == entry_id for q in current.get("QueueConfigurations", [])):
                return False
            await call(self.s3, "put_bucket_notification_configuration", Bucket=bucket,
                       NotificationConfiguration=build.without_queue_configuration(
                           current, entry_id))
        return True

    # ------------------------------------------------------------------ sweeping

    @_cloud_errors
    async def tagged_queues(self, owner: Owner) -> list[Tagged]:
        """(ARN, tags) of the queues this operator tagged (the triggers' carry the trigger's
        UID and the bucket whose notifications feed them)."""
        return await tagged_resources(self.tagging, owner, ["sqs"])

    @_cloud_errors
    async def delete_queue_by_arn(self, arn: str) -> bool:
        """False when it was already gone (the tagging API lags behind deletions)."""
        parts = arn.split(":")
        url = await self._queue_url(parts[5], account=parts[4])
        return url is not None and await self._delete_queue(url)
