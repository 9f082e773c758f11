"""The trainer's side of the generation channel.

Workers put GenerateRequests on the run's generate queue; the server hands each to the sampling
handler as it arrives and sends its response to the reply queue named in the request as soon as
that response is ready. Batching is the sampler's business (the trainer's decoder admits new
requests between decode steps), so a short completion never waits for a long one received with
it. Requests whose deadline passed are dropped: nobody waits for them any more.
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

Sample = Callable[[GenerateRequest], Awaitable[GenerateResponse]]


class GenerationServer:
    def __init__(
        self,
        sqs: Sqs,
        generate_queue_url: str,
        dlq_url: str,
        sample: Sample,
        *,
        codec: Codec | None = None,
        receivers: int = 2,
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
        self._wait_s = wait_s
        self._rate = rate
        self._inbox: asyncio.Queue[tuple[GenerateRequest, Received]] = asyncio.Queue()
        self.served = 0

    async def serve(self, stop: asyncio.Event) -> None:
        receivers = [asyncio.create_task(self._receive(stop)) for _ in range(self._receivers)]
        answers: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                try:
                    request, message = await asyncio.wait_for(self._inbox.get(), timeout=0.2)
                except TimeoutError:
                    continue
                if self._rate is not None:  # first come, first served at the capped rate
                    await self._rate.acquire()
                task = asyncio.create_task(self._answer(request, message))
                answers.add(task)
                task.add_done_callback(answers.discard)
        finally:
            await asyncio.gather(*receivers, return_exceptions=True)
            await asyncio.gather(*answers, return_exceptions=True)
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
                    await self._accept(message)
                except Exception:  # S3 or SQS failed us: this loop must outlive it
                    log.exception("could not take generate request %s; SQS delivers it again "
                                  "after its visibility timeout", message.message_id)

    async def _accept(self, message: Received) -> None:
        try:
            request, _ = await self._codec.read(message.body, GenerateRequest)
        except ProtocolError as exc:
            await dead_letter(self._sqs, self._dlq_url, message, str(exc))
            return
        self._inbox.put_nowait((request, message))

    async def _answer(self, request: GenerateRequest, message: Received) -> None:
        if request.deadline is not None and request.deadline <= time.time():
            log.info("dropping expired generate request %s", request.request_id)
            await self._outbox.delete(self._queue_url, message.receipt_handle)
            return
        try:
            response = await self._sample(request)
        except Exception as exc:
            log.exception("sampling failed for %s", request.request_id)
            response = error_response(request, f"sampling failed: {exc}")
        await self._reply(request, response, message)

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
