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


def turn_seconds(results: Sequence[RolloutResult]) -> float | None:
    """The workers' mean wait for one turn's reply from the policy: the trainer's sampling
    (`turnSampleSeconds`) plus the trip of the request and the response through the queues."""
    pairs = [(r.metric("generate_seconds"), r.metric("model_turns")) for r in results]
    waited = [(s, n) for s, n in pairs if s is not None and n]
    turns = math.fsum(n for _, n in waited)
    return round(math.fsum(s for s, _ in waited) / turns, 4) if turns else None


def components(results: Sequence[RolloutResult]) -> list[ComponentReport]:
    return [
        ComponentReport(name, s.mean, s.std, s.zero_variance_fraction)
        for name, s in collapse_stats(results).items()
        if name != AGGREGATE
    ]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from n plays with c successes (Chen et al., 2021):
    1 - C(n-c, k) / C(n, k), the chance that k plays drawn from the n include a success."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 0 <= c <= n and 1 <= k <= n, not n={n} c={c}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def validation_pass_at_k(results: Sequence[RolloutResult], ks: Sequence[int]) -> dict[int, float]:
    """pass@k averaged over the validation tasks (a task is a group of plays), for each k no
    larger than the plays every task has (a failed play leaves its task with fewer)."""
    plays: dict[str, list[bool]] = {}
    for result in results:
        plays.setdefault(result.group_id, []).append(succeeded(result))
    if not plays:
        return {}
    fewest = min(len(p) for p in plays.values())
    return {k: math.fsum(pass_at_k(len(p), sum(p), k) for p in plays.values()) / len(plays)
            for k in sorted(ks) if k <= fewest}
