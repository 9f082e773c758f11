"""Reward-collapse statistics, shared by trainer and operator.

GRPO's advantage is a reward minus its group's mean, so a group whose rewards are all equal
teaches nothing. Per reward component (and for the aggregate) this reports the fraction of such
zero-variance groups and the component's mean and std; `CollapseDetector` turns a per-step
series of reports into "collapsed for N steps in a row" transitions for a condition and an Event.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mtrl_rollout.protocol import RolloutResult

AGGREGATE = "aggregate_reward_score"


@dataclass(frozen=True)
class ComponentStats:
    groups: int  # groups with at least two samples carrying the component
    zero_variance_groups: int
    mean: float
    std: float
    samples: int

    @property
    def zero_variance_fraction(self) -> float:
        return self.zero_variance_groups / self.groups if self.groups else 0.0


def reward_values(result: RolloutResult) -> dict[str, float]:
    values = {m.name: m.value for m in result.metrics_list if m.type == "Reward"}
    values[AGGREGATE] = result.aggregate_reward_score
    return values


def collapse_stats(results: Iterable[RolloutResult], tolerance: float = 1e-9) -> dict[str, ComponentStats]:
    groups: dict[str, list[Mapping[str, float]]] = defaultdict(list)
    for result in results:
        groups[result.group_id].append(reward_values(result))
    return component_stats(groups, tolerance)


def component_stats(
    groups: Mapping[str, Sequence[Mapping[str, float]]], tolerance: float = 1e-9
) -> dict[str, ComponentStats]:
    """`groups`: group id -> one {component: value} mapping per sample."""
    names = sorted({name for samples in groups.values() for s in samples for name in s})
    stats: dict[str, ComponentStats] = {}
    for name in names:
        every: list[float] = []
        sized = flat = 0
        for samples in groups.values():
            values = [s[name] for s in samples if name in s]
            every.extend(values)
            if len(values) >= 2:
                sized += 1
                flat += max(values) - min(values) <= tolerance
        mean = math.fsum(every) / len(every)
        variance = math.fsum((v - mean) ** 2 for v in every) / len(every)
        stats[name] = ComponentStats(sized, flat, mean, math.sqrt(variance), len(every))
    return stats


@dataclass(frozen=True)
class CollapseTransition:
    collapsed: frozenset[str]  # components collapsed now
    started: frozenset[str]  # newly collapsed at this step
    ended: frozenset[str]  # recovered at this step


@dataclass
class CollapseDetector:
    """A component has collapsed once its zero-variance fraction stayed at or above `threshold`
    for `patience` consecutive steps; it recovers at the first step below."""

    threshold: float = 0.9
    patience: int = 3
    _streaks: dict[str, int] = field(default_factory=dict)
    _collapsed: frozenset[str] = frozenset()

    def observe(self, stats: Mapping[str, ComponentStats]) -> CollapseTransition:
        for name, component in stats.items():
            if component.groups and component.zero_variance_fraction >= self.threshold:
                self._streaks[name] = self._streaks.get(name, 0) + 1
            else:
                self._streaks[name] = 0
        collapsed = frozenset(n for n, s in self._streaks.items() if s >= self.patience)
        transition = CollapseTransition(collapsed, collapsed - self._collapsed, self._collapsed - collapsed)
        self._collapsed = collapsed
        return transition
