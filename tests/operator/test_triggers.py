"""MultiTurnRLTrigger against the real API server and moto's S3 and SQS.

moto in server mode delivers S3 event notifications to SQS on PutObject (with the bucket's
prefix and suffix filters applied, and an s3:TestEvent when a configuration is saved), so these
tests upload real objects. Where a test needs a message S3 would never send (a redelivery, an
object outside the filter, garbage) it sends the body itself.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import boto3
import pytest

from mtrl_operator.naming import TriggerNames, object_hash
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import (
    SUCCEED,
    apply,
    condition,
    get,
    wait_for,
    wait_phase,
)
from tests.operator.triggers import (
    events,
    get_trigger,
    names_of,
    new_bucket,
    notification_ids,
    outcomes,
    queue_exists,
    run_template,
    runs_of,
    s3_notification,
    trigger_manifest,
    upload,
    wait_reason,
)

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]


def _foreign_configuration(bucket: str) -> dict:
    """Somebody else's entry in the bucket's notification configuration: it must survive."""
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName=f"someone-else-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"]
    entry = {"Id": "someone-else", "QueueArn": arn, "Events": ["s3:ObjectRemoved:*"]}
    boto3.client("s3").put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration={"QueueConfigurations": [entry]})
    return entry


def _reasons(cluster: LocalCluster, namespace: str, name: str) -> list[str]:
    return [reason for reason, _ in events(cluster, namespace, name)]


def test_the_api_server_checks_triggers(cluster: LocalCluster, namespace: str) -> None:
    bucket = "mtrl-trg-checks"
    both = trigger_manifest("both", bucket, queue={"create": True, "url": (
        "http://127.0.0.1:1/123456789012/q")})
    out = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(both), check=False)
    assert out.returncode != 0 and "set exactly one of create" in out.stderr
    nothing = trigger_manifest("nothing", bucket, queue={})
    out = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(nothing),
                          check=False)
    assert out.returncode != 0 and "set exactly one of create" in out.stderr
    bad_template = trigger_manifest("bad", bucket, template=run_template(grpo={"groupSize": 1}))
    out = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(bad_template),
                          check=False)
    assert out.returncode != 0 and "spec.runTemplate.spec.grpo.groupSize" in out.stderr
    # Defaults come from the models; the bucket and the queue cannot change afterwards.
    made = apply(cluster, namespace, trigger_manifest("fine", bucket, suspend=True))
    assert made["spec"]["queue"] == {"create": True}
    assert made["spec"]["concurrencyPolicy"] == "Allow"
    assert made["spec"]["source"]["s3"]["suffix"] == ".jsonl"
    assert made["spec"]["runTemplate"]["spec"]["dataset"] == {"s3": {}, "evalIntervalSteps": 10}
    out = cluster.kubectl("patch", "mtrltrigger", "fine", "-n", namespace, "--type=merge", "-p",
                          '{"spec":{"source":{"s3":{"bucket":"elsewhere"}}}}', check=False)
    assert out.returncode != 0 and "spec.source.s3.bucket is immutable" in out.stderr
    explained = cluster.kubectl("explain", "mtrltrigger.spec.concurrencyPolicy").stdout
    assert "Forbid skips the object" in " ".join(explained.split())


def test_uploads_start_one_run_each_and_repeats_start_none(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    bucket = new_bucket()
    theirs = _foreign_configuration(bucket)
    apply(cluster, namespace, trigger_manifest("uploads", bucket))
    trigger = wait_reason(cluster, namespace, "uploads")
    names = names_of(trigger)
    assert notification_ids(bucket) == {"someone-else", names.notification_id}
    config = boto3.client("s3").get_bucket_notification_configuration(Bucket=bucket)
    assert theirs in config["QueueConfigurations"]

    keys = ["incoming/one.jsonl", "incoming/two words+plus.jsonl", "incoming/deep/three.jsonl"]
    etags = {key: upload(bucket, key, body=key.encode()) for key in keys}
    expected = {names.run_name(object_hash(k, e)): k for k, e in etags.items()}
    runs = wait_for(lambda: (r := runs_of(cluster, namespace, "uploads")) and len(r) >= 3 and r,
                    60, "three runs")
    assert set(runs) == set(expected)
    for name, run in runs.items():
        key = expected[name]
        assert run["spec"]["dataset"]["s3"]["trainUri"] == f"s3://{bucket}/{key}"
        assert run["spec"]["output"]["s3Uri"] == "s3://mtrl-test-outputs/runs"
        assert run["metadata"]["annotations"]["mtrl.dev/source-key"] == key
        assert run["metadata"]["annotations"]["mtrl.dev/source-etag"] == etags[key]
        (owner,) = run["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"]) == ("MultiTurnRLTrigger", names.uid)

    # The same notification again (SQS redelivers), and the same bytes uploaded again.
    queue_url = trigger["status"]["queueUrl"]
    sqs = boto3.client("sqs")
    sqs.send_message(QueueUrl=queue_url, MessageBody=s3_notification(
        bucket, keys[1], etags[keys[1]]))
    assert upload(bucket, keys[0], body=keys[0].encode()) == etags[keys[0]]
    wait_for(lambda: sum(o == "Duplicate" for _, o, _ in outcomes(cluster, namespace, "uploads"))
             >= 2, 60, "two duplicates recorded")
    # Outside the prefix or the suffix: S3 does not send these (its filter), but a queue
    # shared with other notifications would, so the operator filters as well.
    for key in ("elsewhere/four.jsonl", "incoming/five.csv"):
        etag = upload(bucket, key)
        sqs.send_message(QueueUrl=queue_url, MessageBody=s3_notification(bucket, key, etag))
    wait_for(lambda: sum(o == "Filtered" for _, o, _ in outcomes(cluster, namespace, "uploads"))
             >= 2, 60, "two filtered objects recorded")

    assert set(runs_of(cluster, namespace, "uploads")) == set(expected)
    recorded = outcomes(cluster, namespace, "uploads")
    assert sorted(k for k, o, _ in recorded if o == "Created") == sorted(keys)
    assert sorted(k for k, o, _ in recorded if o == "Duplicate") == sorted(keys[:2])
    filtered = {k: why for k, o, why in recorded if o == "Filtered"}
    assert "outside prefix 'incoming/'" in filtered["elsewhere/four.jsonl"]
    assert "does not end with '.jsonl'" in filtered["incoming/five.csv"]
    trigger = wait_for(lambda: (t := get_trigger(cluster, namespace, "uploads"))
                       and t["status"].get("activeCount") == 3 and t, 30, "three active runs")
    assert trigger["status"]["runsCreated"] == 3 and trigger["status"]["lastTriggerTime"]
    assert _reasons(cluster, namespace, "uploads").count("RunCreated") == 3

    out = cluster.kubectl("get", "mtrltriggers", "-n", namespace).stdout.splitlines()
    assert out[0].split() == ["NAME", "BUCKET", "PREFIX", "POLICY", "ACTIVE", "LAST", "TRIGGER",
                              "SUSPENDED", "AGE"]
    assert out[1].split()[:6] == ["uploads", bucket, "incoming/", "Allow", "3",
                                  out[1].split()[5]]
    assert out[1].split()[6] == "false"


def test_forbid_skips_while_a_run_is_active_and_says_why(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    bucket = new_bucket()
    apply(cluster, namespace, trigger_manifest("single", bucket, concurrencyPolicy="Forbid"))
    wait_reason(cluster, namespace, "single")
    # Back to back: one batch or two, exactly one of them starts a run.
    upload(bucket, "incoming/first.jsonl")
    upload(bucket, "incoming/second.jsonl")
    recorded = wait_for(lambda: (o := outcomes(cluster, namespace, "single")) and len(o) >= 2
                        and o, 60, "both objects to be decided")
    assert sorted(o for _, o, _ in recorded) == ["Created", "Skipped"]
    (first,) = runs_of(cluster, namespace, "single")
    (skipped_key, _, why) = next(r for r in recorded if r[1] == "Skipped")
    assert "Forbid" in why and first in why
    (message,) = [m for r, m in events(cluster, namespace, "single") if r == "RunSkipped"]
    assert skipped_key in message and first in message
    # Once no run is active, the next upload starts one.
    cluster.kubectl("delete", "mtrlrun", first, "-n", namespace, "--timeout=60s")
    upload(bucket, "incoming/third.jsonl")
    (third,) = wait_for(lambda: runs_of(cluster, namespace, "single"), 60, "the third run")
    assert third != first


def test_replace_deletes_the_active_run(cluster: LocalCluster, operator: OperatorProcess,
                                        namespace: str) -> None:
    bucket = new_bucket()
    apply(cluster, namespace, trigger_manifest("latest", bucket, concurrencyPolicy="Replace"))
    wait_reason(cluster, namespace, "latest")
    upload(bucket, "incoming/old.jsonl")
    (old,) = wait_for(lambda: runs_of(cluster, namespace, "latest"), 60, "the first run")
    upload(bucket, "incoming/new.jsonl")
    runs = wait_for(lambda: (r := runs_of(cluster, namespace, "latest")) and old not in r and r,
                    60, "the old run to be replaced")
    (new,) = runs
    assert runs[new]["metadata"]["annotations"]["mtrl.dev/source-key"] == "incoming/new.jsonl"
    (message,) = [m for r, m in events(cluster, namespace, "latest") if r == "RunReplaced"]
    assert old in message


def test_failed_runs_beyond_the_history_limit_are_deleted(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    bucket = new_bucket()
    doomed = run_template(rollout={"environment": "chess"})  # fails at once: no such plug-in
    apply(cluster, namespace, trigger_manifest("doomed", bucket, template=doomed,
                                               failedRunsHistoryLimit=1))
    queue_url = wait_reason(cluster, namespace, "doomed")["status"]["queueUrl"]
    etags = {key: upload(bucket, key) for key in ("incoming/a.jsonl", "incoming/b.jsonl",
                                                  "incoming/c.jsonl")}
    wait_for(lambda: (t := get_trigger(cluster, namespace, "doomed"))
             and t["status"].get("runsCreated") == 3, 60, "three runs created")
    left = wait_for(lambda: (r := runs_of(cluster, namespace, "doomed")) and len(r) == 1
                    and all((x.get("status") or {}).get("phase") == "Failed" for x in r.values())
                    and r, 90, "one failed run kept")
    pruned = [m for r, m in events(cluster, namespace, "doomed") if r == "HistoryPruned"]
    assert pruned and sum(m.count("doomed-") for m in pruned) == 2
    # A late redelivery for an object whose run was pruned still starts nothing.
    (kept,) = left.values()
    gone = next(k for k in etags if k != kept["metadata"]["annotations"]["mtrl.dev/source-key"])
    boto3.client("sqs").send_message(QueueUrl=queue_url,
                                     MessageBody=s3_notification(bucket, gone, etags[gone]))
    wait_for(lambda: (gone, "Duplicate") in {(k, o) for k, o, _ in outcomes(
        cluster, namespace, "doomed")}, 60, "the redelivery to be recorded as a duplicate")
    assert set(runs_of(cluster, namespace, "doomed")) == set(left)
    assert get_trigger(cluster, namespace, "doomed")["status"]["runsCreated"] == 3


def test_deleting_the_trigger_removes_its_queues_and_entry_and_keeps_outputs(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    """Real runs (workers and a trainer that finishes at once); the older succeeded run is
    pruned by successfulRunsHistoryLimit: 1, and its output stays."""
    bucket = new_bucket()
    theirs = _foreign_configuration(bucket)
    template = run_template(trainer={"command": SUCCEED},
                            output={"s3Uri": f"s3://{bucket}/outputs"})
    apply(cluster, namespace, trigger_manifest("tidy", bucket, template=template,
                                               successfulRunsHistoryLimit=1))
    names = names_of(wait_reason(cluster, namespace, "tidy"))
    s3 = boto3.client("s3")

    upload(bucket, "incoming/a.jsonl")
    (first,) = wait_for(lambda: runs_of(cluster, namespace, "tidy"), 60, "the first run")
    wait_phase(cluster, namespace, first, "Succeeded", timeout=120)
    # What the trainer would have written in the run's own output folder.
    output_uri = get(cluster, namespace, first)["status"]["outputUri"]
    assert output_uri.startswith(f"s3://{bucket}/outputs/{namespace}/{first}/")
    output_key = f"{output_uri.split('/', 3)[3]}/adapter/adapter_model.safetensors"
    s3.put_object(Bucket=bucket, Key=output_key, Body=b"weights")
    upload(bucket, "incoming/b.jsonl")
    second = wait_for(lambda: [n for n in runs_of(cluster, namespace, "tidy") if n != first], 60,
                      "the second run")[0]
    wait_phase(cluster, namespace, second, "Succeeded", timeout=120)
    wait_for(lambda: get(cluster, namespace, first) is None, 60, "the older run to be pruned")
    assert "HistoryPruned" in _reasons(cluster, namespace, "tidy")
    assert condition(get(cluster, namespace, second) or {}, "Complete")["status"] == "True"

    cluster.kubectl("delete", "mtrltrigger", "tidy", "-n", namespace, "--timeout=60s")
    assert get_trigger(cluster, namespace, "tidy") is None
    assert not queue_exists(names.queue) and not queue_exists(names.dead_letter_queue)
    config = s3.get_bucket_notification_configuration(Bucket=bucket)
    assert config.get("QueueConfigurations") == [theirs]
    wait_for(lambda: not runs_of(cluster, namespace, "tidy"), 60,
             "the garbage collector to delete the trigger's runs")
    kept = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert {"incoming/a.jsonl", "incoming/b.jsonl", output_key} <= kept


def test_malformed_notification_goes_to_the_dead_letter_queue(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    bucket = new_bucket()
    apply(cluster, namespace, trigger_manifest("careful", bucket))
    status = wait_reason(cluster, namespace, "careful")["status"]
    sqs = boto3.client("sqs")
    garbage = "this is no S3 event " + uuid.uuid4().hex
    message_id = sqs.send_message(QueueUrl=status["queueUrl"], MessageBody=garbage)["MessageId"]

    def dead_lettered() -> dict | None:
        got = sqs.receive_message(QueueUrl=status["deadLetterQueueUrl"], WaitTimeSeconds=1,
                                  MessageAttributeNames=["All"]).get("Messages", [])
        return next((m for m in got if m["Body"] == garbage), None)

    letter = wait_for(dead_lettered, 60, "the malformed message in the dead-letter queue")
    assert "not JSON" in letter["MessageAttributes"]["mtrl-error"]["StringValue"]
    assert letter["MessageAttributes"]["mtrl-trigger"]["StringValue"] == f"{namespace}/careful"
    (warning,) = [m for r, m in events(cluster, namespace, "careful")
                  if r == "MalformedNotification"]
    assert message_id in warning
    wait_for(lambda: any(message_id in line and "malformed notification" in line
                         for line in operator.log_path.read_text().splitlines()), 10,
             "a log line about the malformed message")
    # The trigger keeps working.
    upload(bucket, "incoming/after.jsonl")
    wait_for(lambda: runs_of(cluster, namespace, "careful"), 60, "a run after the garbage")


def test_a_suspended_trigger_keeps_uploads_until_resumed(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    bucket = new_bucket()
    apply(cluster, namespace, trigger_manifest("paused", bucket, suspend=True))
    trigger = wait_reason(cluster, namespace, "paused", reason="Suspended")
    queue_url = trigger["status"]["queueUrl"]
    upload(bucket, "incoming/waiting.jsonl")
    sqs = boto3.client("sqs")

    def waiting() -> int:
        attrs = sqs.get_queue_attributes(QueueUrl=queue_url,
                                         AttributeNames=["ApproximateNumberOfMessages"])
        return int(attrs["Attributes"]["ApproximateNumberOfMessages"])

    # S3's test event and the upload, both left in the queue.
    wait_for(lambda: waiting() >= 2, 60, "the notifications to wait in the queue")
    assert not runs_of(cluster, namespace, "paused")
    cluster.kubectl("patch", "mtrltrigger", "paused", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"suspend":false}}')
    (run,) = wait_for(lambda: runs_of(cluster, namespace, "paused"), 60, "the run on resume")
    assert get(cluster, namespace, run)["metadata"]["annotations"][
        "mtrl.dev/source-key"] == "incoming/waiting.jsonl"
    wait_for(lambda: waiting() == 0, 60, "the queue to be drained")


def test_a_queue_given_by_the_user_is_consumed_and_kept(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    bucket = new_bucket()
    sqs = boto3.client("sqs")
    suffix = uuid.uuid4().hex[:8]
    dlq = sqs.create_queue(QueueName=f"user-dlq-{suffix}")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName=f"user-events-{suffix}", Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3})})[
        "QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"]
    boto3.client("s3").put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration={"QueueConfigurations": [
            {"Id": "mine", "QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]})
    apply(cluster, namespace, trigger_manifest("byo", bucket, queue={"url": url}))
    status = wait_reason(cluster, namespace, "byo")["status"]
    assert (status["queueUrl"], status["deadLetterQueueUrl"]) == (url, dlq)
    assert notification_ids(bucket) == {"mine"}, "the operator leaves the bucket alone"
    upload(bucket, "incoming/byo.jsonl")
    wait_for(lambda: runs_of(cluster, namespace, "byo"), 60, "a run from the user's queue")
    cluster.kubectl("delete", "mtrltrigger", "byo", "-n", namespace, "--timeout=60s")
    assert queue_exists(f"user-events-{suffix}") and queue_exists(f"user-dlq-{suffix}")
    assert notification_ids(bucket) == {"mine"}


def test_orphaned_trigger_queues_are_swept(cluster: LocalCluster,
                                           operator: OperatorProcess) -> None:
    bucket = new_bucket()
    theirs = _foreign_configuration(bucket)
    sqs, s3 = boto3.client("sqs"), boto3.client("s3")
    ghost = TriggerNames("t-gone", "ghost", str(uuid.uuid4()), "shared", cluster.identity())
    stranger = TriggerNames("t-gone", "ghost", str(uuid.uuid4()), "someone-else",
                            cluster.identity())
    # Untagged until the bucket points at the ghost, so the sweeper cannot take the queues
    # before the notification entry it must also remove is there.
    urls = {queue: sqs.create_queue(QueueName=queue)["QueueUrl"]
            for names in (ghost, stranger) for queue in (names.queue, names.dead_letter_queue)}
    arn = sqs.get_queue_attributes(QueueUrl=urls[ghost.queue],
                                   AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={
        "QueueConfigurations": [theirs, {"Id": ghost.notification_id, "QueueArn": arn,
                                         "Events": ["s3:ObjectCreated:*"]}]})
    for names in (ghost, stranger):
        for queue in (names.queue, names.dead_letter_queue):
            sqs.tag_queue(QueueUrl=urls[queue], Tags=names.tags("trigger-queue", bucket))
    wait_for(lambda: not queue_exists(ghost.queue) and not queue_exists(ghost.dead_letter_queue),
             30, "the orphaned trigger queues to be swept")
    assert notification_ids(bucket) == {"someone-else"}
    assert queue_exists(stranger.queue), "another operator's queues are not ours to sweep"
    for queue in (stranger.queue, stranger.dead_letter_queue):
        sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=queue)["QueueUrl"])


def test_a_crash_after_creating_a_run_creates_no_second_one(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess]) -> None:
    """The operator dies right after creating a run: before the status records it and before
    the message is deleted. The message comes back to a new operator, which creates nothing."""
    namespace = f"trg-crash-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    env = {"MTRL_OPERATOR_ID": "trg-crash", "MTRL_NAMESPACES": namespace,
           "MTRL_SWEEP_INTERVAL_SECONDS": "0"}
    bucket = new_bucket()
    apply(cluster, namespace, trigger_manifest("crashy", bucket))
    first = operator_factory(MTRL_CRASH_AFTER_STEP="create MultiTurnRLRun", **env)
    second = None
    try:
        queue_url = wait_reason(cluster, namespace, "crashy")["status"]["queueUrl"]
        sqs = boto3.client("sqs")

        def in_queue() -> int:
            attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=[
                "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
            return sum(int(v) for v in attrs["Attributes"].values())

        # The message the crash leaves in flight should be back after 2 s, not 60. A receive
        # keeps the timeout it started with, so end the poll in flight with a test event.
        sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"VisibilityTimeout": "2"})
        sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(
            {"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": bucket}))
        wait_for(lambda: in_queue() == 0, 30, "the test event to be consumed")
        upload(bucket, "incoming/once.jsonl")
        wait_for(lambda: not first.alive, 60, "the crash right after the run was created")
        assert first.wait(5) == 137
        (run,) = runs_of(cluster, namespace, "crashy")
        assert not outcomes(cluster, namespace, "crashy"), "the crash came before the status"

        second = operator_factory(**env)
        wait_for(lambda: ("incoming/once.jsonl", "Duplicate") in {
            (k, o) for k, o, _ in outcomes(cluster, namespace, "crashy")}, 60,
            "the redelivered notification to be recorded as a duplicate")
        assert set(runs_of(cluster, namespace, "crashy")) == {run}
        wait_for(lambda: in_queue() == 0, 30, "the message to be deleted at last")
        cluster.kubectl("delete", "mtrltrigger", "crashy", "-n", namespace, "--timeout=60s")
    finally:
        first.stop()
        if second is not None:
            second.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
