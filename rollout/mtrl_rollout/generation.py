"""The trainer's side of the generation channel.

Workers put GenerateRequests on the run's generate queue; the server gathers them into batches
(the trainer decodes many sequences at once), calls the sampling handler and sends each response
to the reply queue named in its request. Requests whose deadline passed are dropped: nobody waits
for them any more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from mtrl_rollout.batching import Outbox
from mtrl_rollout.deadletter import dead_letter
from mtrl_rollout.offload import Codec, PayloadTooLarge
from mtrl_rollout.protocol import GenerateRequest, GenerateResponse, ProtocolError
from mtrl_rollout.ratelimit import TokenBucket
from mtrl_rollout.sqs import Outgoing, Received, Sqs

log = logging.getLogger(__name__)

SampleBatch = Callable[[list[GenerateRequest]], Awaitable[list[GenerateResponse]]]


class GenerationServer:
    def __init__(
        self,
        sqs: Sqs,
        generate_queue_url: str,
        dlq_url: str,
        sample: SampleBatch,
        *,
        codec: Codec | None = None,
        receivers: int = 2,
        max_batch: int = 64,
        max_wait_s: float = 0.0,
        wait_s: int = 1,
        rate: TokenBucket | None = None,
    ) -> None:
        self._sqs = sqs
        self._queue_url = generate_queue_url
        self._dlq_url = dlq_url
        self._sample = sample
        self._codec = codec or Codec()
        self._outbox = Outbox(sqs)
        self._receivers = receivers
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._wait_s = wait_s
        self._rate = rate
        self._inbox: asyncio.Queue[tuple[GenerateRequest, Received]] = asyncio.Queue()
        self.served = 0

    async def serve(self, stop: asyncio.Event) -> None:
        receivers = [asyncio.create_task(self._receive(stop)) for _ in range(self._receivers)]
        batches: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                batch = await self._next_batch(stop)
                if batch:
                    task = asyncio.create_task(self._answer(batch))
                    batches.add(task)
                    task.add_done_callback(batches.discard)
        finally:
            await asyncio.gather(*receivers, return_exceptions=True)
            await asyncio.gather(*batches, return_exceptions=True)
            await self._outbox.aclose()

    async def _receive(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                messages = await self._sqs.receive(self._queue_url, wait_s=self._wait_s)
            except Exception:
                log.exception("receiving generate requests failed")
                await asyncio.sleep(1)
                continue
            for message in messages:
                try:
                    request, _ = await self._codec.from_body(message.body)
                    if not isinstance(request, GenerateRequest):
                        got = type(request).__name__
                        raise ProtocolError(f"expected GenerateRequest, got {got}")
                except ProtocolError as exc:
                    await dead_letter(self._sqs, self._dlq_url, message, str(exc))
                    continue
                self._inbox.put_nowait((request, message))

    async def _next_batch(self, stop: asyncio.Event) -> list[tuple[GenerateRequest, Received]]:
        try:
            first = await asyncio.wait_for(self._inbox.get(), timeout=0.2)
        except TimeoutError:
            return []
        if self._rate is not None:  # one request at a time at the capped rate
            await self._rate.acquire()
            return [first]
        batch = [first]
        deadline = time.monotonic() + self._max_wait_s
        while len(batch) < self._max_batch:
            if not self._inbox.empty():
                batch.append(self._inbox.get_nowait())
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0 or stop.is_set():
                break
            try:
                batch.append(await asyncio.wait_for(self._inbox.get(), remaining))
            except TimeoutError:
                break
        return batch

    async def _answer(self, batch: list[tuple[GenerateRequest, Received]]) -> None:
        now = time.time()
        live = [(r, m) for r, m in batch if r.deadline is None or r.deadline > now]
        for request, message in batch:
            if request.deadline is not None and request.deadline <= now:
                log.info("dropping expired generate request %s", request.request_id)
                await self._outbox.delete(self._queue_url, message.receipt_handle)
        if not live:
            return
        requests = [r for r, _ in live]
        try:
            responses = await self._sample(requests)
        except Exception as exc:
            log.exception("sampling failed for %d requests", len(requests))
            responses = [error_response(r, f"sampling failed: {exc}") for r in requests]
        await asyncio.gather(
            *(self._reply(req, resp, msg) for (req, msg), resp in zip(live, responses, strict=True))
        )

    async def _reply(self, request: GenerateRequest, response: GenerateResponse, message: Received) -> None:
        try:
            try:
                body = await self._codec.to_body(response)
            except PayloadTooLarge as exc:  # fail the episode now rather than at its timeout
                body = await self._codec.to_body(error_response(request, str(exc)))
            await self._outbox.send(request.reply_queue_url, Outgoing(body))
        except Exception:
            # The worker's reply queue is gone (it drained or died): its episode is over.
            log.warning("could not reply to %s", request.reply_queue_url, exc_info=True)
        await self._outbox.delete(self._queue_url, message.receipt_handle)
        self.served += 1


def error_response(request: GenerateRequest, error: str) -> GenerateResponse:
    return GenerateResponse.replying_to(
        request,
        error=error,
    )
