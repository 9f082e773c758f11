"""Active/standby replicas: leader election on a `coordination.k8s.io/v1` Lease.

The algorithm is client-go's (`tools/leaderelection/leaderelection.go`, which
controller-runtime uses): a candidate takes the Lease when nobody holds it or when the holder
has not renewed it for `leaseDurationSeconds`, measured on the candidate's own clock from the
moment it last saw the record change (so clock skew between replicas does not matter); the
holder renews every `retry_period`; every write is a PUT with the resourceVersion read before
it, so two candidates cannot both win. A holder that cannot renew for `renew_deadline`
(shorter than the lease duration) stops acting before anyone else may take over.

`next_record` is the decision, pure; `LeaderElector` runs it against the API server.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from mtrl_operator.errors import FatalConfig

log = logging.getLogger("mtrl.leader")


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec, as client-go's LeaderElectionRecord."""

    holder: str
    duration_seconds: int
    acquire_time: dt.datetime | None
    renew_time: dt.datetime | None
    transitions: int = 0


class LeaseStore(Protocol):
    """Reads and writes one Lease. `write` raises `LeaseConflict` when the resourceVersion it
    is given is no longer the current one."""

    async def read(self) -> tuple[LeaseRecord, str] | None: ...

    async def create(self, record: LeaseRecord) -> str: ...

    async def write(self, record: LeaseRecord, resource_version: str) -> str: ...


class LeaseConflict(Exception):
    """Another candidate wrote the Lease since we read it."""


def next_record(current: LeaseRecord | None, held_by_other: bool, identity: str,
                now: dt.datetime, duration_seconds: int) -> LeaseRecord | None:
    """The record that takes or keeps the lease for `identity`, or None while another holder's
    lease is still valid. `held_by_other` is the caller's reading of its own clock: someone
    else holds the record and it changed less than its duration ago."""
    mine = LeaseRecord(holder=identity, duration_seconds=duration_seconds, acquire_time=now,
                       renew_time=now)
    if current is None:
        return mine
    if current.holder and current.holder != identity and held_by_other:
        return None
    if current.holder == identity:  # a renewal keeps the acquisition and the count
        return replace(mine, acquire_time=current.acquire_time, transitions=current.transitions)
    return replace(mine, transitions=current.transitions + 1)


@dataclass
class LeaderElector:
    store: LeaseStore
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    def __post_init__(self) -> None:
        if not self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs retry period < renew deadline < lease "
                             f"duration, not {self.retry_period} < {self.renew_deadline} < "
                             f"{self.lease_duration}")
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0  # our clock when the record last changed
        self._renewed_at: float | None = None  # our clock when our last write succeeded
        self._answered_at: float | None = None  # our clock when the API server last answered
        self.last_error: str | None = None  # why the last try failed, if it did
        self._refused_since: float | None = None  # our clock at the first 401/403 in a row

    @property
    def leader(self) -> str | None:
        """Who held the lease when we last looked."""
        return self._observed.holder if self._observed else None

    def reachable(self) -> bool:
        """The API server answered a try within the renew deadline: a standby that cannot
        reach it (or a leader about to lose its Lease) is not ready."""
        return self._answered_at is not None and \
            self.clock() - self._answered_at < self.renew_deadline

    def holding(self) -> bool:
        """True while our last renewal is younger than the renew deadline: the fence every
        mutation checks. A leader past it may already be replaced soon, so it must not act."""
        return self._renewed_at is not None and \
            self.clock() - self._renewed_at < self.renew_deadline

    async def try_acquire_or_renew(self) -> bool:
        now_mono, now = self.clock(), self.wall_clock()
        found = await self.store.read()
        if found is None:
            record = next_record(None, False, self.identity, now, int(self.lease_duration))
            assert record is not None
            try:
                await self.store.create(record)
            except LeaseConflict:
                return False
            return self._won(record, now_mono)
        current, version = found
        if current != self._observed:
            self._observed, self._observed_at = current, now_mono
        held_by_other = now_mono < self._observed_at + current.duration_seconds
        record = next_record(current, held_by_other, self.identity, now, int(self.lease_duration))
        if record is None:
            return False
        try:
            await self.store.write(record, version)
        except LeaseConflict:
            return False
        return self._won(record, now_mono)

    def _won(self, record: LeaseRecord, at: float) -> bool:
        if self._renewed_at is None:
            log.info("acquired the lease as %s (transition %d)", self.identity,
                     record.transitions)
        self._observed, self._observed_at, self._renewed_at = record, at, at
        return True

    async def _attempt(self) -> bool:
        """One try. As in client-go, a try may take until the renew deadline: a leader's until
        its own deadline (a slow API server or a starved process is not a lost lease yet), a
        candidate's a whole deadline."""
        left = self.renew_deadline
        if self._renewed_at is not None:
            left -= self.clock() - self._renewed_at
        try:
            async with asyncio.timeout(max(left, 0.001)):
                won = await self.try_acquire_or_renew()
        except asyncio.CancelledError:
            raise
        except FatalConfig as exc:
            # Refused (401/403). Right after an API server restart its authorizer may refuse
            # for a moment what it allows: fatal only for a replica that never got an answer
            # and has been refused for a whole renew deadline.
            now = self.clock()
            self._refused_since = self._refused_since or now
            if self._answered_at is None and now - self._refused_since >= self.renew_deadline:
                raise
            log.warning("lease request refused: %s", exc)
            self.last_error = str(exc)
            return False
        except Exception as exc:  # the API server is away: a candidate keeps trying
            log.warning("lease request failed: %r", exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        self._answered_at, self._refused_since, self.last_error = self.clock(), None, None
        return won

    async def acquire(self) -> None:
        """Return once this replica holds the lease; standby until then."""
        announced = None
        while not await self._attempt():
            if self.leader != announced:
                announced = self.leader
                log.info("standing by: the lease is held by %s", announced)
            await asyncio.sleep(self.retry_period)

    async def hold(self) -> None:
        """Renew every retry period; return when leadership is lost (no renewal within the
        renew deadline, or another holder took the lease)."""
        while True:
            await asyncio.sleep(self.retry_period)
            while not await self._attempt():
                if not self.holding() or (self.leader not in (None, self.identity)):
                    log.error("lost the lease (held by %s; last renewal %.1fs ago)",
                              self.leader, self.clock() - (self._renewed_at or 0.0))
                    self._renewed_at = None
                    return
                await asyncio.sleep(self.retry_period)

    async def release(self) -> None:
        """Give the lease up at a graceful stop, so the standby takes over at once (client-go's
        ReleaseOnCancel: no holder, a one-second duration)."""
        if not self.holding():
            return
        self._renewed_at = None
        try:
            found = await self.store.read()
            if found is None or found[0].holder != self.identity:
                return
            now = self.wall_clock()
            await self.store.write(LeaseRecord(holder="", duration_seconds=1, acquire_time=now,
                                               renew_time=now,
                                               transitions=found[0].transitions), found[1])
        except Exception as exc:  # the standby then waits out the lease duration, no more
            log.warning("could not release the lease %s: %s", self.store, exc)
            return
        log.info("released the lease")


class ElectionThread:
    """An elector on a thread and event loop of its own, as client-go renews in a goroutine of
    its own: hundreds of reconciles, or a slow start on a loaded machine, must not delay a
    renewal on the operator's loop until the lease is lost.

    `make_elector` runs on that thread (its API client belongs to that loop); `on_lost` too,
    the moment leadership is lost, and `on_fatal` with one line when the election cannot
    work at all (a kubeconfig that cannot be loaded, a Lease it may not read): a thread that
    died quietly would leave a live, healthy-looking process that never acts."""

    def __init__(self, make_elector: Callable[[], LeaderElector],
                 on_lost: Callable[[], None], on_fatal: Callable[[str], None]) -> None:
        self._make = make_elector
        self._on_lost = on_lost
        self._on_fatal = on_fatal
        self._elector: LeaderElector | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()),
                                        name="leader-election", daemon=True)
        self._acquired: asyncio.Future[None] | None = None

    @property
    def leader(self) -> str | None:
        return self._elector.leader if self._elector else None

    def holding(self) -> bool:
        return self._elector is not None and self._elector.holding()

    @property
    def error(self) -> str | None:
        """Why the last try failed, if it did."""
        return self._elector.last_error if self._elector else None

    def alive(self) -> bool:
        """The election thread runs (or has not been started)."""
        return self._thread.ident is None or self._thread.is_alive()

    def ready(self) -> bool:
        """Alive and talking to the API server: what the readiness probe answers."""
        return self.alive() and self._elector is not None and self._elector.reachable()

    async def acquire(self) -> None:
        """Start the thread; return once it holds the lease."""
        self._acquired = asyncio.get_running_loop().create_future()
        self._thread.start()
        await self._acquired

    async def _main(self) -> None:
        try:
            await self._elect()
        except FatalConfig as exc:
            self._on_fatal(str(exc))
        except Exception as exc:
            self._on_fatal(f"leader election failed: {type(exc).__name__}: {exc}")

    async def _elect(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._elector = elector = self._make()
        await elector.acquire()
        acquired = self._acquired
        assert acquired is not None

        def announce() -> None:  # on the operator's loop; a cancelled wait wants no result
            if not acquired.done():
                acquired.set_result(None)

        acquired.get_loop().call_soon_threadsafe(announce)
        hold = asyncio.create_task(elector.hold())
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait({hold, stop}, return_when=asyncio.FIRST_COMPLETED)
        if hold.done():
            self._on_lost()
            return
        hold.cancel()
        await elector.release()

    async def release(self) -> None:
        """Stop renewing and give the lease up; wait (a retry period at most) for the thread."""
        if self._loop is None or self._stop is None or self._elector is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join, self._elector.retry_period)
