"""Composite rewards: named components, weighted, summed, mapped into the run's reward range.

Each component declares its bounds, so the weighted sum has a known range, which is mapped
affinely (never clipped) onto `rewards.range` of the request. Affine maps keep every ordering
an environment guarantees under its default weights. Penalties are components with values <= 0
and positive weights. Weights come from the run spec (MTRL_REWARD_WEIGHTS) and default per
environment; overriding them is the user's call, and may void an environment's ordering promise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from mtrl_rollout.protocol import MetricEntry

Kind = Literal["outcome", "behaviour", "penalty"]


@dataclass(frozen=True)
class RewardComponent:
    name: str
    weight: float
    low: float
    high: float
    kind: Kind
    doc: str


@dataclass
class Score:
    """What an environment reports: one value per declared component, plus free metrics."""

    components: dict[str, float]
    metrics: dict[str, float] = field(default_factory=dict)
    # One reward per model turn, in turn order, when the environment judges turns on their
    # own; they travel on the trajectory's turn records.
    turn_rewards: list[float] | None = None


def resolve_weights(
    components: Sequence[RewardComponent], overrides: Mapping[str, float]
) -> dict[str, float]:
    known = {c.name for c in components}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown reward components {unknown}; known: {sorted(known)}")
    return {c.name: float(overrides.get(c.name, c.weight)) for c in components}


def compose(
    score: Score,
    components: Sequence[RewardComponent],
    weights: Mapping[str, float],
    reward_range: tuple[float, float],
) -> tuple[float, list[MetricEntry]]:
    """The aggregate reward in `reward_range` and the metrics_list entries for `score`."""
    declared = {c.name for c in components}
    if set(score.components) != declared:
        raise ValueError(f"score has components {sorted(score.components)}, declared {declared}")
    total = lo = hi = 0.0
    for c in components:
        value = score.components[c.name]
        if not c.low <= value <= c.high:
            raise ValueError(f"component {c.name}={value} outside [{c.low}, {c.high}]")
        w = weights[c.name]
        total += w * value
        lo += min(w * c.low, w * c.high)
        hi += max(w * c.low, w * c.high)
    r_min, r_max = reward_range
    aggregate = r_min if hi == lo else r_min + (total - lo) / (hi - lo) * (r_max - r_min)
    entries = [MetricEntry(name=c.name, value=score.components[c.name], type="Reward") for c in components]
    entries += [
        MetricEntry(name=name, value=float(value), type="Metric") for name, value in score.metrics.items()
    ]
    return aggregate, entries
