"""The worker's end of the generation channel.

GenerateRequests go to the trainer's shared generate queue, naming this worker's own reply queue.
Pollers on the reply queue resolve the waiting episode by request id, so responses never cross
between workers and a late response (its episode timed out) is simply dropped.
"""

from __future__ import annotations

import asyncio
import logging

from mtrl_rollout.batching import Outbox
from mtrl_rollout.deadletter import dead_letter
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import (
    GenerateRequest,
    GenerateResponse,
    PayloadPointer,
    ProtocolError,
)
from mtrl_rollout.sqs import Outgoing, Received, Sqs

log = logging.getLogger(__name__)


class GenerationError(RuntimeError):
    """The trainer answered with an error instead of a completion."""


class PolicyClient:
    def __init__(
        self,
        sqs: Sqs,
        outbox: Outbox,
        codec: Codec,
        *,
        generate_queue_url: str,
        reply_queue_url: str,
        dlq_url: str,
        pollers: int = 2,
        poll_wait_s: int = 5,
    ) -> None:
        self._sqs = sqs
        self._outbox = outbox
        self._codec = codec
        self._generate_queue_url = generate_queue_url
        self.reply_queue_url = reply_queue_url
        self._dlq_url = dlq_url
        self._pollers = pollers
        self._poll_wait_s = poll_wait_s
        self._waiting: dict[str, asyncio.Future[GenerateResponse]] = {}
        self._acks: set[asyncio.Task[None]] = set()

    async def generate(self, request: GenerateRequest, timeout_s: float) -> GenerateResponse:
        future: asyncio.Future[GenerateResponse] = asyncio.get_running_loop().create_future()
        self._waiting[request.request_id] = future
        try:
            body = await self._codec.to_body(request)
            await self._outbox.send(self._generate_queue_url, Outgoing(body))
            response = await asyncio.wait_for(future, timeout_s)
        finally:
            self._waiting.pop(request.request_id, None)
        if response.error:
            raise GenerationError(response.error)
        return response

    async def run(self) -> None:
        """Poll the reply queue until cancelled."""
        await asyncio.gather(*(self._poll() for _ in range(self._pollers)))

    async def _poll(self) -> None:
        while True:
            try:
                messages = await self._sqs.receive(self.reply_queue_url, wait_s=self._poll_wait_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("receiving from reply queue %s failed", self.reply_queue_url)
                await asyncio.sleep(1)
                continue
            await asyncio.gather(*(self._deliver(m) for m in messages))

    async def _deliver(self, message: Received) -> None:
        try:
            await self._accept(message)
        except Exception:  # S3 or SQS failed us: the poller must outlive it
            log.exception("could not take reply %s on %s; SQS delivers it again after its "
                          "visibility timeout", message.message_id, self.reply_queue_url)

    async def _accept(self, message: Received) -> None:
        try:
            response, pointer = await self._codec.read(message.body, GenerateResponse)
        except ProtocolError as exc:
            await dead_letter(self._sqs, self._dlq_url, message, f"malformed reply: {exc}")
            return
        future = self._waiting.get(response.request_id)
        if future is None:
            log.debug("dropping reply for %s: nobody waits for it", response.request_id)
        elif not future.done():
            future.set_result(response)
        # The reply is consumed either way; deleting it is housekeeping the episode need not wait
        # for, but errors must not go unnoticed.
        task = asyncio.create_task(self._ack(message, pointer))
        self._acks.add(task)
        task.add_done_callback(self._acked)

    async def _ack(self, message: Received, pointer: PayloadPointer | None) -> None:
        await self._outbox.delete(message.queue_url, message.receipt_handle)
        await self._codec.discard(pointer)

    def _acked(self, task: asyncio.Task[None]) -> None:
        self._acks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("deleting a reply failed: %s", task.exception())
