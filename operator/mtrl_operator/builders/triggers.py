"""Pure builders for triggers: the run made from an object, and the AWS request bodies (queues,
queue policy, the bucket's notification configuration)."""

from __future__ import annotations

import copy
import json
from typing import Any

from mtrl_api import API_VERSION
from mtrl_api.trigger import S3Source
from mtrl_operator.builders.queues import QueueRequest
from mtrl_operator.naming import (
    ANNOTATION_SOURCE_BUCKET,
    ANNOTATION_SOURCE_ETAG,
    ANNOTATION_SOURCE_KEY,
    ANNOTATION_SOURCE_VERSION_ID,
    TriggerNames,
)
from mtrl_operator.reconcile.notifications import ObjectEvent

# Long enough that a suspended trigger keeps two weeks of uploads (SQS's longest retention).
RETENTION_SECONDS = "1209600"
VISIBILITY_TIMEOUT_SECONDS = "60"  # a batch is a few API calls; a crashed operator redelivers
MAX_RECEIVE_COUNT = 5  # a message that keeps failing moves to the dead-letter queue
S3_EVENTS = ["s3:ObjectCreated:*"]
NOTIFICATION_KEYS = ("TopicConfigurations", "QueueConfigurations",
                     "LambdaFunctionConfigurations", "EventBridgeConfiguration")


# ----------------------------------------------------------------------------- the run


def owner_reference(trigger: dict[str, Any]) -> dict[str, Any]:
    """Runs belong to their trigger as Jobs belong to a CronJob: deleting the trigger deletes
    them (`--cascade=orphan` keeps them)."""
    meta = trigger["metadata"]
    return {"apiVersion": API_VERSION, "kind": "MultiTurnRLTrigger", "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def run_manifest(trigger: dict[str, Any], names: TriggerNames, obj: ObjectEvent,
                 digest: str) -> dict[str, Any]:
    """The run for one object version: the template as the API server stored it (defaults
    applied), with the object as its training data. Its outputs go to a folder of its own
    under the template's output prefix, as every run's do (OutputSpec.run_uri)."""
    template = trigger["spec"]["runTemplate"]
    spec = copy.deepcopy(template["spec"])
    name = names.run_name(digest)
    dataset = spec.get("dataset") or {}
    s3 = {"trainUri": obj.uri}
    validation = (dataset.get("s3") or {}).get("validationUri")
    if validation:
        s3["validationUri"] = validation
    spec["dataset"] = {"s3": s3, **({"evalIntervalSteps": dataset["evalIntervalSteps"]}
                                    if "evalIntervalSteps" in dataset else {})}
    meta = template.get("metadata") or {}
    annotations = {**(meta.get("annotations") or {}), ANNOTATION_SOURCE_BUCKET: obj.bucket,
                   ANNOTATION_SOURCE_KEY: obj.key, ANNOTATION_SOURCE_ETAG: obj.etag}
    if obj.version_id:
        annotations[ANNOTATION_SOURCE_VERSION_ID] = obj.version_id
    return {
        "apiVersion": API_VERSION, "kind": "MultiTurnRLRun",
        "metadata": {
            "name": name, "namespace": names.namespace,
            "labels": {**(meta.get("labels") or {}), **names.run_labels()},
            "annotations": annotations,
            "ownerReferences": [owner_reference(trigger)],
        },
        "spec": spec,
    }


# ----------------------------------------------------------------------------- queues


def _arn_prefix(arn: str) -> str:
    """`arn:<partition>:sqs:<region>:<account>` of a queue ARN."""
    return arn.rsplit(":", 1)[0]


def sibling_queue_arn(arn: str, name: str) -> str:
    return f"{_arn_prefix(arn)}:{name}"


def dead_letter_queue(names: TriggerNames, bucket: str) -> QueueRequest:
    return QueueRequest(role="dlq", name=names.dead_letter_queue,
                        attributes={"MessageRetentionPeriod": RETENTION_SECONDS,
                                    "SqsManagedSseEnabled": "true"},
                        tags=names.tags("trigger-dlq", bucket))


def queue_policy(queue_arn: str, bucket: str) -> str:
    """Only S3, only for this bucket, only from the queue's own account, may send."""
    partition, account = queue_arn.split(":")[1], queue_arn.split(":")[4]
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "S3BucketNotifications", "Effect": "Allow",
        "Principal": {"Service": "s3.amazonaws.com"}, "Action": "sqs:SendMessage",
        "Resource": queue_arn,
        "Condition": {"ArnLike": {"aws:SourceArn": f"arn:{partition}:s3:::{bucket}"},
                      "StringEquals": {"aws:SourceAccount": account}},
    }]}, separators=(",", ":"))


def notification_queue(names: TriggerNames, bucket: str, dlq_arn: str) -> QueueRequest:
    """SSE-SQS encryption: S3 can send to it (not to queues under the AWS-managed KMS key)."""
    arn = sibling_queue_arn(dlq_arn, names.queue)
    return QueueRequest(role="notifications", name=names.queue, attributes={
        "VisibilityTimeout": VISIBILITY_TIMEOUT_SECONDS,
        "MessageRetentionPeriod": RETENTION_SECONDS,
        "ReceiveMessageWaitTimeSeconds": "20",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn,
                                     "maxReceiveCount": MAX_RECEIVE_COUNT}),
        "SqsManagedSseEnabled": "true",
        "Policy": queue_policy(arn, bucket),
    }, tags=names.tags("trigger-queue", bucket))


# ----------------------------------------------------------------------------- bucket notifications


def queue_configuration(names: TriggerNames, source: S3Source, queue_arn: str) -> dict[str, Any]:
    """Our entry in the bucket's notification configuration, found again by its Id. An empty
    prefix or suffix is left out: it filters nothing (and moto answers 500 to one)."""
    rules = [{"Name": name, "Value": value}
             for name, value in (("prefix", source.prefix), ("suffix", source.suffix)) if value]
    entry: dict[str, Any] = {"Id": names.notification_id, "QueueArn": queue_arn,
                             "Events": list(S3_EVENTS)}
    if rules:
        entry["Filter"] = {"Key": {"FilterRules": rules}}
    return entry


def notification_configuration(response: dict[str, Any]) -> dict[str, Any]:
    """A GetBucketNotificationConfiguration answer as a Put request's body (no metadata)."""
    return {k: copy.deepcopy(response[k]) for k in NOTIFICATION_KEYS if k in response}


def with_queue_configuration(config: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """`config` with our entry added or updated in place; every other entry, queue or not,
    stays as it was."""
    out = copy.deepcopy(config)
    queues = out.get("QueueConfigurations", [])
    out["QueueConfigurations"] = ([entry if q.get("Id") == entry["Id"] else q for q in queues]
                                  if any(q.get("Id") == entry["Id"] for q in queues)
                                  else [*queues, entry])
    return out


def without_queue_configuration(config: dict[str, Any], entry_id: str) -> dict[str, Any]:
    out = copy.deepcopy(config)
    queues = [q for q in out.get("QueueConfigurations", []) if q.get("Id") != entry_id]
    if queues:
        out["QueueConfigurations"] = queues
    else:
        out.pop("QueueConfigurations", None)
    return out


def _normalized(entry: dict[str, Any]) -> dict[str, Any]:
    """S3 answers with "Prefix"/"Suffix" where the request said "prefix"/"suffix"."""
    rules = (entry.get("Filter") or {}).get("Key", {}).get("FilterRules", [])
    return {"Id": entry.get("Id"), "QueueArn": entry.get("QueueArn"),
            "Events": sorted(entry.get("Events", [])),
            "FilterRules": sorted((r["Name"].lower(), r["Value"]) for r in rules)}


def has_queue_configuration(config: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Whether `config` already holds `entry` as it should be (no Put needed)."""
    return any(_normalized(q) == _normalized(entry) for q in config.get("QueueConfigurations", []))
