"""Visibility heartbeat: received messages stay invisible while their episode runs.

A queue's visibility timeout is sized for a typical episode, not the longest one. Instead of a
huge timeout (which delays redelivery after a crash by as much), every held message is extended
by `lease_s` every `lease_s / 3` seconds, ten receipts per call. A worker that dies stops
extending, and its messages come back within one lease.
"""

from __future__ import annotations

import asyncio
import logging

from mtrl_rollout.sqs import MAX_BATCH, Sqs

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, sqs: Sqs, queue_url: str, lease_s: int) -> None:
        self._sqs = sqs
        self._queue_url = queue_url
        self.lease_s = max(1, lease_s)
        self._receipts: dict[str, str] = {}

    def hold(self, key: str, receipt_handle: str) -> None:
        """Start (or, after a redelivery to this worker, continue) extending `key`'s message."""
        self._receipts[key] = receipt_handle

    def receipt(self, key: str) -> str | None:
        return self._receipts.get(key)

    def drop(self, key: str) -> str | None:
        return self._receipts.pop(key, None)

    def __contains__(self, key: str) -> bool:
        return key in self._receipts

    def __len__(self) -> int:
        return len(self._receipts)

    async def run(self) -> None:
        interval = self.lease_s / 3
        while True:
            await asyncio.sleep(interval)
            await self.extend_all()

    async def extend_all(self) -> None:
        receipts = list(self._receipts.values())
        chunks = [receipts[i : i + MAX_BATCH] for i in range(0, len(receipts), MAX_BATCH)]
        results = await asyncio.gather(
            *(self._sqs.change_visibility_batch(self._queue_url, c, self.lease_s) for c in chunks),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                log.warning("visibility heartbeat failed: %s", result)
            elif result:
                # Typically the receipt went stale because the message was redelivered; the
                # consumer's dedupe by sample id makes the duplicate harmless.
                log.warning(
                    "visibility heartbeat: %d receipts not extended (%s)",
                    len(result),
                    result[0].code,
                )
