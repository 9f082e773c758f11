"""Helpers for trigger tests: triggers, buckets, the notification S3 sends, and waiting."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any
from urllib.parse import quote_plus

import boto3

from mtrl_operator.naming import TriggerNames
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import REGION
from tests.operator.runs import run_manifest, wait_for


def run_template(**overrides: Any) -> dict[str, Any]:
    """tests/operator/runs.py's quick run as a template: no dataset (the upload is)."""
    spec = run_manifest("template", **overrides)["spec"]
    spec.pop("dataset")
    return spec


# A run that costs nothing: suspended from the start, so it stays active without queues or pods.
IDLE = run_template(lifecycle={"suspend": True})


def trigger_manifest(name: str, bucket: str, template: dict[str, Any] | None = None,
                     prefix: str = "incoming/", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLTrigger",
            "metadata": {"name": name},
            "spec": {"source": {"s3": {"bucket": bucket, "prefix": prefix}},
                     "runTemplate": {"spec": copy.deepcopy(template or IDLE)}, **spec}}


def s3_notification(bucket: str, key: str, etag: str, event: str = "ObjectCreated:Put") -> str:
    """The body S3 puts in the queue for one upload (the key URL-encoded, '+' for a space)."""
    return json.dumps({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": REGION,
        "eventTime": "2025-01-01T00:00:00.000Z", "eventName": event,
        "s3": {"s3SchemaVersion": "1.0", "configurationId": "mtrl",
               "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
               "object": {"key": quote_plus(key, safe="/"), "size": 3, "eTag": etag,
                          "sequencer": "0065A1B2C3D4E5F6A7"}}}]})


def new_bucket() -> str:
    name = f"mtrl-trg-{uuid.uuid4().hex[:10]}"
    boto3.client("s3").create_bucket(
        Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    return name


def upload(bucket: str, key: str, body: bytes = b'{"target": "a"}\n') -> str:
    """Put an object; S3 (moto too) then notifies the bucket's queues. Returns its ETag."""
    return str(boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body)["ETag"]).strip('"')


def get_trigger(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "mtrltrigger", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def ready_reason(trigger: dict[str, Any] | None) -> str | None:
    for c in ((trigger or {}).get("status") or {}).get("conditions", []):
        if c["type"] == "Ready":
            return str(c["reason"])
    return None


def wait_reason(cluster: LocalCluster, namespace: str, name: str, reason: str = "Watching",
                timeout: float = 90) -> dict[str, Any]:
    """90 s: once, the shared operator started a second before the test first saw its trigger
    60 s late (the kopf start-up delay of commit dc939e4); every later trigger took < 2 s."""
    return wait_for(lambda: (t := get_trigger(cluster, namespace, name)) and ready_reason(t) == reason
                    and t["status"].get("observedGeneration") == t["metadata"]["generation"] and t,
                    timeout, f"trigger {name} to be {reason}")


def names_of(trigger: dict[str, Any], operator_id: str = "shared") -> TriggerNames:
    meta = trigger["metadata"]
    return TriggerNames(meta["namespace"], meta["name"], meta["uid"], operator_id)


def runs_of(cluster: LocalCluster, namespace: str, trigger: str) -> dict[str, dict[str, Any]]:
    out = cluster.kubectl("get", "mtrlruns", "-n", namespace, "-l", f"mtrl.dev/trigger={trigger}",
                          "-o", "json")
    return {r["metadata"]["name"]: r for r in json.loads(out.stdout)["items"]}


def outcomes(cluster: LocalCluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(key, outcome, reason) of the trigger's recent objects, oldest first."""
    trigger = get_trigger(cluster, namespace, name) or {}
    return [(o["key"], o["outcome"], o.get("reason", ""))
            for o in (trigger.get("status") or {}).get("recentObjects", [])]


def events(cluster: LocalCluster, namespace: str, name: str) -> list[tuple[str, str]]:
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={name},involvedObject.kind=MultiTurnRLTrigger",
                          "-o", "json")
    return [(e["reason"], e["message"]) for e in json.loads(out.stdout)["items"]]


def queue_exists(name: str) -> bool:
    sqs = boto3.client("sqs")
    try:
        sqs.get_queue_url(QueueName=name)
    except sqs.exceptions.QueueDoesNotExist:
        return False
    return True


def notification_ids(bucket: str) -> set[str]:
    config = boto3.client("s3").get_bucket_notification_configuration(Bucket=bucket)
    return {q["Id"] for q in config.get("QueueConfigurations", [])}
