"""Play one rollout request to a result. Always a result: a crash or a timeout becomes the
lowest reward of the run's range plus an `episode_error` / `episode_timeout` metric, so the
trainer's group is never short of a sample and the failure is visible in its metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from mtrl_rollout.protocol import MetricEntry, RolloutRequest, RolloutResult, StopReason, TurnRecord
from mtrl_worker.environments.base import (
    Environment,
    EpisodeLimitReached,
    EpisodeLimits,
    Policy,
)
from mtrl_worker.rewards import compose
from mtrl_worker.session import GenerationTimeout

log = logging.getLogger(__name__)


class RecordingPolicy(Policy, Protocol):
    turns: list[TurnRecord]
    stop_reason: StopReason | None
    generate_seconds: float  # waiting for the policy's replies, all turns together

    @property
    def completion_tokens(self) -> int: ...


class EnvironmentMismatch(ValueError):
    pass


async def run_episode(
    env: Environment,
    weights: Mapping[str, float],
    request: RolloutRequest,
    policy: RecordingPolicy,
    *,
    max_turns: int,
    timeout_s: float,
    worker_id: str = "",
) -> RolloutResult:
    started = time.monotonic()
    stop = StopReason.DONE
    error: str | None = None
    try:
        if request.environment is not None and request.environment != env.name:
            raise EnvironmentMismatch(f"request is for {request.environment!r}, not {env.name!r}")
        episode = env.episode(request.data, EpisodeLimits(max_turns, request.max_length))
        async with asyncio.timeout(timeout_s):
            try:
                await episode.play(policy)
            except EpisodeLimitReached as limit:
                stop = limit.reason
        stop = policy.stop_reason or stop  # an agent may have swallowed the limit error
        score = episode.score()
        aggregate, metrics = compose(score, env.components, weights, request.rewards.range)
        if score.turn_rewards is not None and policy.turns:  # a dry run records no turns
            _attach_turn_rewards(policy.turns, score.turn_rewards)
    except GenerationTimeout as exc:
        stop, error = StopReason.TIMEOUT, str(exc)
    except TimeoutError:
        stop, error = StopReason.TIMEOUT, f"episode exceeded {timeout_s:g}s"
    except Exception as exc:
        log.exception("episode %s failed", request.sample_id)
        stop, error = StopReason.ERROR, f"{type(exc).__name__}: {exc}"
    if error is not None:
        aggregate, metrics = request.rewards.range[0], []
    metrics += [
        _metric("episode_error", stop is StopReason.ERROR),
        _metric("episode_timeout", stop is StopReason.TIMEOUT),
        _metric("model_turns", len(policy.turns)),
        _metric("completion_tokens", policy.completion_tokens),
        _metric("generate_seconds", policy.generate_seconds),
        _metric("episode_seconds", time.monotonic() - started),
    ]
    return RolloutResult(
        run_id=request.run_id,
        step=request.step,
        group_id=request.group_id,
        sample_id=request.sample_id,
        policy_version=request.policy_version,
        aggregate_reward_score=aggregate,
        metrics_list=metrics,
        stop_reason=stop,
        trajectory=sorted(policy.turns, key=lambda t: t.turn),
        worker_id=worker_id,
        error=error,
    )


def _attach_turn_rewards(turns: list[TurnRecord], rewards: list[float]) -> None:
    if len(rewards) != len(turns):
        raise ValueError(f"the environment gave {len(rewards)} turn rewards for {len(turns)} "
                         "model turns")
    ordered = sorted(range(len(turns)), key=lambda i: turns[i].turn)
    for i, reward in zip(ordered, rewards, strict=True):
        turns[i] = turns[i].model_copy(update={"reward": float(reward)})


def _metric(name: str, value: float) -> MetricEntry:
    return MetricEntry(name=name, value=float(value), type="Metric")
