"""The worker process: take rollout requests, play episodes concurrently, post results.

Delivery is at least once. The worker:
- holds at most MTRL_CONCURRENCY requests, and renews their visibility while they run;
- posts the result before deleting the request, so a crash in between replays the episode
  (the trainer's collector drops the duplicate) instead of losing it;
- skips requests for samples it already finished or is running (a redelivery to the same
  worker), which is the cheap half of idempotency;
- dead-letters malformed requests at once;
- on SIGTERM stops receiving, lets in-flight episodes finish for MTRL_DRAIN_TIMEOUT_S, releases
  the rest for other workers (visibility 0), deletes its reply queue and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from typing import Any

from mtrl_rollout.batching import Outbox
from mtrl_rollout.deadletter import dead_letter
from mtrl_rollout.leases import LeaseKeeper
from mtrl_rollout.offload import Codec, PayloadTooLarge
from mtrl_rollout.protocol import PayloadPointer, ProtocolError, RolloutRequest, RolloutResult
from mtrl_rollout.queues import (
    COMPONENT_WORKER_REPLY,
    create_queue,
    reply_queue_name,
    resource_tags,
)
from mtrl_rollout.sqs import MAX_BATCH, Outgoing, Received, Sqs, aws_client
from mtrl_worker.config import WorkerConfig
from mtrl_worker.environments.base import Environment
from mtrl_worker.environments.registry import load_environment
from mtrl_worker.episode import run_episode
from mtrl_worker.health import HealthServer
from mtrl_worker.policy import PolicyClient
from mtrl_worker.proxy import PolicyProxy
from mtrl_worker.rewards import resolve_weights
from mtrl_worker.session import EpisodeSession

log = logging.getLogger(__name__)

REPLY_QUEUE_ATTRIBUTES = {
    "MessageRetentionPeriod": "3600",  # a reply older than an hour has no one waiting
    "VisibilityTimeout": "30",
}


class RecentKeys:
    """The last `size` keys added, for cheap "already done?" checks."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._keys: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self._size:
            self._keys.popitem(last=False)

    def __contains__(self, key: str) -> bool:
        return key in self._keys


class Worker:
    def __init__(self, config: WorkerConfig, env: Environment | None = None) -> None:
        self.config = config
        self.env = env or load_environment(config.environment, config.environment_args)
        self.weights = resolve_weights(self.env.components, config.reward_weights)
        self.completed = 0
        self.health_port = 0
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        self._reserved = 0
        self._finished = RecentKeys(100_000)
        self._slot_freed = asyncio.Event()
        self._loops: list[asyncio.Task[Any]] = []
        self._ready = False
        self._draining = False

    # -- probes ---------------------------------------------------------------------------
    def alive(self) -> bool:
        return self._draining or not any(t.done() for t in self._loops)

    def ready(self) -> bool:
        return self._ready and not self._draining and self.alive()

    def stats(self) -> dict[str, Any]:
        return {"in_flight": len(self._in_flight), "completed": self.completed}

    # -- lifecycle -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        c = self.config
        self._sqs = Sqs(pool_size=c.sqs_pool_size)
        s3 = aws_client("s3", 8) if c.payload_bucket else None
        self._codec = Codec(s3, c.payload_bucket, prefix=c.payload_prefix,
                            threshold_bytes=c.offload_threshold_bytes)
        self._outbox = Outbox(self._sqs)
        tags = resource_tags(c.run_id, c.namespace, c.run_name, COMPONENT_WORKER_REPLY,
                             c.operator_id, c.cluster_id)
        reply_name = reply_queue_name(c.reply_queue_prefix, c.worker_id)
        reply_url = await asyncio.to_thread(
            create_queue, self._sqs.client, reply_name, tags, REPLY_QUEUE_ATTRIBUTES
        )
        lease_s = c.lease_s or await self._sqs.visibility_timeout_s(c.rollout_queue_url)
        self._leases = LeaseKeeper(self._sqs, c.rollout_queue_url, lease_s)
        self._policy = PolicyClient(
            self._sqs,
            self._outbox,
            self._codec,
            generate_queue_url=c.generate_queue_url,
            reply_queue_url=reply_url,
            dlq_url=c.dlq_url,
            poll_wait_s=c.poll_wait_s,
        )
        self._proxy = PolicyProxy(c.proxy_port)
        await self._proxy.start()
        health = HealthServer(c.health_port, c.health_host, self.alive, self.ready, self.stats)
        if c.health_port:
            await health.start()
            self.health_port = health.port
        background = [
            asyncio.create_task(self._policy.run()),
            asyncio.create_task(self._leases.run()),
        ]
        receivers = [asyncio.create_task(self._receive(stop)) for _ in range(2)]
        self._loops = background + receivers
        self._ready = True
        log.info(
            "worker %s ready: environment %s, concurrency %d, lease %ds, reply queue %s",
            c.worker_id,
            self.env.name,
            c.concurrency,
            lease_s,
            reply_url,
        )
        try:
            await stop.wait()
        finally:
            self._draining = True
            await asyncio.gather(*receivers, return_exceptions=True)
            await self._drain()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self._outbox.aclose()
            try:
                await self._sqs.call(self._sqs.client.delete_queue, QueueUrl=reply_url)
                log.info("deleted reply queue %s", reply_url)
            except Exception as exc:  # the operator's sweeper deletes it by tag
                log.warning("could not delete reply queue %s: %s", reply_url, exc)
            await self._proxy.stop()
            await health.stop()
            self._sqs.close()

    async def _drain(self) -> None:
        pending = list(self._in_flight.values())
        if not pending:
            return
        log.info("draining %d episodes for up to %gs", len(pending), self.config.drain_timeout_s)
        _, unfinished = await asyncio.wait(pending, timeout=self.config.drain_timeout_s)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        if unfinished:
            log.info("released %d unfinished episodes to other workers", len(unfinished))

    # -- receiving ---------------------------------------------------------------------------
    async def _receive(self, stop: asyncio.Event) -> None:
        c = self.config
        while not stop.is_set():
            free = c.concurrency - len(self._in_flight) - self._reserved
            if free <= 0:
                self._slot_freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._slot_freed.wait(), timeout=0.5)
                continue
            wanted = min(MAX_BATCH, free)
            self._reserved += wanted  # two receivers must not both fill the same free slots
            try:
                messages = await self._sqs.receive(
                    c.rollout_queue_url,
                    max_messages=wanted,
                    wait_s=c.poll_wait_s,
                    visibility_timeout_s=self._leases.lease_s,  # the lease starts at receipt
                )
            except Exception:
                log.exception("receiving rollout requests failed")
                await asyncio.sleep(1)
                continue
            finally:
                self._reserved -= wanted
            await asyncio.gather(*(self._handle(m, stop) for m in messages))

    async def _handle(self, message: Received, stop: asyncio.Event) -> None:
        try:
            if stop.is_set():  # received while shutting down: hand it straight back
                await self._outbox.release(message.queue_url, message.receipt_handle)
            else:
                await self._accept(message)
        except Exception:
            log.exception("handling message %s failed", message.message_id)

    async def _accept(self, message: Received) -> None:
        try:
            request, pointer = await self._codec.read(message.body, RolloutRequest)
            if request.run_id != self.config.run_id:
                raise ProtocolError(f"request for run {request.run_id}, not {self.config.run_id}")
        except ProtocolError as exc:
            await dead_letter(self._sqs, self.config.dlq_url, message, f"malformed rollout request: {exc}")
            return
        key = request.sample_id
        if key in self._finished:
            log.info("sample %s already finished here: deleting the redelivery", key)
            await self._outbox.delete(message.queue_url, message.receipt_handle)
            return
        # A redelivery of a sample running here invalidates the old receipt: keep the new one.
        self._leases.hold(key, message.receipt_handle)
        if key in self._in_flight:
            return
        task = asyncio.create_task(self._play(key, request, pointer))
        self._in_flight[key] = task
        task.add_done_callback(lambda _: self._settled(key))

    def _settled(self, key: str) -> None:
        self._in_flight.pop(key, None)
        self._slot_freed.set()

    # -- episodes ----------------------------------------------------------------------------
    async def _play(self, key: str, request: RolloutRequest, pointer: PayloadPointer | None) -> None:
        c = self.config
        max_turns = request.max_turns or c.max_turns
        timeout_s = request.episode_timeout_s or c.episode_timeout_s
        session = EpisodeSession(
            request,
            self._policy,
            reply_queue_url=self._policy.reply_queue_url,
            max_turns=max_turns,
            generate_timeout_s=c.generate_timeout_s,
            deadline=time.time() + timeout_s,
        )
        self._proxy.register(session)
        try:
            result = await run_episode(
                self.env,
                self.weights,
                request,
                session,
                max_turns=max_turns,
                timeout_s=timeout_s,
                worker_id=c.worker_id,
            )
        except asyncio.CancelledError:
            receipt = self._leases.drop(key)
            if receipt is not None:
                await self._outbox.release(c.rollout_queue_url, receipt)
            raise
        finally:
            self._proxy.unregister(session)
        try:
            await self._post(request, result)
        except Exception:
            # Stop renewing: the request comes back after one lease and is played again.
            log.exception("posting the result of %s failed", key)
            self._leases.drop(key)
            return
        receipt = self._leases.drop(key)
        self._finished.add(key)
        self.completed += 1
        if receipt is not None:
            await self._outbox.delete(c.rollout_queue_url, receipt)
        await self._codec.discard(pointer)

    async def _post(self, request: RolloutRequest, result: RolloutResult) -> None:
        try:
            body = await self._codec.to_body(result)
        except PayloadTooLarge as exc:
            log.error("%s; sending the result without its trajectory", exc)
            stripped = result.model_copy(update={"trajectory": [], "error": str(exc)})
            body = await self._codec.to_body(stripped)
        target = request.result_queue_url or self.config.result_queue_url
        await self._outbox.send(target, Outgoing(body))
