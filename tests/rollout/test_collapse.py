import math

import pytest

from mtrl_rollout.collapse import (
    AGGREGATE,
    CollapseDetector,
    ComponentStats,
    collapse_stats,
    component_stats,
)
from mtrl_rollout.protocol import MetricEntry, RolloutResult, StopReason


def _result(group: str, sample: str, solved: float, speed: float) -> RolloutResult:
    return RolloutResult(
        run_id="r",
        step=0,
        group_id=group,
        sample_id=sample,
        policy_version=0,
        aggregate_reward_score=solved + speed,
        metrics_list=[
            MetricEntry(name="solved", value=solved, type="Reward"),
            MetricEntry(name="speed", value=speed, type="Reward"),
            MetricEntry(name="turns", value=3, type="Metric"),
        ],
        stop_reason=StopReason.DONE,
    )


def test_zero_variance_groups_are_counted_per_component() -> None:
    results = [
        _result("a", "a0", 1, 0.5),
        _result("a", "a1", 1, 0.2),  # solved flat in a, speed varies
        _result("b", "b0", 0, 0.0),
        _result("b", "b1", 0, 0.0),  # everything flat in b
        _result("c", "c0", 1, 0.0),  # a lone sample says nothing about variance
    ]
    stats = collapse_stats(results)
    assert set(stats) == {"solved", "speed", AGGREGATE}  # Metric entries are not rewards
    assert stats["solved"].groups == 2 and stats["solved"].zero_variance_fraction == 1.0
    assert stats["speed"].zero_variance_fraction == 0.5
    assert stats[AGGREGATE].zero_variance_fraction == 0.5
    assert stats["solved"].mean == pytest.approx(0.6)
    assert stats["solved"].std == pytest.approx(math.sqrt(0.24))


def test_component_stats_tolerates_float_noise() -> None:
    stats = component_stats({"g": [{"x": 0.1 + 0.2}, {"x": 0.3}]})
    assert stats["x"].zero_variance_groups == 1


def _stats(fraction: float) -> dict[str, ComponentStats]:
    return {"solved": ComponentStats(10, round(fraction * 10), 0.0, 0.0, 20)}


def test_detector_fires_once_after_patience_and_recovers() -> None:
    detector = CollapseDetector(threshold=0.8, patience=3)
    seen = [detector.observe(_stats(f)) for f in (0.9, 0.9, 0.5, 0.9, 0.9, 1.0, 1.0, 0.1)]
    assert [sorted(t.started) for t in seen] == [[], [], [], [], [], ["solved"], [], []]
    assert [sorted(t.collapsed) for t in seen][5:7] == [["solved"], ["solved"]]
    assert sorted(seen[7].ended) == ["solved"] and not seen[7].collapsed
