"""The trainer's side of the result queue: exactly one result per sample id.

SQS delivers at least once, and a worker killed after posting a result but before deleting its
request makes another worker replay the episode. The collector keeps the first result per
(run, sample) and deletes later copies, counting them. Sample ids are unique per run, so the
remembered set grows by one short string per episode: about 100 bytes, or 100 MB per million.

A trainer that plays ahead (asynchronous GRPO) `expect`s the sample ids of every step it has
published; a result for an expected sample that another step's `collect` receives is kept until
its own step collects it, and `forget` drops what a step no longer wants.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from mtrl_rollout.batching import Outbox
from mtrl_rollout.deadletter import dead_letter
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import ProtocolError, RolloutResult
from mtrl_rollout.sqs import Received, Sqs

log = logging.getLogger(__name__)


class ResultCollector:
    def __init__(
        self,
        sqs: Sqs,
        queue_url: str,
        dlq_url: str,
        *,
        codec: Codec | None = None,
        receivers: int = 2,
    ) -> None:
        self._sqs = sqs
        self._queue_url = queue_url
        self._dlq_url = dlq_url
        self._codec = codec or Codec()
        self._outbox = Outbox(sqs)
        self._receivers = receivers
        self._seen: set[tuple[str, str]] = set()
        self._expected: set[str] = set()
        self._kept: dict[str, RolloutResult] = {}
        # Called with the sample id of every first result (the trainer's episode window).
        self.on_result: Callable[[str], None] | None = None
        self.received = 0  # first results, for any sample
        self.duplicates = 0
        self.malformed = 0

    def expect(self, sample_ids: Iterable[str]) -> None:
        """Keep results for these samples whichever `collect` receives them."""
        self._expected.update(sample_ids)

    def forget(self, sample_ids: Iterable[str]) -> None:
        for sample_id in sample_ids:
            self._expected.discard(sample_id)
            self._kept.pop(sample_id, None)

    async def collect(
        self, sample_ids: Iterable[str], timeout_s: float, wait_s: int = 1
    ) -> dict[str, RolloutResult]:
        """Results for `sample_ids`; returns early when all arrived, else at the timeout with the
        ones that did. Results for other expected samples are kept for their own `collect`;
        results for samples nobody expects (late ones from a past step) are dropped."""
        wanted = set(sample_ids)
        got = {i: self._kept.pop(i) for i in wanted if i in self._kept}
        deadline = time.monotonic() + timeout_s

        async def receive() -> None:
            while len(got) < len(wanted) and time.monotonic() < deadline:
                messages = await self._sqs.receive(self._queue_url, wait_s=wait_s)
                # Concurrently, so the ten deletes share one call: one by one, a slow queue
                # could let the visibility timeout lapse and deliver the batch again.
                for result in await asyncio.gather(*(self._take(m) for m in messages)):
                    if result is None:
                        continue
                    if result.sample_id in wanted:
                        got.setdefault(result.sample_id, result)
                    elif result.sample_id in self._expected:
                        self._kept.setdefault(result.sample_id, result)

        await asyncio.gather(*(receive() for _ in range(self._receivers)))
        return got

    async def _take(self, message: Received) -> RolloutResult | None:
        try:
            return await self._accept(message)
        except Exception:  # S3 or SQS failed us: the step goes on, the result comes again
            log.exception("could not take result %s; SQS delivers it again after its "
                          "visibility timeout", message.message_id)
            return None

    async def _accept(self, message: Received) -> RolloutResult | None:
        try:
            result, pointer = await self._codec.read(message.body, RolloutResult)
        except ProtocolError as exc:
            self.malformed += 1
            await dead_letter(self._sqs, self._dlq_url, message, f"malformed result: {exc}")
            return None
        key = (result.run_id, result.sample_id)
        fresh = key not in self._seen
        self._seen.add(key)
        if not fresh:
            self.duplicates += 1
            log.info("dropping duplicate result for sample %s", result.sample_id)
        await self._outbox.delete(self._queue_url, message.receipt_handle)
        await self._codec.discard(pointer)
        if fresh:
            self.received += 1
            if self.on_result is not None:
                self.on_result(result.sample_id)
        return result if fresh else None

    async def aclose(self) -> None:
        await self._outbox.aclose()
