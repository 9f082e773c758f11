"""Poison messages go to the run's dead-letter queue at once, instead of being retried until the
queue's RedrivePolicy (maxReceiveCount) gives up on them.

A message that fails to parse will fail the same way on every delivery, so waiting for
maxReceiveCount receives only delays the signal and burns receives. The redrive policy remains the
backstop for messages whose handler crashes the process before it can dead-letter them.
"""

from __future__ import annotations

import logging

from botocore.exceptions import ClientError

from mtrl_rollout.sqs import SQS_MAX_BYTES, Outgoing, Received, Sqs, is_stale_receipt

log = logging.getLogger(__name__)

REASON_LIMIT = 256


async def dead_letter(sqs: Sqs, dlq_url: str, message: Received, reason: str) -> None:
    reason = reason[:REASON_LIMIT]
    attributes = {
        "mtrl-dlq-reason": reason,
        "mtrl-source-queue": message.queue_url,
        "mtrl-source-message-id": message.message_id,
        "mtrl-receive-count": str(message.receive_count),
    }
    body = message.body
    overflow = Outgoing(body, attributes).size() - SQS_MAX_BYTES
    if overflow > 0:  # the attributes pushed a maximal body over the limit: keep the head
        body = body.encode()[: len(body.encode()) - overflow].decode(errors="ignore")
        attributes["mtrl-truncated"] = "true"
    await sqs.send(dlq_url, Outgoing(body or "<empty>", attributes))
    try:
        await sqs.call(
            sqs.client.delete_message, QueueUrl=message.queue_url, ReceiptHandle=message.receipt_handle
        )
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if not is_stale_receipt(code):
            raise
        # Another receive holds it now and will dead-letter it too: a second copy in the
        # dead-letter queue, nothing lost.
        log.info("message %s was dead-lettered but not deleted: its receipt is stale (%s)",
                 message.message_id, code)
    log.warning(
        "moved message %s from %s to the dead-letter queue: %s",
        message.message_id,
        message.queue_url,
        reason,
    )
