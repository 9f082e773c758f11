"""Per-step statistics for progress reports: rewards, success, reward collapse."""

from __future__ import annotations

import math
from collections.abc import Sequence

from mtrl_rollout.collapse import AGGREGATE, collapse_stats
from mtrl_rollout.protocol import RolloutResult
from mtrl_trainer.progress import ComponentReport

SUCCESS_METRICS = ("success", "solved")


def succeeded(result: RolloutResult, reward_max: float = 1.0) -> bool:
    """An environment's own success metric when it reports one, else a top aggregate reward."""
    for name in SUCCESS_METRICS:
        value = result.metric(name)
        if value is not None:
            return value >= 0.5
    return result.aggregate_reward_score >= reward_max - 1e-6


def success_rate(results: Sequence[RolloutResult]) -> float | None:
    return sum(map(succeeded, results)) / len(results) if results else None


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def components(results: Sequence[RolloutResult]) -> list[ComponentReport]:
    return [
        ComponentReport(name, s.mean, s.std, s.zero_variance_fraction)
        for name, s in collapse_stats(results).items()
        if name != AGGREGATE
    ]
