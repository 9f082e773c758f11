"""S3 event notifications as they arrive in SQS: object events, a test event, or malformed.

Three envelopes carry the same news: S3's own notification (`{"Records": [...]}`, keys
URL-encoded with '+' for a space), the same wrapped in an SNS notification, and EventBridge's
"Object Created" event (keys as they are). S3 sends `s3:TestEvent` when a notification
configuration is saved; it carries no object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus


class MalformedNotification(ValueError):
    """A message that is not any notification we know; it goes to the dead-letter queue."""


@dataclass(frozen=True)
class ObjectEvent:
    bucket: str
    key: str  # decoded
    etag: str  # without quotes; empty for events that carry none (deletions)
    event_name: str  # e.g. ObjectCreated:Put, ObjectRemoved:Delete
    version_id: str | None = None
    sequencer: str | None = None

    @property
    def created(self) -> bool:
        return self.event_name.startswith("ObjectCreated")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class Notification:
    objects: tuple[ObjectEvent, ...] = ()
    test_event: bool = False


def _str(node: dict[str, Any], field: str, where: str) -> str:
    value = node.get(field)
    if not isinstance(value, str) or not value:
        raise MalformedNotification(f"{where}.{field} is missing or not a string")
    return value


def _optional(node: dict[str, Any], field: str) -> str | None:
    value = node.get(field)
    return value if isinstance(value, str) and value else None


def _dict(node: dict[str, Any], field: str, where: str) -> dict[str, Any]:
    value = node.get(field)
    if not isinstance(value, dict):
        raise MalformedNotification(f"{where}.{field} is missing or not an object")
    return value


def _etag(obj: dict[str, Any], field: str, where: str, created: bool) -> str:
    """Required for a creation (it is half the object's identity); deletions carry none."""
    etag = _str(obj, field, where) if created else _optional(obj, field) or ""
    return etag.strip('"')


def _record(record: Any, index: int) -> ObjectEvent:
    where = f"Records[{index}]"
    if not isinstance(record, dict):
        raise MalformedNotification(f"{where} is not an object")
    event_name = _str(record, "eventName", where)
    s3 = _dict(record, "s3", where)
    obj = _dict(s3, "object", f"{where}.s3")
    return ObjectEvent(
        bucket=_str(_dict(s3, "bucket", f"{where}.s3"), "name", f"{where}.s3.bucket"),
        key=unquote_plus(_str(obj, "key", f"{where}.s3.object")),
        etag=_etag(obj, "eTag", f"{where}.s3.object", event_name.startswith("ObjectCreated")),
        event_name=event_name,
        version_id=_optional(obj, "versionId"), sequencer=_optional(obj, "sequencer"))


def _eventbridge(doc: dict[str, Any]) -> ObjectEvent:
    detail = _dict(doc, "detail", "event")
    obj = _dict(detail, "object", "detail")
    kind = _str(doc, "detail-type", "event")
    created = kind == "Object Created"
    return ObjectEvent(
        bucket=_str(_dict(detail, "bucket", "detail"), "name", "detail.bucket"),
        key=_str(obj, "key", "detail.object"),
        etag=_etag(obj, "etag", "detail.object", created),
        event_name=f"ObjectCreated:{detail.get('reason', '')}" if created
        else kind.replace(" ", ""),
        version_id=_optional(obj, "version-id"), sequencer=_optional(obj, "sequencer"))


def parse(body: str) -> Notification:
    """One SQS message body; raises MalformedNotification with what is wrong."""
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedNotification(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedNotification(f"a JSON {type(doc).__name__}, not an object")
    if doc.get("Type") == "Notification" and isinstance(doc.get("Message"), str):
        return parse(doc["Message"])  # S3 -> SNS -> SQS
    if doc.get("Event") == "s3:TestEvent":
        return Notification(test_event=True)
    if "Records" in doc:
        records = doc["Records"]
        if not isinstance(records, list) or not records:
            raise MalformedNotification("Records is not a non-empty list")
        return Notification(objects=tuple(_record(r, i) for i, r in enumerate(records)))
    if doc.get("source") == "aws.s3" and "detail" in doc:
        return Notification(objects=(_eventbridge(doc),))
    raise MalformedNotification("neither S3 event records, an s3:TestEvent nor an "
                                "EventBridge S3 event")
