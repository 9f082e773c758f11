"""Transport benchmark (target P5): SQS throughput batched vs one at a time, and the overhead of
one generation round trip, all against ONE moto server on loopback, in one process.

    .venv/bin/python bench/transport_bench.py [--messages 1000] [--concurrency 4] [--turns 100]

Starts its own moto server unless AWS_ENDPOINT_URL is set. Prints a markdown table.
Everything here runs in one process, so "messages/s" is per worker process.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import boto3

from mtrl_rollout.batching import Outbox
from mtrl_rollout.generation import GenerationServer
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import (
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    GenerateRequest,
    GenerateResponse,
    TokenLogprob,
)
from mtrl_rollout.queues import create_queue, create_run_queues, resource_tags
from mtrl_rollout.sqs import MAX_BATCH, Outgoing, Sqs
from mtrl_testbed.moto import aws_endpoint
from mtrl_worker.policy import PolicyClient

BODY = "x" * 512  # a small rollout request
DEPTH = 40


async def throughput(sqs: Sqs, url: str, total: int, workers: int, batched: bool) -> tuple[float, float]:
    """Messages/s through send -> receive -> delete, producers and consumers running together,
    and this process's CPU seconds per message (what the client side costs, moto aside).

    The backlog is capped at DEPTH because moto scans a queue's every message on each call: a
    deep queue would measure moto, not the transport. Real workers consume as the trainer sends.
    """
    client = sqs.client
    sent = received = 0
    room = asyncio.Condition()

    def has_room() -> bool:
        return sent - received < DEPTH

    async def produce() -> None:
        nonlocal sent
        while sent < total:
            async with room:
                await room.wait_for(has_room)
            if sent >= total:
                break
            n = min(MAX_BATCH if batched else 1, total - sent)
            sent += n
            if batched:
                await sqs.send_batch(url, [Outgoing(BODY)] * n)
            else:
                await sqs.call(client.send_message, QueueUrl=url, MessageBody=BODY)

    async def consume() -> None:
        nonlocal received
        while received < total:
            messages = await sqs.receive(url, max_messages=MAX_BATCH if batched else 1, wait_s=1)
            if not messages:
                continue
            if batched:
                await sqs.delete_batch(url, [m.receipt_handle for m in messages])
            else:
                await sqs.call(client.delete_message, QueueUrl=url, ReceiptHandle=messages[0].receipt_handle)
            received += len(messages)
            async with room:
                room.notify_all()

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(produce() for _ in range(workers)), *(consume() for _ in range(workers)))
    return total / (time.perf_counter() - started), (time.process_time() - cpu) / total


def _response(request: GenerateRequest) -> GenerateResponse:
    return GenerateResponse.replying_to(
        request,
        prompt_token_ids=list(range(64)),
        choices=[
            Choice(
                message=ChatMessage(role="assistant", content="<guess>crane</guess>"),
                finish_reason="stop",
                logprobs=ChoiceLogprobs(content=[TokenLogprob(logprob=-0.1)] * 8),
                token_ids=list(range(8)),
            )
        ],
    )


async def round_trips(sqs: Sqs, queues, reply_url: str, turns: int, episodes: int) -> list[float]:
    """Latency of PolicyClient.generate with an instant sampler: pure transport overhead."""

    async def sample(request: GenerateRequest) -> GenerateResponse:
        return _response(request)

    stop = asyncio.Event()
    server = GenerationServer(
        Sqs(pool_size=16), queues.generate_url, queues.dlq_url, sample, receivers=2, wait_s=20
    )
    outbox = Outbox(sqs)
    client = PolicyClient(
        sqs,
        outbox,
        Codec(),
        generate_queue_url=queues.generate_url,
        reply_queue_url=reply_url,
        dlq_url=queues.dlq_url,
        poll_wait_s=20,
    )
    serving = asyncio.create_task(server.serve(stop))
    polling = asyncio.create_task(client.run())
    latencies: list[float] = []

    async def episode(e: int) -> None:
        for turn in range(max(1, turns // episodes)):  # at least one turn per episode
            request = GenerateRequest(
                run_id="bench",
                step=0,
                group_id="g",
                sample_id=f"s{e}",
                policy_version=0,
                request_id=uuid.uuid4().hex,
                turn=turn,
                reply_queue_url=reply_url,
                messages=[ChatMessage(role="user", content="Make your first guess.")],
            )
            started = time.perf_counter()
            await client.generate(request, timeout_s=30)
            latencies.append((time.perf_counter() - started) * 1000)

    await episode(-1)  # warm connections and long polls
    latencies.clear()
    await asyncio.gather(*(episode(e) for e in range(episodes)))
    stop.set()
    polling.cancel()
    await asyncio.gather(serving, polling, return_exceptions=True)
    await outbox.aclose()
    return latencies


async def single_call_ms(sqs: Sqs, url: str, n: int = 200) -> float:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await sqs.call(sqs.client.send_message, QueueUrl=url, MessageBody="ping")
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def main(args: argparse.Namespace) -> None:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    raw = boto3.client("sqs")
    queues = create_run_queues(raw, prefix, resource_tags("bench", "bench", "bench", "bench"))
    fresh = [create_queue(raw, f"{prefix}-{name}", {}) for name in ("batched", "single", "ping")]
    reply_url = create_queue(raw, f"{prefix}-reply-w0", {})
    sqs = Sqs(pool_size=max(16, 2 * args.concurrency))

    floor = await single_call_ms(sqs, fresh[2])
    batched, batched_cpu = await throughput(sqs, fresh[0], args.messages, args.concurrency, True)
    single, single_cpu = await throughput(sqs, fresh[1], args.messages // 5, args.concurrency, False)
    serial = await round_trips(sqs, queues, reply_url, args.turns, episodes=1)
    loaded = await round_trips(sqs, queues, reply_url, args.turns * 4, episodes=64)
    sqs.close()

    print(
        f"\nmoto on loopback, one process, {args.concurrency} senders + {args.concurrency} "
        f"receivers, {args.messages} messages batched / {args.messages // 5} one at a time, "
        f"backlog <= {DEPTH}\n"
    )
    print("| send -> receive -> delete | batched (10/call) | one at a time | ratio |")
    print("|---|---|---|---|")
    print(f"| messages/s | {batched:,.0f} | {single:,.0f} | {batched / single:.1f}x |")
    print(
        f"| client CPU per message (ms) | {batched_cpu * 1e3:.2f} | {single_cpu * 1e3:.2f} | "
        f"{single_cpu / batched_cpu:.1f}x |"
    )
    print(
        f"| client-bound ceiling, messages/s per process | {1 / batched_cpu:,.0f} | {1 / single_cpu:,.0f} | |"
    )
    print("\n| generation round trip (instant sampler) | p50 ms | p95 ms | turns |")
    print("|---|---|---|---|")
    print(
        f"| 1 episode, sequential turns | {_pct(serial, 50):.1f} | {_pct(serial, 95):.1f} | {len(serial)} |"
    )
    print(f"| 64 concurrent episodes | {_pct(loaded, 50):.1f} | {_pct(loaded, 95):.1f} | {len(loaded)} |")
    print(
        f"\nmoto floor: one SendMessage call p50 {floor:.2f} ms; a round trip makes at least 4 "
        f"calls in sequence (send, receive, send reply, receive), about {4 * floor:.1f} ms "
        "of moto time; under load moto (one Python process) queues every call."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--turns", type=int, default=100)
    arguments = parser.parse_args()
    with aws_endpoint():
        asyncio.run(main(arguments))
