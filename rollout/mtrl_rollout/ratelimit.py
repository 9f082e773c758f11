"""A token bucket: at most `rate` acquisitions per second on average, bursts of `burst`.

The trainer caps its policy's generate requests per run with it (spec.rollout.
maxPolicyRequestsPerSecond): environments that call quota-limited APIs between turns are paced
by how fast their turns are answered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, rate: float, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, not {rate}")
        self.rate = rate
        self.burst = max(burst if burst is not None else rate, 1.0)
        self._clock = clock
        self._tokens = self.burst
        self._at = clock()
        self._lock = asyncio.Lock()

    def wait_for(self, tokens: float = 1.0) -> float:
        """Seconds until `tokens` are available (0 now); takes them either way."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= tokens
        return max(0.0, -self._tokens / self.rate)

    async def acquire(self, tokens: float = 1.0) -> None:
        async with self._lock:  # first come, first served
            delay = self.wait_for(tokens)
            if delay:
                await asyncio.sleep(delay)
