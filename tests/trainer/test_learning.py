"""It learns: a tiny random policy trained through the real protocol against a real worker
raises its mean reward on the learnable `target` environment."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from .conftest import TrainingRun, run_spec

pytestmark = [pytest.mark.slow, pytest.mark.aws]


def test_reward_rises_through_real_worker(training_run: TrainingRun) -> None:
    training_run.start_worker()
    trainer = training_run.start_trainer(run_spec(training_run.bucket, maxSteps=10))
    rewards: dict[int, float] = {}
    deadline = time.monotonic() + 240
    while trainer.poll() is None and time.monotonic() < deadline:
        progress = training_run.progress()
        if progress and progress["rewardMean"] is not None:
            rewards[progress["step"]] = progress["rewardMean"]
        time.sleep(0.2)
    assert trainer.wait(5) == 0, training_run.log("trainer")[-3000:]
    progress = training_run.progress()
    assert progress is not None and progress["step"] == 10
    rewards[10] = progress["rewardMean"]
    first = sum(rewards[s] for s in (1, 2) if s in rewards) / len([s for s in (1, 2) if s in rewards])
    last = sum(rewards[s] for s in (9, 10) if s in rewards) / len(
        [s for s in (9, 10) if s in rewards])
    print(f"reward by step: {rewards}")
    # Chance level is ~1/102; the trained policy emits the target for a clear share of tokens.
    assert last > first + 0.3, rewards
