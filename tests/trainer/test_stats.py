"""pass@k at evaluation (the unbiased estimator, per task and over the validation set), and
the workers' wait per turn."""

from __future__ import annotations

import itertools

import pytest

from mtrl_rollout.protocol import MetricEntry, RolloutResult
from mtrl_trainer.stats import pass_at_k, turn_seconds, validation_pass_at_k


@pytest.mark.parametrize(("n", "c"), [(1, 0), (1, 1), (4, 1), (8, 3), (8, 8), (10, 0)])
def test_pass_at_k_is_the_share_of_k_subsets_with_a_success(n: int, c: int) -> None:
    plays = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(plays, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets))


def test_pass_at_k_by_hand() -> None:
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError, match="pass@5"):
        pass_at_k(4, 1, 5)


def play(task: int, index: int, solved: bool) -> RolloutResult:
    return RolloutResult(run_id="r", step=0, group_id=f"a-v0-g{task}", sample_id=f"a-v0-g{task}-{index}",
                         policy_version=0, aggregate_reward_score=float(solved), stop_reason="done",
                         metrics_list=[MetricEntry(name="solved", value=float(solved), type="Metric")])


def test_validation_pass_at_k_averages_tasks_and_skips_a_k_some_task_lacks_plays_for() -> None:
    # Task 0 solved in 1 of 4 plays, task 1 in 4 of 4, task 2 in none of 3 (one play failed).
    results = [play(0, i, i == 0) for i in range(4)] + [play(1, i, True) for i in range(4)] \
        + [play(2, i, False) for i in range(3)]
    got = validation_pass_at_k(results, [4, 1, 2])
    assert got == {1: pytest.approx((0.25 + 1 + 0) / 3), 2: pytest.approx((0.5 + 1 + 0) / 3)}
    assert validation_pass_at_k([], [1]) == {}


def waited(seconds: float | None, turns: int) -> RolloutResult:
    metrics = [MetricEntry(name="model_turns", value=turns, type="Metric")]
    if seconds is not None:  # a worker from before the metric reports none
        metrics.append(MetricEntry(name="generate_seconds", value=seconds, type="Metric"))
    return RolloutResult(run_id="r", step=0, group_id="g", sample_id=f"s{seconds}-{turns}",
                         policy_version=0, aggregate_reward_score=0.0, stop_reason="done",
                         metrics_list=metrics)


def test_turn_seconds_weighs_each_turn_once() -> None:
    # 4 turns in 2.0 s and 1 turn in 1.0 s: 3.0 s over 5 turns, not the mean of 0.5 and 1.0.
    assert turn_seconds([waited(2.0, 4), waited(1.0, 1), waited(None, 3), waited(0.0, 0)]) == 0.6
    assert turn_seconds([waited(None, 2), waited(0.0, 0)]) is None
