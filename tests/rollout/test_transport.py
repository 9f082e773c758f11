"""SQS transport against the moto server: batching, heartbeat, dead-lettering, dedupe."""

import asyncio
import dataclasses
import json
import logging

import pytest

from mtrl_rollout.batching import Outbox
from mtrl_rollout.deadletter import dead_letter
from mtrl_rollout.generation import GenerationServer
from mtrl_rollout.leases import LeaseKeeper
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import (
    ChatMessage,
    GenerateRequest,
    MetricEntry,
    RolloutResult,
    StopReason,
    encode,
)
from mtrl_rollout.queues import TAG_MANAGED_BY, TAG_RUN_UID, queue_name
from mtrl_rollout.results import ResultCollector
from mtrl_rollout.sqs import Outgoing, Sqs

pytestmark = pytest.mark.aws


def _result(sample: str, reward: float = 1.0) -> RolloutResult:
    return RolloutResult(
        run_id="uid",
        step=0,
        group_id="g",
        sample_id=sample,
        policy_version=0,
        aggregate_reward_score=reward,
        stop_reason=StopReason.DONE,
        metrics_list=[MetricEntry(name="solved", value=reward, type="Reward")],
    )


async def _first_replies(sqs: Sqs, reply_url: str, polls: int) -> list:
    """The first messages to reach the reply queue, in at most `polls` one-second long polls."""
    for _ in range(polls):
        if replies := await sqs.receive(reply_url, wait_s=1):
            return replies
    return []


def _calls(sqs: Sqs, operation: str) -> list[int]:
    """Count calls of one SQS operation through botocore's event hooks."""
    counter: list[int] = []
    sqs.client.meta.events.register(f"before-call.sqs.{operation}", lambda **_: counter.append(1))
    return counter


def test_run_queues_have_redrive_and_tags(sqs_client, queues, prefix) -> None:
    attributes = sqs_client.get_queue_attributes(QueueUrl=queues.rollout_url, AttributeNames=["All"])[
        "Attributes"
    ]
    redrive = json.loads(attributes["RedrivePolicy"])
    assert int(redrive["maxReceiveCount"]) == 3 and redrive["deadLetterTargetArn"].endswith("-dlq")
    tags = sqs_client.list_queue_tags(QueueUrl=queues.rollout_url)["Tags"]
    assert tags[TAG_RUN_UID] == f"uid-{prefix}" and tags[TAG_MANAGED_BY] == "mtrl-operator"


def test_queue_names_are_valid_and_distinct_when_long() -> None:
    long_a, long_b = queue_name("p" * 70, "reply", "worker-a"), queue_name("p" * 70, "reply", "worker-b")
    assert len(long_a) == len(long_b) == 80 and long_a != long_b
    assert queue_name("run.x", "reply", "pod/1") == "run-x-reply-pod-1"


async def test_outbox_batches_concurrent_sends_and_deletes(aws_env, queues) -> None:
    sqs = Sqs(pool_size=8)
    outbox = Outbox(sqs, linger_s=0.01)
    batches = _calls(sqs, "SendMessageBatch")
    deletes = _calls(sqs, "DeleteMessageBatch")
    await asyncio.gather(*(outbox.send(queues.result_url, Outgoing(f"m{i}")) for i in range(45)))
    assert len(batches) == 5  # 45 messages, 10 per call
    received = []
    while len(received) < 45:
        received += await sqs.receive(queues.result_url, wait_s=1)
    assert sorted(m.body for m in received) == sorted(f"m{i}" for i in range(45))
    await asyncio.gather(*(outbox.delete(m.queue_url, m.receipt_handle) for m in received))
    assert len(deletes) == 5
    await asyncio.sleep(2.2)  # past the visibility timeout: deleted messages must not return
    assert await sqs.receive(queues.result_url, wait_s=0) == []
    await outbox.aclose()
    sqs.close()


async def test_heartbeat_keeps_a_long_episode_invisible(aws_env, queues) -> None:
    sqs = Sqs(pool_size=4)
    await sqs.send(queues.rollout_url, Outgoing("long episode"))
    [message] = await sqs.receive(queues.rollout_url, wait_s=1)
    leases = LeaseKeeper(sqs, queues.rollout_url, lease_s=2)
    leases.hold("s1", message.receipt_handle)
    keeper = asyncio.create_task(leases.run())
    await asyncio.sleep(4.5)  # more than two visibility timeouts
    assert await sqs.receive(queues.rollout_url, wait_s=0) == []
    keeper.cancel()
    await asyncio.sleep(2.5)  # without the heartbeat it comes back
    [again] = await sqs.receive(queues.rollout_url, wait_s=1)
    assert again.body == "long episode" and again.receive_count == 2
    sqs.close()


async def test_malformed_message_is_dead_lettered_at_once(aws_env, queues, caplog) -> None:
    sqs = Sqs(pool_size=4)
    await sqs.send(queues.rollout_url, Outgoing("{not json"))
    [message] = await sqs.receive(queues.rollout_url, wait_s=1)
    with caplog.at_level(logging.WARNING, logger="mtrl_rollout.deadletter"):
        await dead_letter(sqs, queues.dlq_url, message, "malformed: not JSON")
    assert f"moved message {message.message_id}" in caplog.text
    [dead] = await sqs.receive(queues.dlq_url, wait_s=1)
    assert dead.body == "{not json"
    assert dead.attributes["mtrl-dlq-reason"] == "malformed: not JSON"
    assert dead.attributes["mtrl-source-queue"] == queues.rollout_url
    await asyncio.sleep(2.2)
    assert await sqs.receive(queues.rollout_url, wait_s=0) == []
    sqs.close()


async def _redelivered(sqs: Sqs, queue_url: str) -> tuple[str, str]:
    """Receive a message, let its visibility lapse, receive it again: (stale, new) receipts."""
    await sqs.send(queue_url, Outgoing("episode"))
    [first] = await sqs.receive(queue_url, wait_s=1, visibility_timeout_s=1)
    again: list = []
    while not again:  # the long poll returns as soon as the lapsed message is visible again
        again = await sqs.receive(queue_url, wait_s=2, visibility_timeout_s=30)
    return first.receipt_handle, again[0].receipt_handle


async def test_a_stale_receipt_is_another_consumers_message_not_an_error(
        aws_env, queues, caplog) -> None:
    sqs = Sqs(pool_size=4)
    outbox = Outbox(sqs)
    stale, held = await _redelivered(sqs, queues.rollout_url)
    assert await outbox.delete(queues.rollout_url, held) is True  # the new holder finished it
    # The first holder, shutting down, hands its message back: SQS refuses the stale receipt.
    with caplog.at_level(logging.INFO, logger="mtrl_rollout.batching"):
        assert await outbox.release(queues.rollout_url, stale) is False
    assert "its receipt is stale (ReceiptHandleIsInvalid)" in caplog.text
    assert await sqs.receive(queues.rollout_url, wait_s=0) == []
    await outbox.aclose()
    sqs.close()


async def test_dead_lettering_survives_an_invalid_receipt(aws_env, queues, caplog) -> None:
    sqs = Sqs(pool_size=4)
    await sqs.send(queues.rollout_url, Outgoing("{not json"))
    [message] = await sqs.receive(queues.rollout_url, wait_s=1)
    lost = dataclasses.replace(message, receipt_handle="not-a-receipt")
    with caplog.at_level(logging.INFO, logger="mtrl_rollout.deadletter"):
        await dead_letter(sqs, queues.dlq_url, lost, "malformed: not JSON")
    assert "dead-lettered but not deleted: its receipt is stale" in caplog.text
    [dead] = await sqs.receive(queues.dlq_url, wait_s=1)
    assert dead.body == "{not json"
    sqs.close()


async def test_collector_keeps_one_result_per_sample(aws_env, queues) -> None:
    sqs = Sqs(pool_size=8)
    for body in [encode(_result("a")), encode(_result("a", 0.0)), encode(_result("b")), "junk"]:
        await sqs.send(queues.result_url, Outgoing(body))
    collector = ResultCollector(sqs, queues.result_url, queues.dlq_url)
    got = await collector.collect(["a", "b"], timeout_s=10)
    assert sorted(got) == ["a", "b"]
    # give the trailing copy time to arrive, then make sure it is dropped, not returned
    await sqs.send(queues.result_url, Outgoing(encode(_result("b", 0.5))))
    assert await collector.collect(["b"], timeout_s=3) == {}
    # Two copies were sent twice; SQS delivers at least once, so a loaded machine (a delete
    # that lands after the visibility timeout) may show a third.
    assert collector.duplicates >= 2 and collector.malformed == 1
    await collector.aclose()
    sqs.close()


async def test_collector_keeps_results_of_steps_played_ahead(aws_env, queues) -> None:
    """Asynchronous GRPO: while step 1 collects, results of step 2 (published ahead) arrive;
    they are kept for step 2's collect. Unexpected ones (a past step's stragglers) and
    forgotten ones are dropped."""
    sqs = Sqs(pool_size=8)
    collector = ResultCollector(sqs, queues.result_url, queues.dlq_url)
    collector.expect(["s1-0", "s2-0", "s2-1"])
    for sample in ["s2-0", "s0-9", "s2-1", "s1-0"]:
        await sqs.send(queues.result_url, Outgoing(encode(_result(sample))))
    assert sorted(await collector.collect(["s1-0"], timeout_s=10)) == ["s1-0"]
    collector.forget(["s1-0"])
    # step 2's were received (and deleted from the queue) by step 1's collect, or come now
    assert sorted(await collector.collect(["s2-0", "s2-1"], timeout_s=10)) == ["s2-0", "s2-1"]
    collector.forget(["s2-0", "s2-1"])
    await sqs.send(queues.result_url, Outgoing(encode(_result("s2-9"))))
    collector.expect(["s3-0"])
    await sqs.send(queues.result_url, Outgoing(encode(_result("s3-0"))))
    assert sorted(await collector.collect(["s3-0"], timeout_s=10)) == ["s3-0"]
    assert not collector._kept  # nothing unexpected was kept
    await collector.aclose()
    sqs.close()


async def test_generation_server_answers_on_the_named_reply_queue(
    aws_env, queues, sqs_client, prefix
) -> None:
    reply_url = sqs_client.create_queue(QueueName=f"{prefix}-reply-w1")["QueueUrl"]
    sqs = Sqs(pool_size=8)

    async def sample(request):
        from mtrl_rollout.generation import error_response

        return error_response(request, f"echo {request.messages[-1].content}")

    server = GenerationServer(sqs, queues.generate_url, queues.dlq_url, sample)
    stop = asyncio.Event()
    serving = asyncio.create_task(server.serve(stop))
    base = dict(
        run_id="uid", step=0, group_id="g", sample_id="s", policy_version=0, turn=0, reply_queue_url=reply_url
    )
    live = GenerateRequest(**base, request_id="live", messages=[ChatMessage(role="user", content="hi")])
    expired = GenerateRequest(
        **base, request_id="old", deadline=1.0, messages=[ChatMessage(role="user", content="late")]
    )
    await sqs.send(queues.generate_url, Outgoing(encode(expired)))
    await sqs.send(queues.generate_url, Outgoing(encode(live)))
    replies = await _first_replies(sqs, reply_url, polls=10)
    await asyncio.sleep(0.5)
    replies += await sqs.receive(reply_url, wait_s=0)
    stop.set()
    await serving
    assert [json.loads(m.body)["request_id"] for m in replies] == ["live"]
    assert json.loads(replies[0].body)["error"] == "echo hi"
    sqs.close()


async def test_a_short_completion_is_not_held_back_by_a_long_one_received_with_it(
    aws_env, queues, sqs_client, prefix
) -> None:
    """Both requests arrive in one receive; the quick one's reply goes out while the slow one is
    still sampling (a multi-turn episode's next turn must not wait for another's long answer)."""
    from mtrl_rollout.generation import error_response

    reply_url = sqs_client.create_queue(QueueName=f"{prefix}-reply-mixed")["QueueUrl"]
    sqs = Sqs(pool_size=8)
    release = asyncio.Event()

    async def sample(request):
        if request.request_id == "long":
            await release.wait()
        return error_response(request, "done")

    server = GenerationServer(sqs, queues.generate_url, queues.dlq_url, sample, receivers=1)
    base = dict(run_id="uid", step=0, group_id="g", sample_id="s", policy_version=0, turn=0,
                reply_queue_url=reply_url, messages=[ChatMessage(role="user", content="hi")])
    await sqs.send_batch(queues.generate_url, [
        Outgoing(encode(GenerateRequest(**base, request_id=request_id))) for request_id in ("long", "short")
    ])
    stop = asyncio.Event()
    serving = asyncio.create_task(server.serve(stop))
    replies: list[str] = []
    for _ in range(10):
        replies += [json.loads(m.body)["request_id"] for m in await sqs.receive(reply_url, wait_s=1)]
        if replies:
            break
    release.set()
    for _ in range(10):
        if len(replies) >= 2:
            break
        replies += [json.loads(m.body)["request_id"] for m in await sqs.receive(reply_url, wait_s=1)]
    stop.set()
    await serving
    sqs.close()
    assert replies == ["short", "long"]


async def test_generation_server_answers_at_most_its_rate(aws_env, queues, sqs_client, prefix) -> None:
    """spec.rollout.maxPolicyRequestsPerSecond: 30 queued requests at 20/s take at least half a
    second beyond the first second's burst of 20; each one is still answered."""
    from mtrl_rollout.generation import error_response
    from mtrl_rollout.ratelimit import TokenBucket

    reply_url = sqs_client.create_queue(QueueName=f"{prefix}-reply-rate")["QueueUrl"]
    sqs = Sqs(pool_size=8)
    answered: list[float] = []

    async def sample(request):
        answered.append(asyncio.get_running_loop().time())
        return error_response(request, "ok")

    server = GenerationServer(sqs, queues.generate_url, queues.dlq_url, sample, rate=TokenBucket(20))
    base = dict(run_id="uid", step=0, group_id="g", sample_id="s", policy_version=0, turn=0,
                reply_queue_url=reply_url, messages=[ChatMessage(role="user", content="hi")])
    for i in range(30):
        await sqs.send(queues.generate_url, Outgoing(encode(GenerateRequest(**base, request_id=f"r{i}"))))
    stop = asyncio.Event()
    serving = asyncio.create_task(server.serve(stop))
    answered_ids: set[str] = set()  # a set: delivery is at-least-once, a slow machine sees repeats
    for _ in range(60):
        answered_ids |= {json.loads(m.body)["request_id"] for m in await sqs.receive(reply_url, wait_s=1)}
        if len(answered_ids) >= 30:
            break
    stop.set()
    await serving
    sqs.close()
    assert answered_ids == {f"r{i}" for i in range(30)}
    assert answered[-1] - answered[0] >= 0.45  # 10 beyond the burst at 20/s


async def test_oversized_payload_round_trips_through_s3(aws_env, queues, bucket, s3_client) -> None:
    codec = Codec(s3_client, bucket, threshold_bytes=64 * 1024)
    big = _result("big").model_copy(
        update={"metrics_list": [MetricEntry(name=f"m{i:05d}", value=i, type="Metric") for i in range(8000)]}
    )
    body = await codec.to_body(big)
    assert len(body) < 1024 and json.loads(body)["kind"] == "payload_pointer"
    sqs = Sqs(pool_size=4)
    await sqs.send(queues.result_url, Outgoing(body))
    [message] = await sqs.receive(queues.result_url, wait_s=1)
    decoded, pointer = await codec.from_body(message.body)
    assert decoded == big and pointer is not None
    await codec.discard(pointer)
    assert s3_client.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    small = await codec.to_body(_result("small"))
    assert json.loads(small)["kind"] == "rollout_result"
    sqs.close()


async def test_offload_failures_are_explicit(aws_env, bucket, s3_client) -> None:
    from mtrl_rollout.offload import PayloadTooLarge
    from mtrl_rollout.protocol import ProtocolError

    big = _result("x").model_copy(update={"error": "e" * 5000})
    with pytest.raises(PayloadTooLarge, match="MTRL_PAYLOAD_BUCKET"):
        await Codec(threshold_bytes=1024).to_body(big)
    codec = Codec(s3_client, bucket, threshold_bytes=1024)
    pointer = json.loads(await codec.to_body(big))
    s3_client.put_object(Bucket=bucket, Key=pointer["key"], Body=b"tampered")
    with pytest.raises(ProtocolError, match="sha256 mismatch"):
        await codec.from_body(json.dumps(pointer))
    s3_client.delete_object(Bucket=bucket, Key=pointer["key"])
    with pytest.raises(ProtocolError, match="NoSuchKey"):
        await codec.from_body(json.dumps(pointer))


def _pointer_body(bucket: str) -> str:
    from mtrl_rollout.protocol import PayloadPointer

    return encode(PayloadPointer(bucket=bucket, key="mtrl-payloads/x.json", size_bytes=300_000,
                                 sha256="0" * 64))


async def test_a_pointer_s3_would_refuse_is_malformed(aws_env, bucket, s3_client) -> None:
    """A pointer naming what no S3 request can name is a poison message for the dead-letter
    queue, not a failed read (botocore refuses such a bucket name before sending anything)."""
    from mtrl_rollout.protocol import ProtocolError

    codec = Codec(s3_client, bucket)
    pointer = json.loads(_pointer_body(bucket))
    for field, value in (("bucket", "not a bucket!"), ("key", ""), ("sha256", "xyz")):
        with pytest.raises(ProtocolError, match=field):
            await codec.from_body(json.dumps({**pointer, field: value}))


async def test_consumers_outlive_a_payload_they_cannot_fetch(aws_env, queues, prefix, sqs_client,
                                                             unreachable_s3, caplog) -> None:
    """S3 unreachable while a pointer is read: the generation server and the result collector
    log it, leave the message for SQS to deliver again, and go on with the next one. Each has
    one receiver here, so a receiver that died of it would answer nothing more."""
    reply_url = sqs_client.create_queue(QueueName=f"{prefix}-reply-w1")["QueueUrl"]
    sqs = Sqs(pool_size=8)
    codec = Codec(unreachable_s3, prefix)

    async def sample(request):
        from mtrl_rollout.generation import error_response

        return error_response(request, "answered")

    server = GenerationServer(sqs, queues.generate_url, queues.dlq_url, sample, codec=codec,
                              receivers=1)
    stop = asyncio.Event()
    serving = asyncio.create_task(server.serve(stop))
    request = GenerateRequest(run_id="uid", step=0, group_id="g", sample_id="s", policy_version=0,
                              turn=0, reply_queue_url=reply_url, request_id="after",
                              messages=[ChatMessage(role="user", content="hi")])
    with caplog.at_level(logging.ERROR):
        await sqs.send(queues.generate_url, Outgoing(_pointer_body(prefix)))
        await sqs.send(queues.generate_url, Outgoing(encode(request)))
        replies = await _first_replies(sqs, reply_url, polls=30)
        stop.set()
        await serving
        assert [json.loads(m.body)["request_id"] for m in replies] == ["after"]
        assert "could not take generate request" in caplog.text

        await sqs.send(queues.result_url, Outgoing(_pointer_body(prefix)))
        await sqs.send(queues.result_url, Outgoing(encode(_result("a"))))
        collector = ResultCollector(sqs, queues.result_url, queues.dlq_url, codec=codec,
                                    receivers=1)
        assert list(await collector.collect(["a"], timeout_s=30)) == ["a"]
        assert "could not take result" in caplog.text
    await collector.aclose()
    sqs.close()
