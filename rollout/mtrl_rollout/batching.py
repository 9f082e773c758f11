"""Micro-batching: many concurrent single sends/deletes become few 10-entry SQS calls.

Callers `await` one item and get its own outcome. Like Nagle's algorithm, an item goes out at
once when no call is in flight; while calls are in flight, items linger briefly and leave ten at a
time. So a lone episode pays no batching delay, and a busy worker makes few calls. A bounded
number of batch calls run at once. Entries that SQS reports as failed
for a server-side reason are retried a few times; sender faults fail that item only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from mtrl_rollout.sqs import MAX_BATCH, SQS_MAX_BYTES, BatchFailure, Outgoing, Sqs, is_stale_receipt

log = logging.getLogger(__name__)

MAX_BATCH_BYTES = SQS_MAX_BYTES  # SendMessageBatch's limit applies to the sum of its entries

T = TypeVar("T")


class BatchItemError(RuntimeError):
    def __init__(self, failure: BatchFailure) -> None:
        super().__init__(f"{failure.code}: {failure.message}")
        self.failure = failure


class MicroBatcher(Generic[T]):
    def __init__(
        self,
        flush: Callable[[Sequence[T]], Awaitable[list[BatchFailure]]],
        *,
        size_of: Callable[[T], int] = lambda _: 0,
        linger_s: float = 0.002,
        max_in_flight: int = 4,
        retries: int = 3,
    ) -> None:
        self._flush = flush
        self._size_of = size_of
        self._linger_s = linger_s
        self._slots = asyncio.Semaphore(max_in_flight)
        self._retries = retries
        self._pending: asyncio.Queue[tuple[T, asyncio.Future[None], int]] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> None:
        """Return once SQS accepted `item`; raise BatchItemError if it refused it."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.put_nowait((item, future, 0))
        if self._pump is None or self._pump.done():
            self._pump = asyncio.create_task(self._run())
        await future

    async def _run(self) -> None:
        while not self._pending.empty():
            if self._calls and self._pending.qsize() < MAX_BATCH:
                await asyncio.sleep(self._linger_s)
            batch, size = [], 0
            while not self._pending.empty() and len(batch) < MAX_BATCH:
                entry = self._pending.get_nowait()
                entry_size = self._size_of(entry[0])
                if batch and size + entry_size > MAX_BATCH_BYTES:
                    self._pending.put_nowait(entry)  # order within a queue is not promised
                    break
                batch.append(entry)
                size += entry_size
            await self._slots.acquire()
            call = asyncio.create_task(self._call(batch))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)

    async def _call(self, batch: list[tuple[T, asyncio.Future[None], int]]) -> None:
        try:
            failures = await self._flush([item for item, _, _ in batch])
        except Exception as exc:  # the whole call failed after botocore's own retries
            for _, future, _ in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self._slots.release()
        failed = {f.index: f for f in failures}
        for index, (item, future, attempt) in enumerate(batch):
            failure = failed.get(index)
            if failure is None:
                if not future.done():
                    future.set_result(None)
            elif not failure.sender_fault and attempt < self._retries:
                log.debug("retrying batch entry after %s", failure.code)
                self._pending.put_nowait((item, future, attempt + 1))
            elif not future.done():
                future.set_exception(BatchItemError(failure))
        if not self._pending.empty() and (self._pump is None or self._pump.done()):
            self._pump = asyncio.create_task(self._run())

    async def aclose(self) -> None:
        if self._pump is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        while self._calls:
            await asyncio.gather(*self._calls, return_exceptions=True)


class Outbox:
    """Batched sends, deletes and visibility changes: one batcher per queue and operation."""

    def __init__(self, sqs: Sqs, *, linger_s: float = 0.002, max_in_flight: int = 4) -> None:
        self.sqs = sqs
        self._linger_s = linger_s
        self._max_in_flight = max_in_flight
        self._sends: dict[str, MicroBatcher[Outgoing]] = {}
        self._deletes: dict[str, MicroBatcher[str]] = {}
        self._releases: dict[str, MicroBatcher[str]] = {}

    async def send(self, queue_url: str, message: Outgoing) -> None:
        if queue_url not in self._sends:
            self._sends[queue_url] = MicroBatcher(
                functools.partial(self.sqs.send_batch, queue_url),
                size_of=Outgoing.size,
                linger_s=self._linger_s,
                max_in_flight=self._max_in_flight,
            )
        await self._sends[queue_url].submit(message)

    async def delete(self, queue_url: str, receipt_handle: str) -> bool:
        """Delete a received message; False if the receipt was stale (see `_unless_stale`)."""
        if queue_url not in self._deletes:
            self._deletes[queue_url] = MicroBatcher(
                functools.partial(self.sqs.delete_batch, queue_url),
                linger_s=self._linger_s,
                max_in_flight=self._max_in_flight,
            )
        return await _unless_stale(self._deletes[queue_url].submit(receipt_handle), "delete", queue_url)

    async def release(self, queue_url: str, receipt_handle: str) -> bool:
        """Make a received message visible again at once, for another consumer to take; False if
        the receipt was stale."""
        if queue_url not in self._releases:
            self._releases[queue_url] = MicroBatcher(
                functools.partial(self.sqs.change_visibility_batch, queue_url, timeout_s=0),
                linger_s=self._linger_s,
                max_in_flight=self._max_in_flight,
            )
        return await _unless_stale(self._releases[queue_url].submit(receipt_handle), "release",
                                   queue_url)

    async def aclose(self) -> None:
        for table in (self._sends, self._deletes, self._releases):
            for batcher in table.values():
                await batcher.aclose()


async def _unless_stale(done: Awaitable[None], action: str, queue_url: str) -> bool:
    """Await a delete or release; a stale receipt is not an error. The message's visibility
    lapsed and SQS handed it out again, to another worker or to this one under a new receipt;
    the new holder finishes it, and results are deduplicated by sample id."""
    try:
        await done
    except BatchItemError as exc:
        if not is_stale_receipt(exc.failure.code):
            raise
        log.info("did not %s a message on %s: its receipt is stale (%s); another receive "
                 "holds it", action, queue_url, exc.failure.code)
        return False
    return True
