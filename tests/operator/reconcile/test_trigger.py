"""Triggers' pure parts: notification parsing, admission, history, status and request bodies."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest

from mtrl_api.run import MultiTurnRLRunSpec, Phase
from mtrl_api.trigger import (
    PROCESSED_OBJECTS_MAX,
    RECENT_OBJECTS_MAX,
    MultiTurnRLTriggerSpec,
    MultiTurnRLTriggerStatus,
    ObjectOutcome,
)
from mtrl_operator.builders import triggers as build
from mtrl_operator.naming import TriggerNames, object_hash
from mtrl_operator.reconcile import trigger as reconcile_trigger
from mtrl_operator.reconcile.notifications import (
    MalformedNotification,
    ObjectEvent,
    parse,
)
from mtrl_operator.reconcile.trigger import Admission, QueueState, RunView

NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
NAMES = TriggerNames("team-a", "wordle-data", "0b7c8a52-1f0e-4d59-9c1e-5b0f8a2f6e11", "ops")
TEMPLATE: dict[str, Any] = {
    "model": {"name": "Qwen/Qwen3-8B"},
    "rollout": {"environment": "wordle"},
    "output": {"s3Uri": "s3://outputs/wordle"},
}


def spec(**overrides: Any) -> MultiTurnRLTriggerSpec:
    return MultiTurnRLTriggerSpec.model_validate({
        "source": {"s3": {"bucket": "data", "prefix": "training-data/"}},
        "runTemplate": {"spec": TEMPLATE}, **overrides})


def obj(key: str = "training-data/a.jsonl", etag: str = "e1", bucket: str = "data",
        event: str = "ObjectCreated:Put") -> ObjectEvent:
    return ObjectEvent(bucket=bucket, key=key, etag=etag, event_name=event)


def s3_body(key: str, etag: str = "8a80554c91d9fca8acb82f023de02f11", bucket: str = "data",
            **extra: str) -> str:
    """What S3 (and moto) put in the queue for one upload: the key URL-encoded."""
    return json.dumps({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-west-2",
        "eventTime": "2025-01-01T00:00:00.000Z", "eventName": "ObjectCreated:Put",
        "s3": {"s3SchemaVersion": "1.0", "configurationId": "mtrl-x",
               "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
               "object": {"key": key, "size": 3, "eTag": etag, **extra}}}]})


# ----------------------------------------------------------------------------- notifications


def test_moto_and_s3_keys_are_url_decoded() -> None:
    (event,) = parse(s3_body("data%2Fa+b%2Bc.jsonl")).objects  # moto encodes '/' too
    assert event.key == "data/a b+c.jsonl"
    (event,) = parse(s3_body("training-data/a+b%2Bc.jsonl", versionId="v1",
                             sequencer="0A1B")).objects
    assert (event.key, event.version_id, event.sequencer) == ("training-data/a b+c.jsonl", "v1",
                                                              "0A1B")
    assert event.created and event.uri == "s3://data/training-data/a b+c.jsonl"


def test_sns_envelope_and_eventbridge_are_understood() -> None:
    wrapped = json.dumps({"Type": "Notification", "Message": s3_body("k.jsonl")})
    assert parse(wrapped).objects[0].key == "k.jsonl"
    bridge = json.dumps({"version": "0", "detail-type": "Object Created", "source": "aws.s3",
                         "detail": {"bucket": {"name": "data"}, "reason": "PutObject",
                                    "object": {"key": "a b.jsonl", "etag": "e",
                                               "version-id": "v"}}})
    (event,) = parse(bridge).objects
    assert (event.key, event.etag, event.version_id, event.created) == ("a b.jsonl", "e", "v",
                                                                        True)


def test_test_event_carries_no_object() -> None:
    note = parse(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "data"}))
    assert note.test_event and note.objects == ()


def test_a_deletion_needs_no_etag_and_is_not_a_creation() -> None:
    body = json.loads(s3_body("k.jsonl"))
    body["Records"][0]["eventName"] = "ObjectRemoved:Delete"
    del body["Records"][0]["s3"]["object"]["eTag"]
    (event,) = parse(json.dumps(body)).objects
    assert not event.created and event.etag == ""


@pytest.mark.parametrize(("body", "complaint"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "a JSON list"),
    ('{"hello": "world"}', "neither S3 event records"),
    ('{"Records": []}', "non-empty list"),
    ('{"Records": ["x"]}', "Records[0] is not an object"),
    ('{"Records": [{"eventName": "ObjectCreated:Put"}]}', "Records[0].s3 is missing"),
    ('{"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "b"},'
     ' "object": {"key": "k"}}}]}', "Records[0].s3.object.eTag is missing"),
    ('{"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": "b"},'
     ' "object": {"key": 7, "eTag": "e"}}}]}', "Records[0].s3.object.key is missing"),
], ids=["json", "list", "unknown", "empty", "record", "s3", "etag", "key-type"])
def test_malformed_bodies_say_what_is_wrong(body: str, complaint: str) -> None:
    with pytest.raises(MalformedNotification, match=re.escape(complaint)):
        parse(body)


# ----------------------------------------------------------------------------- names


def test_run_names_are_a_function_of_key_and_etag() -> None:
    digest = object_hash("training-data/a.jsonl", '"e1"')
    assert digest == object_hash("training-data/a.jsonl", "e1")  # quotes do not matter
    assert digest != object_hash("training-data/a.jsonl", "e2")
    assert digest != object_hash("training-data/b.jsonl", "e1")
    assert NAMES.run_name(digest) == f"wordle-data-{digest}" and len(digest) == 10


def test_long_trigger_names_stay_apart_and_short() -> None:
    a = TriggerNames("ns", "x" * 60 + "a", "u1")
    b = TriggerNames("ns", "x" * 60 + "b", "u2")
    assert a.run_name("0123456789") != b.run_name("0123456789")
    assert len(a.run_name("0123456789")) <= 63


def test_trigger_queues_carry_no_run_uid_tag() -> None:
    """The runs' sweeper deletes queues whose run-uid names no run: never a trigger's."""
    tags = NAMES.tags("trigger-queue", "data")
    assert "mtrl.dev/run-uid" not in tags
    assert tags["mtrl.dev/trigger-uid"] == NAMES.uid and tags["mtrl.dev/source-bucket"] == "data"
    assert NAMES.queue.startswith("mtrl-trigger-") and len(NAMES.dead_letter_queue) <= 80


# ----------------------------------------------------------------------------- admission


def test_new_object_creates_a_run() -> None:
    admission = reconcile_trigger.admit(spec(), MultiTurnRLTriggerStatus(), [], obj(), NAMES)
    assert admission.outcome == ObjectOutcome.CREATED and admission.replace == ()
    assert admission.run == NAMES.run_name(object_hash("training-data/a.jsonl", "e1"))


@pytest.mark.parametrize(("event", "reason"), [
    (obj(key="other/a.jsonl"), "outside prefix 'training-data/'"),
    (obj(key="training-data/a.csv"), "does not end with '.jsonl'"),
    (obj(bucket="elsewhere"), "bucket elsewhere is not the watched bucket data"),
    (obj(event="ObjectRemoved:Delete"), "ObjectRemoved:Delete is not an object creation"),
], ids=["prefix", "suffix", "bucket", "deletion"])
def test_objects_outside_the_source_are_filtered(event: ObjectEvent, reason: str) -> None:
    admission = reconcile_trigger.admit(spec(), MultiTurnRLTriggerStatus(), [], event, NAMES)
    assert admission.outcome == ObjectOutcome.FILTERED and reason in admission.reason
    assert admission.run is None


def test_a_known_object_is_a_duplicate_with_or_without_its_run() -> None:
    first = reconcile_trigger.admit(spec(), MultiTurnRLTriggerStatus(), [], obj(), NAMES)
    status = reconcile_trigger.record(MultiTurnRLTriggerStatus(), obj(), first, NOW)
    assert reconcile_trigger.admit(spec(), status, [], obj(), NAMES).outcome == ObjectOutcome.DUPLICATE
    run = RunView(first.run or "", Phase.RUNNING, NOW)
    again = reconcile_trigger.admit(spec(), MultiTurnRLTriggerStatus(), [run], obj(), NAMES)
    assert again.outcome == ObjectOutcome.DUPLICATE and first.run in again.reason


def test_forbid_skips_while_a_run_is_active_and_says_which() -> None:
    forbid = spec(concurrencyPolicy="Forbid")
    busy = [RunView("wordle-data-aaaa", Phase.RUNNING, NOW),
            RunView("wordle-data-bbbb", Phase.SUCCEEDED, NOW)]
    admission = reconcile_trigger.admit(forbid, MultiTurnRLTriggerStatus(), busy, obj(), NAMES)
    assert admission.outcome == ObjectOutcome.SKIPPED
    assert "Forbid" in admission.reason and "wordle-data-aaaa" in admission.reason
    assert "bbbb" not in admission.reason
    idle = [RunView("wordle-data-aaaa", Phase.FAILED, NOW),
            RunView("wordle-data-cccc", Phase.RUNNING, NOW, deleting=True)]
    assert reconcile_trigger.admit(forbid, MultiTurnRLTriggerStatus(), idle, obj(),
                        NAMES).outcome == ObjectOutcome.CREATED


def test_replace_names_the_active_runs_and_allow_keeps_them() -> None:
    runs = [RunView("wordle-data-aaaa", Phase.PENDING, NOW),
            RunView("wordle-data-bbbb", Phase.FAILED, NOW)]
    replaced = reconcile_trigger.admit(spec(concurrencyPolicy="Replace"), MultiTurnRLTriggerStatus(), runs,
                            obj(), NAMES)
    assert replaced.outcome == ObjectOutcome.CREATED
    assert replaced.replace == ("wordle-data-aaaa",)
    allowed = reconcile_trigger.admit(spec(), MultiTurnRLTriggerStatus(), runs, obj(), NAMES)
    assert allowed.outcome == ObjectOutcome.CREATED and allowed.replace == ()


def test_record_keeps_bounded_lists_and_counts_created_runs() -> None:
    status = MultiTurnRLTriggerStatus()
    for i in range(PROCESSED_OBJECTS_MAX + 5):
        event = obj(key=f"training-data/{i}.jsonl")
        admission = reconcile_trigger.admit(spec(), status, [], event, NAMES)
        status = reconcile_trigger.record(status, event, admission, NOW)
    assert len(status.recent_objects) == RECENT_OBJECTS_MAX
    assert status.recent_objects[-1].key == f"training-data/{PROCESSED_OBJECTS_MAX + 4}.jsonl"
    assert len(status.processed_objects) == PROCESSED_OBJECTS_MAX
    assert status.processed_objects[-1] == object_hash(
        f"training-data/{PROCESSED_OBJECTS_MAX + 4}.jsonl", "e1")
    assert status.runs_created == PROCESSED_OBJECTS_MAX + 5 and status.last_trigger_time == NOW


def test_filtered_objects_are_shown_but_not_remembered() -> None:
    event = obj(key="other/a.jsonl")
    status = reconcile_trigger.record(MultiTurnRLTriggerStatus(), event,
                           Admission(ObjectOutcome.FILTERED, reason="outside"), NOW)
    assert status.recent_objects[0].outcome == ObjectOutcome.FILTERED
    assert status.processed_objects == [] and status.runs_created == 0
    assert status.last_trigger_time is None


# ----------------------------------------------------------------------------- history and status


def _finished(name: str, phase: Phase, minute: int, deleting: bool = False) -> RunView:
    return RunView(name, phase, NOW, NOW + dt.timedelta(minutes=minute), deleting)


def test_prune_keeps_the_newest_finished_runs_per_outcome() -> None:
    runs = [_finished("s1", Phase.SUCCEEDED, 1), _finished("s2", Phase.SUCCEEDED, 2),
            _finished("s3", Phase.SUCCEEDED, 3), _finished("f1", Phase.FAILED, 1),
            _finished("f2", Phase.FAILED, 2), _finished("f0", Phase.FAILED, 0, deleting=True),
            RunView("live", Phase.RUNNING, NOW)]
    limits = spec(successfulRunsHistoryLimit=2, failedRunsHistoryLimit=1)
    assert reconcile_trigger.prune(limits, runs) == ["s1", "f1"]
    nothing = spec(successfulRunsHistoryLimit=0, failedRunsHistoryLimit=0)
    assert sorted(reconcile_trigger.prune(nothing, runs)) == ["f1", "f2", "s1", "s2", "s3"]


def test_run_view_reads_the_watch_object() -> None:
    view = RunView.of({"metadata": {"name": "r", "creationTimestamp": "2025-01-01T00:00:00Z",
                                    "deletionTimestamp": "2025-01-01T00:01:00Z"},
                       "status": {"phase": "Succeeded",
                                  "completionTime": "2025-01-01T00:00:30Z"}})
    assert view.phase == Phase.SUCCEEDED and view.deleting and not view.active
    assert view.completed == NOW + dt.timedelta(seconds=30)
    assert RunView.of({"metadata": {"name": "new"}}).active  # no status yet: Pending


QUEUE = QueueState("http://sqs/123456789012/q", "arn:aws:sqs:us-west-2:123456789012:q", None)


@pytest.mark.parametrize(("trigger", "queue", "problem", "ready", "reason"), [
    (spec(), QUEUE, None, "True", "Watching"),
    (spec(), None, None, "False", "Provisioning"),
    (spec(suspend=True), QUEUE, None, "False", "Suspended"),
    (spec(), QUEUE, ("AwsError", "GetBucketNotificationConfiguration: AccessDenied"), "False",
     "AwsError"),
], ids=["watching", "provisioning", "suspended", "aws-error"])
def test_ready_condition(trigger: MultiTurnRLTriggerSpec, queue: QueueState | None,
                         problem: tuple[str, str] | None, ready: str, reason: str) -> None:
    runs = [RunView("b", Phase.RUNNING, NOW), RunView("a", Phase.PENDING, NOW),
            RunView("c", Phase.SUCCEEDED, NOW)]
    status = reconcile_trigger.observe(MultiTurnRLTriggerStatus(), trigger, 4, runs, queue, problem, NOW)
    (condition,) = status.conditions
    assert (condition.status, condition.reason, condition.observed_generation) == (ready, reason, 4)
    assert status.active == ["a", "b"] and status.active_count == 2
    assert status.observed_generation == 4


def test_observe_changes_nothing_when_nothing_changed() -> None:
    first = reconcile_trigger.observe(MultiTurnRLTriggerStatus(), spec(), 1, [], QUEUE, None, NOW)
    later = reconcile_trigger.observe(first, spec(), 1, [], QUEUE, None, NOW + dt.timedelta(hours=1))
    assert later.wire() == first.wire()  # so no status write


# ----------------------------------------------------------------------------- the run


def _trigger(template: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": NAMES.name, "namespace": NAMES.namespace, "uid": NAMES.uid},
            "spec": {"runTemplate": template}}


def test_the_run_trains_on_the_object_and_points_back_to_it() -> None:
    trigger = _trigger({"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
                        "spec": {**TEMPLATE, "dataset": {"s3": {"validationUri": "s3://eval-data/v.jsonl"},
                                                         "evalIntervalSteps": 5}}})
    event = ObjectEvent("data", "training-data/a b.jsonl", "e1", "ObjectCreated:Put", "v7")
    digest = object_hash(event.key, event.etag)
    run = build.run_manifest(trigger, NAMES, event, digest)
    assert run["metadata"]["name"] == NAMES.run_name(digest)
    assert run["spec"]["dataset"] == {"s3": {"trainUri": "s3://data/training-data/a b.jsonl",
                                             "validationUri": "s3://eval-data/v.jsonl"},
                                      "evalIntervalSteps": 5}
    assert run["metadata"]["labels"] == {"team": "a", "mtrl.dev/trigger": "wordle-data",
                                         "mtrl.dev/trigger-uid": NAMES.uid}
    assert run["metadata"]["annotations"] == {
        "note": "x", "mtrl.dev/source-bucket": "data", "mtrl.dev/source-key": event.key,
        "mtrl.dev/source-etag": "e1", "mtrl.dev/source-version-id": "v7"}
    (owner,) = run["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("MultiTurnRLTrigger",
                                                                  NAMES.uid, True)
    assert run["spec"]["output"]["s3Uri"] == "s3://outputs/wordle"  # each run has a folder in it
    MultiTurnRLRunSpec.model_validate(run["spec"])  # a valid run, dataset included
    assert trigger["spec"]["runTemplate"]["spec"].get("dataset", {}).get("s3", {}).get(
        "trainUri") is None, "the template itself is left alone"


def test_a_template_needs_no_dataset() -> None:
    assert spec().run_template.spec.dataset.s3.validation_uri is None
    run = build.run_manifest(_trigger({"spec": TEMPLATE}), NAMES, obj(), "0123456789")
    assert run["spec"]["dataset"] == {"s3": {"trainUri": "s3://data/training-data/a.jsonl"}}


# ----------------------------------------------------------------------------- AWS bodies


def test_queue_policy_lets_only_this_bucket_send() -> None:
    policy = json.loads(build.queue_policy("arn:aws:sqs:us-west-2:123456789012:q", "data"))
    (statement,) = policy["Statement"]
    assert statement["Principal"] == {"Service": "s3.amazonaws.com"}
    assert statement["Action"] == "sqs:SendMessage"
    assert statement["Condition"] == {"ArnLike": {"aws:SourceArn": "arn:aws:s3:::data"},
                                      "StringEquals": {"aws:SourceAccount": "123456789012"}}
    req = build.notification_queue(NAMES, "data", "arn:aws:sqs:us-west-2:123456789012:d")
    assert json.loads(req.attributes["RedrivePolicy"])["deadLetterTargetArn"].endswith(":d")
    assert json.loads(req.attributes["Policy"])["Statement"][0]["Resource"] == \
        f"arn:aws:sqs:us-west-2:123456789012:{NAMES.queue}"


def test_notification_entries_of_others_are_kept() -> None:
    theirs = {"Id": "theirs", "QueueArn": "arn:aws:sqs:us-west-2:1:other",
              "Events": ["s3:ObjectRemoved:*"]}
    current = build.notification_configuration({
        "ResponseMetadata": {"HTTPStatusCode": 200}, "QueueConfigurations": [theirs],
        "LambdaFunctionConfigurations": [{"Id": "fn", "LambdaFunctionArn": "arn:fn",
                                          "Events": ["s3:ObjectCreated:*"]}]})
    ours = build.queue_configuration(NAMES, spec().source.s3, "arn:aws:sqs:us-west-2:1:ours")
    assert ours["Filter"]["Key"]["FilterRules"] == [{"Name": "prefix", "Value": "training-data/"},
                                                    {"Name": "suffix", "Value": ".jsonl"}]
    merged = build.with_queue_configuration(current, ours)
    assert merged["QueueConfigurations"] == [theirs, ours]
    assert merged["LambdaFunctionConfigurations"] == current["LambdaFunctionConfigurations"]
    assert "ResponseMetadata" not in merged and not build.has_queue_configuration(current, ours)
    assert build.has_queue_configuration(merged, ours)
    moved = {**ours, "QueueArn": "arn:aws:sqs:us-west-2:1:moved"}
    assert build.with_queue_configuration(merged, moved)["QueueConfigurations"] == [theirs, moved]
    assert build.without_queue_configuration(merged, ours["Id"]) == current
    alone = build.without_queue_configuration({"QueueConfigurations": [ours]}, ours["Id"])
    assert alone == {}


def test_s3_capitalised_filter_names_count_as_ours() -> None:
    ours = build.queue_configuration(NAMES, spec().source.s3, "arn:q")
    echoed = {**ours, "Filter": {"Key": {"FilterRules": [
        {"Name": "Suffix", "Value": ".jsonl"}, {"Name": "Prefix", "Value": "training-data/"}]}}}
    assert build.has_queue_configuration({"QueueConfigurations": [echoed]}, ours)


def test_empty_prefix_is_left_out_of_the_filter() -> None:
    source = spec(source={"s3": {"bucket": "data", "suffix": ""}}).source.s3
    assert "Filter" not in build.queue_configuration(NAMES, source, "arn:q")
