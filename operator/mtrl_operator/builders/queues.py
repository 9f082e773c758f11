"""SQS queues of a run: names, attributes, redrive and tags."""

from __future__ import annotations

import json
from dataclasses import dataclass

from mtrl_api.run import QueuesSpec
from mtrl_operator.naming import RunNames

# Created first, so the others can name it in their redrive policy.
DLQ = "dlq"
WORK_QUEUES = ("rollout", "result", "generate")


@dataclass(frozen=True)
class QueueRequest:
    role: str
    name: str
    attributes: dict[str, str]
    tags: dict[str, str]


def _encryption(spec: QueuesSpec) -> dict[str, str]:
    if spec.kms_key_id:
        return {"KmsMasterKeyId": spec.kms_key_id, "KmsDataKeyReusePeriodSeconds": "300"}
    return {"SqsManagedSseEnabled": "true"}


def dead_letter_queue(names: RunNames, spec: QueuesSpec) -> QueueRequest:
    return QueueRequest(
        role=DLQ, name=names.queue(DLQ),
        attributes={"MessageRetentionPeriod": "1209600", **_encryption(spec)},  # 14 days
        tags=names.tags("queue-dlq"))


def work_queue(names: RunNames, spec: QueuesSpec, role: str, dlq_arn: str) -> QueueRequest:
    return QueueRequest(
        role=role, name=names.queue(role),
        attributes={
            "VisibilityTimeout": str(spec.visibility_timeout_seconds),
            "MessageRetentionPeriod": str(spec.message_retention_seconds),
            "ReceiveMessageWaitTimeSeconds": "20",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn,
                                         "maxReceiveCount": spec.max_receive_count}),
            **_encryption(spec),
        },
        tags=names.tags(f"queue-{role}"))
