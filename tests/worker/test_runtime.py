"""Worker processes against the moto server and a fake trainer: concurrency, crashes,
poison messages, S3 offload and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import boto3
import pytest
from botocore.exceptions import ClientError

from mtrl_rollout.batching import Outbox
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import ChatMessage, GenerateRequest, Message, RolloutResult, encode
from mtrl_rollout.queues import TAG_COMPONENT, TAG_RUN_UID
from mtrl_rollout.results import ResultCollector
from mtrl_rollout.sqs import Outgoing, Sqs

from .conftest import GUESSES, Run, wait_ready

pytestmark = [pytest.mark.aws, pytest.mark.slow]


async def send(run: Run, messages: list[Message | str]) -> None:
    sqs = Sqs(pool_size=8)
    outbox = Outbox(sqs)
    codec = Codec(boto3.client("s3"), run.bucket, threshold_bytes=64 * 1024)
    bodies = [m if isinstance(m, str) else await codec.to_body(m) for m in messages]
    await asyncio.gather(*(outbox.send(run.queues.rollout_url, Outgoing(b)) for b in bodies))
    await outbox.aclose()
    sqs.close()


def collector_for(run: Run) -> ResultCollector:
    codec = Codec(boto3.client("s3"), run.bucket)
    return ResultCollector(Sqs(pool_size=8), run.queues.result_url, run.queues.dlq_url, codec=codec)


async def wait_for(check, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


def reply_queue_exists(run: Run, worker_id: str) -> bool:
    try:
        boto3.client("sqs").get_queue_url(QueueName=f"{run.prefix}-reply-{worker_id}")
        return True
    except ClientError:
        return False


async def test_hundreds_of_concurrent_episodes_across_worker_processes(run: Run) -> None:
    # A production-like lease: the 3 s queue default is for the crash test, and moto under this
    # load can take longer than that to renew it.
    # Episodes are not timed here: on a loaded machine moto alone can take a minute for one.
    workers = [run.start_worker(MTRL_CONCURRENCY="100", MTRL_LEASE_S="60",
                                MTRL_EPISODE_TIMEOUT_S="900") for _ in range(3)]
    wait_ready(*workers)
    requests = [run.request(f"s{i:03d}", GUESSES[i % len(GUESSES)]) for i in range(240)]
    started = time.monotonic()
    await send(run, requests)
    collector = collector_for(run)
    results = await collector.collect([r.sample_id for r in requests], timeout_s=900)
    elapsed = time.monotonic() - started
    assert len(results) == 240, f"{len(results)} results after {elapsed:.0f}s"
    unfinished = [f"{r.sample_id} turn {len(r.trajectory)}: {r.stop_reason} ({r.error})"
                  for r in results.values() if r.stop_reason != "done"]
    assert not unfinished, f"{len(unfinished)} of 240 after {elapsed:.0f}s: {unfinished[:5]}"
    for request in requests:
        result = results[request.sample_id]
        turns = GUESSES.index(request.data["secret"]) + 1
        assert result.stop_reason == "done" and result.metric("solved") == 1.0
        assert result.metric("turns") == turns and len(result.trajectory) == turns
        assert result.trajectory[-1].completion_token_ids == [
            ord(c) for c in f"<guess>{request.data['secret']}</guess>"
        ]
        assert (result.run_id, result.group_id) == (run.run_id, request.group_id)
    by_worker = {w.worker_id: 0 for w in workers}
    for result in results.values():
        by_worker[result.worker_id] += 1
    assert sum(1 for n in by_worker.values() if n) >= 2, by_worker
    # At least once: a generate request redelivered under load is answered twice; the worker
    # drops the reply nobody waits for, and the trajectories above prove no turn was doubled.
    assert run.sampler.requests >= sum(GUESSES.index(r.data["secret"]) + 1 for r in requests)
    health = await asyncio.to_thread(
        urllib.request.urlopen, f"http://127.0.0.1:{workers[0].health_port}/healthz"
    )
    assert json.load(health)["status"] == "ok"
    assert [w.terminate() for w in workers] == [0, 0, 0]
    assert not any(reply_queue_exists(run, w.worker_id) for w in workers)
    # Delivery is at least once: on a loaded machine a lease can lapse and a sample be played
    # twice. The collector keeps one result per sample (checked above) and drops the rest;
    # more than a few would mean the leases are not being renewed at all.
    assert collector.duplicates <= len(requests) // 20, collector.duplicates
    print(f"240 episodes, {run.sampler.requests} turns in {elapsed:.1f}s: {by_worker}")


async def test_killed_worker_episodes_come_back_and_yield_one_result_each(run: Run) -> None:
    run.sampler.delay_s = 1.0  # every turn takes a second: the kill lands mid-episode
    doomed = run.start_worker(MTRL_WORKER_ID="doomed", MTRL_CONCURRENCY="30", MTRL_LEASE_S="3")
    wait_ready(doomed)
    requests = [run.request(f"k{i:02d}", GUESSES[1 + i % 3]) for i in range(30)]  # 2-4 turns
    await send(run, requests)
    await wait_for(lambda: len(run.sampler.seen_samples) >= 20, 30, "episodes to start")
    doomed.kill()
    run.sampler.delay_s = 0.0
    survivor = run.start_worker(MTRL_WORKER_ID="survivor", MTRL_CONCURRENCY="50")
    collector = collector_for(run)
    results = await collector.collect([r.sample_id for r in requests], timeout_s=90)
    assert sorted(results) == sorted(r.sample_id for r in requests)
    assert {r.worker_id for r in results.values()} == {"survivor"}

    # Redelivered copies of samples the survivor finished are deleted, not replayed.
    await send(run, requests[:5])
    sqs = boto3.client("sqs")

    def queue_empty() -> bool:
        attrs = sqs.get_queue_attributes(
            QueueUrl=run.queues.rollout_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(v) for v in attrs.values()) == 0

    await wait_for(queue_empty, 20, "the redelivered copies to be consumed")
    assert await collector.collect(["k00", "k01", "k02", "k03", "k04"], timeout_s=3) == {}
    assert "already finished here" in survivor.log()

    # The dead worker's reply queue is an orphan for the operator's sweeper to find by tag.
    url = sqs.get_queue_url(QueueName=f"{run.prefix}-reply-doomed")["QueueUrl"]
    tags = sqs.list_queue_tags(QueueUrl=url)["Tags"]
    assert tags[TAG_RUN_UID] == run.run_id and tags[TAG_COMPONENT] == "worker-reply"
    assert survivor.terminate() == 0


async def test_poison_messages_go_to_the_dlq_and_big_payloads_through_s3(run: Run) -> None:
    run.sampler.long_reply_for = {"big"}
    worker = run.start_worker(MTRL_OFFLOAD_THRESHOLD_BYTES="65536")
    wait_ready(worker)
    wrong_kind = GenerateRequest(
        run_id=run.run_id,
        step=0,
        group_id="g",
        sample_id="x",
        policy_version=0,
        request_id="r",
        turn=0,
        messages=[ChatMessage(role="user", content="hi")],
        reply_queue_url="q",
    )
    big = run.request("big", "crane", max_turns=6).model_copy(
        update={"data": {"secret": "crane", "notes": "n" * 300_000}}
    )
    foreign = run.request("foreign", "crane").model_copy(update={"run_id": "another-run"})
    await send(run, ["{not json", encode(wrong_kind), foreign, big, run.request("ok", "slate")])
    collector = collector_for(run)
    results = await collector.collect(["big", "ok"], timeout_s=60)
    assert sorted(results) == ["big", "ok"]
    big_result: RolloutResult = results["big"]
    assert big_result.metric("solved") == 1.0
    assert len(big_result.trajectory[0].completion_token_ids) > 12_000  # came back via S3

    sqs = Sqs(pool_size=4)
    dead = []
    for _ in range(10):
        dead += await sqs.receive(run.queues.dlq_url, wait_s=1)
        if len(dead) >= 3:
            break
    sqs.close()
    reasons = sorted(m.attributes["mtrl-dlq-reason"] for m in dead)
    assert len(reasons) == 3, reasons
    assert "expected RolloutRequest, got GenerateRequest" in reasons[0]
    assert "not JSON" in reasons[1]
    assert "request for run another-run" in reasons[2]
    assert worker.log().count("to the dead-letter queue: malformed rollout request") == 3
    # the request's and the result's payload objects were cleaned up by their consumers
    s3 = boto3.client("s3")
    await wait_for(lambda: s3.list_objects_v2(Bucket=run.bucket)["KeyCount"] == 0, 10, "cleanup")
    assert worker.terminate() == 0


async def test_sigterm_releases_unfinished_episodes_and_exits_zero(run: Run) -> None:
    run.sampler.delay_s = 5.0
    worker = run.start_worker(MTRL_LEASE_S="30", MTRL_DRAIN_TIMEOUT_S="0.5")
    wait_ready(worker)
    await send(run, [run.request(f"d{i}", "crane") for i in range(5)])
    await wait_for(lambda: len(run.sampler.seen_samples) >= 5, 20, "episodes to start")
    started = time.monotonic()
    assert worker.terminate() == 0
    assert time.monotonic() - started < 15
    assert "released 5 unfinished episodes" in worker.log()
    assert not reply_queue_exists(run, worker.worker_id)
    # Released, not left invisible for the 30 s lease: another consumer gets them at once.
    sqs = Sqs(pool_size=4)
    back = []
    for _ in range(5):
        back += await sqs.receive(run.queues.rollout_url, wait_s=1)
        if len(back) == 5:
            break
    sqs.close()
    assert sorted(json.loads(m.body)["sample_id"] for m in back) == [f"d{i}" for i in range(5)]
