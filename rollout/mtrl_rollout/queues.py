"""Queue names, tags and creation.

In production the operator creates the run's queues and hands their URLs to trainer and workers
through the environment; `create_run_queues` exists for tests, benchmarks and local demos. Each
worker creates only its own reply queue (see docs/protocol.md, "Generation channel").

Queues are standard, not FIFO: FIFO caps throughput per message group and dedupes only within five
minutes, while idempotency by sample id is needed anyway for redeliveries after a crash.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

TAG_RUN_UID = "mtrl.dev/run-uid"
TAG_NAMESPACE = "mtrl.dev/namespace"
TAG_NAME = "mtrl.dev/name"
TAG_MANAGED_BY = "mtrl.dev/managed-by"
TAG_COMPONENT = "mtrl.dev/component"
TAG_OPERATOR_ID = "mtrl.dev/operator-id"
TAG_CLUSTER_ID = "mtrl.dev/cluster-id"
MANAGED_BY = "mtrl-operator"
COMPONENT_WORKER_REPLY = "worker-reply"

QUEUE_NAME_MAX = 80


def resource_tags(run_uid: str, namespace: str, name: str, component: str,
                  operator_id: str = "default", cluster_id: str = "") -> dict[str, str]:
    """Tags on everything made for a run; the operator's orphan sweeper finds them by
    managed-by, operator-id and cluster-id (the Kubernetes cluster whose runs they serve: two
    clusters in one AWS account never sweep each other's), and groups them by run UID. Without
    a cluster id (a local run of the data plane) the tag is left out: no sweeper takes it."""
    tags = {
        TAG_RUN_UID: run_uid,
        TAG_NAMESPACE: namespace,
        TAG_NAME: name,
        TAG_MANAGED_BY: MANAGED_BY,
        TAG_OPERATOR_ID: operator_id,
        TAG_COMPONENT: component,
    }
    if cluster_id:
        tags[TAG_CLUSTER_ID] = cluster_id
    return tags


def queue_name(*parts: str) -> str:
    """A valid SQS queue name (alphanumerics, '-', '_', at most 80) from `parts`."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", "-".join(p for p in parts if p))
    if len(name) <= QUEUE_NAME_MAX:
        return name
    # Truncating alone could make two long names collide; keep them apart with a digest.
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: QUEUE_NAME_MAX - 9]}-{digest}"


def reply_queue_name(queue_prefix: str, worker_id: str) -> str:
    return queue_name(queue_prefix, "reply", worker_id)


@dataclass(frozen=True)
class RunQueues:
    rollout_url: str
    result_url: str
    generate_url: str
    dlq_url: str


def create_queue(sqs: Any, name: str, tags: dict[str, str], attributes: dict[str, str] | None = None) -> str:
    """Create (or find) a queue. CreateQueue is idempotent for identical attributes and tags; a
    name deleted less than 60 s ago is refused by SQS, so wait that out rather than fail."""
    deadline = time.monotonic() + 70
    while True:
        try:
            reply = sqs.create_queue(QueueName=name, Attributes=attributes or {}, tags=tags)
            return str(reply["QueueUrl"])
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if "QueueDeletedRecently" not in code or time.monotonic() > deadline:
                raise
            time.sleep(5)


def create_run_queues(
    sqs: Any,
    prefix: str,
    tags: dict[str, str],
    *,
    visibility_timeout_s: int = 60,
    max_receive_count: int = 5,
) -> RunQueues:
    dlq_attributes = {"MessageRetentionPeriod": "1209600"}  # 14 days, SQS's longest
    dlq_url = create_queue(sqs, queue_name(prefix, "dlq"), tags, dlq_attributes)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    attributes = {
        "VisibilityTimeout": str(visibility_timeout_s),
        "ReceiveMessageWaitTimeSeconds": "20",
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)}
        ),
    }
    return RunQueues(
        rollout_url=create_queue(sqs, queue_name(prefix, "rollout"), tags, attributes),
        result_url=create_queue(sqs, queue_name(prefix, "result"), tags, attributes),
        generate_url=create_queue(sqs, queue_name(prefix, "generate"), tags, attributes),
        dlq_url=dlq_url,
    )
