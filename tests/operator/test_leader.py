"""Leader election: the pure decision, and the elector against an in-memory Lease with
optimistic concurrency and a clock the test moves (the API-server edge is in
test_active_standby.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from dataclasses import dataclass, field

import pytest

from mtrl_operator.errors import FatalConfig
from mtrl_operator.leader import (
    ElectionThread,
    LeaderElector,
    LeaseConflict,
    LeaseRecord,
    next_record,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_a_free_lease_is_taken() -> None:
    record = next_record(None, False, "a", T0, 15)
    assert record == LeaseRecord("a", 15, T0, T0, 0)


def test_another_holders_valid_lease_is_left_alone() -> None:
    held = LeaseRecord("b", 15, T0, T0, 3)
    assert next_record(held, True, "a", T0, 15) is None


def test_an_expired_lease_changes_hands_and_counts_the_transition() -> None:
    held = LeaseRecord("b", 15, T0, T0, 3)
    later = T0 + dt.timedelta(seconds=20)
    assert next_record(held, False, "a", later, 15) == LeaseRecord("a", 15, later, later, 4)


def test_a_released_lease_is_taken_at_once() -> None:
    released = LeaseRecord("", 1, T0, T0, 3)
    assert next_record(released, True, "a", T0, 15) == LeaseRecord("a", 15, T0, T0, 4)


def test_a_renewal_keeps_the_acquisition_time_and_the_count() -> None:
    mine = LeaseRecord("a", 15, T0, T0, 2)
    later = T0 + dt.timedelta(seconds=2)
    assert next_record(mine, True, "a", later, 15) == LeaseRecord("a", 15, T0, later, 2)


@dataclass
class MemoryLease:
    """A Lease with a resourceVersion, as the API server keeps one; `down` refuses requests."""

    record: LeaseRecord | None = None
    version: int = 0
    down: bool = False
    writes: list[str] = field(default_factory=list)

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("API server unreachable")

    async def read(self) -> tuple[LeaseRecord, str] | None:
        self._check()
        return None if self.record is None else (self.record, str(self.version))

    async def create(self, record: LeaseRecord) -> str:
        self._check()
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    async def write(self, record: LeaseRecord, resource_version: str) -> str:
        self._check()
        if resource_version != str(self.version):
            raise LeaseConflict("stale")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> str:
        self.record, self.version = record, self.version + 1
        self.writes.append(record.holder)
        return str(self.version)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _elector(store: MemoryLease, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(store, identity, lease_duration=15, renew_deadline=10, retry_period=2,
                         clock=clock, wall_clock=lambda: T0 + dt.timedelta(seconds=clock.now))


async def test_one_candidate_wins_and_the_other_waits_for_the_lease_to_expire() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = _elector(store, "a", clock), _elector(store, "b", clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert a.holding() and not b.holding() and b.leader == "a"
    clock.now += 14  # a stops renewing; b measures from when it first saw the record
    assert not await b.try_acquire_or_renew()
    clock.now += 2
    assert await b.try_acquire_or_renew()
    assert store.record is not None and store.record.holder == "b"
    assert store.record.transitions == 1


async def test_a_leader_that_cannot_renew_stops_holding_before_the_lease_expires() -> None:
    store, clock = MemoryLease(), Clock()
    a = _elector(store, "a", clock)
    assert await a.try_acquire_or_renew()
    store.down = True
    clock.now += 9.9
    assert a.holding()
    clock.now += 0.2  # past the renew deadline (10 s), still inside the lease (15 s)
    assert not a.holding()


async def test_two_candidates_racing_on_one_version_cannot_both_win() -> None:
    store, clock = MemoryLease(), Clock()
    a, b, c = (_elector(store, name, clock) for name in "abc")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew() and not await c.try_acquire_or_renew()
    clock.now += 20  # a is gone; b and c both find the lease expired at the same version
    found = await store.read()
    assert found is not None
    assert await b.try_acquire_or_renew()
    # c read before b's write: its write carries the old resourceVersion and is refused.
    with pytest.raises(LeaseConflict):
        await store.write(LeaseRecord("c", 15, T0, T0, 1), found[1])
    assert not await c.try_acquire_or_renew()
    assert store.writes == ["a", "b"]


async def test_release_hands_over_without_waiting_for_the_duration() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = _elector(store, "a", clock), _elector(store, "b", clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert not a.holding()
    assert await b.try_acquire_or_renew()


async def test_the_charts_empty_lease_is_taken_at_once() -> None:
    """The chart makes the Lease with an empty spec (so that `helm uninstall` deletes it): no
    holder, no duration, no renew time. The first candidate takes it without waiting."""
    store, clock = MemoryLease(LeaseRecord("", 0, None, None, 0)), Clock()
    a, b = _elector(store, "a", clock), _elector(store, "b", clock)
    assert await a.try_acquire_or_renew()
    assert store.record == LeaseRecord("a", 15, a.wall_clock(), a.wall_clock(), 1)
    assert not await b.try_acquire_or_renew()


class RefusedWrites(MemoryLease):
    async def write(self, record: LeaseRecord, resource_version: str) -> str:
        if not record.holder:  # the release; renewals pass
            raise FatalConfig("the operator may not update its Lease ns/lease (403 Forbidden)")
        return await super().write(record, resource_version)


async def test_a_release_that_is_refused_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """At `helm uninstall` the Role may be gone before the leader stops: its release is
    refused, which is logged, not swallowed; the stop goes on."""
    store, clock = RefusedWrites(), Clock()
    a = _elector(store, "a", clock)
    assert await a.try_acquire_or_renew()
    await a.release()
    assert not a.holding()
    assert store.record is not None and store.record.holder == "a"
    assert "could not release the lease" in caplog.text and "403 Forbidden" in caplog.text


def test_settings_that_would_let_two_leaders_overlap_are_refused() -> None:
    with pytest.raises(ValueError, match="renew deadline"):
        LeaderElector(MemoryLease(), "a", lease_duration=10, renew_deadline=10, retry_period=2)


class SlowLease(MemoryLease):
    async def read(self) -> tuple[LeaseRecord, str] | None:
        await asyncio.sleep(0.3)  # a loaded API server, or a starved process
        return await super().read()


async def test_a_slow_api_server_is_not_a_lost_lease() -> None:
    """A try may take until the renew deadline, not only a retry period (client-go's bound)."""
    store = SlowLease()
    elector = LeaderElector(store, "a", lease_duration=3, renew_deadline=2, retry_period=0.1)
    await asyncio.wait_for(elector.acquire(), 5)
    assert elector.holding()
    assert await elector._attempt()


async def test_the_election_thread_holds_and_releases_while_the_loop_is_busy() -> None:
    store = MemoryLease()
    lost: list[bool] = []
    thread = ElectionThread(lambda: LeaderElector(store, "a", lease_duration=3,
                                                  renew_deadline=2, retry_period=0.2),
                            lambda: lost.append(True), lambda line: lost.append(False))
    await asyncio.wait_for(thread.acquire(), 5)
    # The operator's loop is blocked for longer than the lease (a burst of reconciles on a
    # starved machine): renewals go on, on their own thread.
    time.sleep(3.5)  # noqa: ASYNC251 (the point: this loop is blocked)
    assert thread.holding() and not lost
    assert store.writes.count("a") >= 3
    await thread.release()
    assert store.record is not None and store.record.holder == "" and not thread.holding()


async def test_a_standby_that_cannot_reach_the_api_server_is_not_ready() -> None:
    store = MemoryLease(record=LeaseRecord("b", 15, T0, T0, 0))
    elector = LeaderElector(store, "a", lease_duration=3, renew_deadline=2, retry_period=0.1)
    assert not await elector._attempt() and elector.reachable()  # standing by, in touch
    store.down = True
    assert not await elector._attempt()
    assert elector.reachable(), "a blip within the renew deadline is still ready"
    elector.clock = lambda: time.monotonic() + 5
    assert not elector.reachable() and elector.last_error


class ForbiddenLease(MemoryLease):
    async def read(self) -> tuple[LeaseRecord, str] | None:
        raise FatalConfig("the operator may not get its Lease ns/lease (403 Forbidden)")


async def test_an_election_that_cannot_work_ends_the_process_with_one_line() -> None:
    """A Lease the ServiceAccount may not read, from the start and for a whole renew deadline,
    is no passing trouble: the thread says so once (main exits 2 on it) instead of dying
    quietly or retrying for ever."""
    said: list[str] = []
    told = asyncio.Event()
    loop = asyncio.get_running_loop()

    def fatal(line: str) -> None:  # on the election thread
        said.append(line)
        loop.call_soon_threadsafe(told.set)

    thread = ElectionThread(lambda: LeaderElector(ForbiddenLease(), "a", lease_duration=3,
                                                  renew_deadline=2, retry_period=0.1),
                            lambda: said.append("lost"), fatal)
    acquiring = asyncio.ensure_future(thread.acquire())
    started = time.monotonic()
    await asyncio.wait_for(told.wait(), 10)
    assert time.monotonic() - started >= 2  # not at the first refusal
    acquiring.cancel()
    assert said == ["the operator may not get its Lease ns/lease (403 Forbidden)"]
    assert not thread.ready()


class BrieflyForbiddenLease(MemoryLease):
    """An API server just restarted: its authorizer refuses once, then allows."""

    refusals: int = 1

    async def read(self) -> tuple[LeaseRecord, str] | None:
        if self.refusals:
            self.refusals -= 1
            raise FatalConfig("the operator may not get its Lease ns/lease (403 Forbidden)")
        return await super().read()


async def test_a_leader_refused_for_a_moment_keeps_its_lease() -> None:
    store = BrieflyForbiddenLease()
    elector = LeaderElector(store, "a", lease_duration=3, renew_deadline=2, retry_period=0.1)
    store.refusals = 0
    await asyncio.wait_for(elector.acquire(), 5)
    store.refusals = 1
    assert not await elector._attempt()  # refused: no raise, the renewal is retried
    assert await elector._attempt() and elector.holding()
