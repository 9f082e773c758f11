"""The token bucket behind spec.rollout.maxPolicyRequestsPerSecond, on a fake clock."""

import pytest

from mtrl_rollout.ratelimit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_one_seconds_worth_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(10, clock=clock)
    assert [bucket.wait_for() for _ in range(10)] == [0.0] * 10
    assert bucket.wait_for() == pytest.approx(0.1)  # the 11th waits a tenth of a second
    assert bucket.wait_for() == pytest.approx(0.2)  # and the 12th behind it
    clock.now += 0.2  # both paid for: the bucket is empty, not in debt
    assert bucket.wait_for() == pytest.approx(0.1)
    clock.now += 60  # an idle minute refills only up to the burst
    assert [bucket.wait_for() for _ in range(10)] == [0.0] * 10
    assert bucket.wait_for() > 0


def test_a_slow_rate_still_lets_one_request_through() -> None:
    bucket = TokenBucket(0.5, clock=Clock())
    assert bucket.wait_for() == 0.0
    assert bucket.wait_for() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(0)


async def test_acquire_waits_its_turn() -> None:
    bucket = TokenBucket(50)  # the real clock: 60 acquisitions need at least 0.2 s
    import time

    started = time.monotonic()
    for _ in range(60):
        await bucket.acquire()
    assert time.monotonic() - started >= 0.19
