"""A step's rollouts: publish promptsPerStep x groupSize requests, collect their results.

Publishing and collecting are apart so that the loop can play ahead: with
`maxStepsOffPolicy` k, the requests of steps s+1..s+k are out while step s trains
(`Orchestrator.publish` then, later, `Orchestrator.gather`), and the result collector keeps
the results of the steps played ahead until their step gathers them.

Rules (docs/trainer.md, "Late and failed samples"):
- collection ends when every sample has a result, or when no new result arrived for
  `episodeTimeoutSeconds + MTRL_COLLECT_GRACE_S` (an idle timeout: a slow but moving queue is
  waited for, a stalled one is not, and nothing hangs);
- a sample that has not arrived by then is *late*; one whose episode errored or timed out is
  *failed*; one any of whose turns came from a policy more than `maxStepsOffPolicy` versions
  older than the one it would train is *stale*, and never trained on;
- a group with any late, failed or stale sample is dropped from the update (GRPO compares a
  sample with its own group only, and a partial group's baseline is biased by what went
  missing); every drop is counted and logged;
- sample ids embed the trainer attempt, so results of a killed predecessor are never mixed in,
  and the result collector keeps the first result per sample id (delivery is at least once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from mtrl_rollout.batching import Outbox
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import RolloutRequest, RolloutResult, StopReason
from mtrl_rollout.results import ResultCollector
from mtrl_rollout.sqs import Outgoing
from mtrl_trainer.dataset import Task

log = logging.getLogger(__name__)

COLLECT_SLICE_S = 2.0


@dataclass(frozen=True)
class RolloutSettings:
    run_id: str
    attempt: str
    rollout_queue_url: str
    result_queue_url: str
    environment: str
    max_turns: int
    max_length: int
    episode_timeout_s: float
    collect_grace_s: float
    max_steps_off_policy: int
    max_episodes_in_flight: int | None = None


@dataclass
class Counts:
    published: int = 0
    received: int = 0
    late: int = 0
    failed: int = 0
    stale: int = 0
    dropped_groups: int = 0


@dataclass
class Rollouts:
    groups: list[list[RolloutResult]]  # complete groups, each in sample order
    results: list[RolloutResult]  # every usable result (complete groups or not)
    counts: Counts = field(default_factory=Counts)
    seconds: float = 0.0  # from publishing the requests to the last result
    waited_seconds: float = 0.0  # of those, spent in `gather`
    errors: list[str] = field(default_factory=list)  # what each failed episode's worker said

    def extend(self, more: Rollouts) -> None:
        """Add another round of the same step (dynamic sampling)."""
        self.groups += more.groups
        self.results += more.results
        self.errors += more.errors
        for name, value in vars(more.counts).items():
            setattr(self.counts, name, getattr(self.counts, name) + value)
        self.waited_seconds += more.waited_seconds

    @property
    def oldest_policy_version(self) -> int | None:
        """The oldest policy that produced a turn of a result in a complete group."""
        versions = [oldest_turn_version(r) for group in self.groups for r in group]
        return min(versions, default=None)


@dataclass
class Pending:
    """Published requests whose results are not gathered yet."""

    requests: list[RolloutRequest]
    group_size: int
    published_at: float
    sending: asyncio.Task[None] | None = None  # under an episode window: the sends to come
    abandoned: bool = False  # gathered: what is not sent yet never will be


class EpisodeWindow:
    """At most `limit` episodes whose results have not arrived (spec.rollout.
    maxEpisodesInFlight): a request waits for a slot before it is sent; its result, or its
    step giving up on it, frees the slot. Waiters are served first come, first served, so the
    steps played ahead queue behind the current one."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = asyncio.Semaphore(limit)
        self._held: set[str] = set()

    @property
    def in_flight(self) -> int:
        return len(self._held)

    async def take(self, sample_id: str) -> None:
        await self._free.acquire()
        self._held.add(sample_id)

    def free(self, sample_id: str) -> None:
        if sample_id in self._held:
            self._held.remove(sample_id)
            self._free.release()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("sending rollout requests failed; the unsent ones will count as late",
                  exc_info=task.exception())


def sample_id(attempt: str, kind: str, step: int, group: int, index: int) -> str:
    return f"{attempt}-{kind}{step}-g{group}-{index}"


class Orchestrator:
    def __init__(
        self, settings: RolloutSettings, outbox: Outbox, collector: ResultCollector, codec: Codec
    ) -> None:
        self.settings = settings
        self._outbox = outbox
        self._collector = collector
        self._codec = codec
        self.window = None
        if settings.max_episodes_in_flight:
            self.window = EpisodeWindow(settings.max_episodes_in_flight)
            collector.on_result = self.window.free

    async def play(
        self, kind: str, step: int, tasks: Sequence[Task], group_size: int, policy_version: int
    ) -> Rollouts:
        """Play `group_size` episodes of each task with the current policy, and wait for them.
        `kind` ("s" train, "v" validation) keeps the sample ids of both apart."""
        pending = await self.publish(kind, step, tasks, group_size, policy_version)
        return await self.gather(pending, policy_version)

    async def publish(
        self, kind: str, step: int, tasks: Sequence[Task], group_size: int, policy_version: int,
        first_group: int = 0,
    ) -> Pending:
        """Requests for `tasks`, numbered as groups `first_group`... of the step."""
        s = self.settings
        published_at = time.monotonic()
        requests = [
            RolloutRequest(
                run_id=s.run_id, step=step, group_id=f"{s.attempt}-{kind}{step}-g{g}",
                sample_id=sample_id(s.attempt, kind, step, g, i), policy_version=policy_version,
                data=task, max_length=s.max_length, max_turns=s.max_turns,
                episode_timeout_s=s.episode_timeout_s, environment=s.environment,
                result_queue_url=s.result_queue_url,
            )
            for g, task in enumerate(tasks, start=first_group)
            for i in range(group_size)
        ]
        self._collector.expect(r.sample_id for r in requests)
        pending = Pending(requests, group_size, published_at)
        if self.window is None:
            await asyncio.gather(*(self._send(r) for r in requests))
        else:
            pending.sending = asyncio.create_task(self._send_in_window(pending, self.window))
            pending.sending.add_done_callback(_log_failure)
        return pending

    async def _send(self, request: RolloutRequest) -> None:
        body = await self._codec.to_body(request)
        await self._outbox.send(self.settings.rollout_queue_url, Outgoing(body))

    async def _send_in_window(self, pending: Pending, window: EpisodeWindow) -> None:
        sends = []
        for request in pending.requests:
            await window.take(request.sample_id)
            if pending.abandoned:
                window.free(request.sample_id)
                break
            sends.append(asyncio.create_task(self._send(request)))
        await asyncio.gather(*sends)

    async def gather(self, pending: Pending, trained_version: int) -> Rollouts:
        """The results of `pending`, judged for training policy version `trained_version`."""
        started = time.monotonic()
        wanted = [r.sample_id for r in pending.requests]
        got = await self._collect(wanted)
        self._collector.forget(wanted)
        pending.abandoned = True
        if self.window is not None:
            for sample in wanted:  # the late ones' slots
                self.window.free(sample)
        rollouts = judge(pending.requests, got, pending.group_size,
                         oldest=trained_version - self.settings.max_steps_off_policy)
        rollouts.seconds = time.monotonic() - pending.published_at
        rollouts.waited_seconds = time.monotonic() - started
        return rollouts

    async def _collect(self, wanted: list[str]) -> dict[str, RolloutResult]:
        idle_s = self.settings.episode_timeout_s + self.settings.collect_grace_s
        got: dict[str, RolloutResult] = {}
        last_progress, received = time.monotonic(), self._collector.received
        while len(got) < len(wanted):
            remaining = idle_s - (time.monotonic() - last_progress)
            if remaining <= 0:
                break
            missing = [w for w in wanted if w not in got]
            new = await self._collector.collect(missing, timeout_s=min(COLLECT_SLICE_S, remaining))
            got.update(new)
            # Any result is progress: under an episode window, a later-published round's
            # requests wait for the slots that the steps played ahead free as they finish.
            if new or self._collector.received != received:
                last_progress, received = time.monotonic(), self._collector.received
        return got


# What a result that never came is called where the step's errors are counted: its worker
# stopped or timed out sending it, could not write its payload, or it could not be read here.
LATE = ("no result came back (the worker stopped, or its result could not be sent, written "
        "to S3 or read back)")


def oldest_turn_version(result: RolloutResult) -> int:
    return min([t.policy_version for t in result.trajectory] + [result.policy_version])


def judge(
    requests: Sequence[RolloutRequest], got: dict[str, RolloutResult], group_size: int, *,
    oldest: int,
) -> Rollouts:
    """Sort results into usable, late, failed and stale (a turn from a policy older than
    `oldest`), and keep the groups whose every sample is usable."""
    counts = Counts(published=len(requests), received=len(got))
    usable: dict[str, RolloutResult] = {}
    errors: list[str] = []
    for request in requests:
        result = got.get(request.sample_id)
        if result is None:
            counts.late += 1
            errors.append(LATE)
        elif result.stop_reason in (StopReason.ERROR, StopReason.TIMEOUT):
            counts.failed += 1
            errors.append(result.error or f"the episode ended with {result.stop_reason.value}")
            log.warning("sample %s failed (%s): %s", result.sample_id,
                        result.stop_reason.value, result.error)
        elif oldest_turn_version(result) < oldest:
            counts.stale += 1
        else:
            usable[request.sample_id] = result
    groups: list[list[RolloutResult]] = []
    for start in range(0, len(requests), group_size):
        members = [usable.get(r.sample_id) for r in requests[start : start + group_size]]
        complete = [m for m in members if m is not None]
        if len(complete) == group_size:
            groups.append(complete)
        else:
            counts.dropped_groups += 1
    if counts.late or counts.failed or counts.stale:
        log.warning("step rollouts: %d late, %d failed, %d stale; %d of %d groups dropped",
                    counts.late, counts.failed, counts.stale, counts.dropped_groups,
                    len(requests) // group_size)
    return Rollouts(groups, list(usable.values()), counts, errors=errors)
