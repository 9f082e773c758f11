"""A keyed work queue, as controller-runtime has: each key is reconciled by one worker at a
time, repeated adds while it waits collapse into one, and a key can be re-added later.

Events and resyncs only add keys; the reconcile reads the latest cached state. So a burst of
events for one run costs one reconcile, and 500 runs cost 500 keys, not 500 polling loops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger("mtrl.workqueue")

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self, handler: Callable[[K], Awaitable[float | None]], workers: int,
                 max_backoff: float = 300.0) -> None:
        self._handler = handler
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}
        self._max_backoff = max_backoff
        self._tasks = [asyncio.create_task(self._work()) for _ in range(workers)]

    def add(self, key: K, after: float = 0.0) -> None:
        if after > 0:
            loop = asyncio.get_running_loop()
            existing = self._timers.get(key)
            if existing is not None and existing.when() <= loop.time() + after:
                return  # an earlier wake-up is already due
            if existing is not None:
                existing.cancel()
            self._timers[key] = loop.call_later(after, self._fire, key)
            return
        if key in self._active:
            self._dirty.add(key)  # run again once the current reconcile ends
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def forget(self, key: K) -> None:
        timer = self._timers.pop(key, None)
        if timer:
            timer.cancel()
        self._failures.pop(key, None)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                requeue = await self._handler(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                requeue = min(self._max_backoff, 0.5 * 2 ** (failures - 1))
                log.exception("reconcile of %s failed (%d in a row); retrying in %.1fs",
                              key, failures, requeue)
            finally:
                self._active.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            elif requeue is not None:
                self.add(key, after=requeue)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for timer in self._timers.values():
            timer.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def every(seconds: float, step: Callable[[], Awaitable[object]], what: str) -> None:
    """Run `step` now and then every `seconds`, forever; a failed step is logged, not fatal."""
    while True:
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s failed: %r", what, exc)
        await asyncio.sleep(seconds)
