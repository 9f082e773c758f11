"""Episodes that keep failing end the run in the environment's own words: the trainer stops
after spec.rollout.maxFailingSteps failing steps in a row, or at the end when it trained
nothing, instead of reporting success for work it did not do."""

from __future__ import annotations

import pytest

from .conftest import TrainingRun, run_spec

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.aws]

ERROR = "ValueError: a target task sets exactly one of target_token_id and target"


def _failing(training_run: TrainingRun, **rollout: int) -> dict:
    spec = run_spec(training_run.bucket, maxSteps=6)
    # Tasks the environment refuses (the operator would refuse them first; the trainer alone
    # plays them): every episode raises in the worker.
    spec["dataset"] = {"inline": {"train": [{"goal": "16"}]}, "evalIntervalSteps": 0}
    spec["rollout"] |= rollout
    return spec


def test_failing_steps_in_a_row_stop_the_trainer_with_the_environments_error(
        training_run: TrainingRun) -> None:
    spec = _failing(training_run, maxFailingSteps=2)
    training_run.start_worker()
    trainer = training_run.start_trainer(spec)
    assert trainer.wait(180) == 1, training_run.log("trainer")[-3000:]
    assert training_run.termination_message() == (
        "episodes failed: 2 steps in a row lost more than spec.rollout.maxFailedEpisodeFraction "
        f"0.5 of their episodes; step 2: 32 of 32 episodes failed: {ERROR}")
    progress = training_run.progress()
    assert progress["step"] == 2 and "outcome" not in progress
    assert progress["failedEpisodeFraction"] == 1.0 and progress["episodeError"] == ERROR


def test_a_run_that_trained_nothing_because_its_episodes_failed_is_no_success(
        training_run: TrainingRun) -> None:
    spec = _failing(training_run, maxFailingSteps=10)
    spec["grpo"]["maxSteps"] = 2
    training_run.start_worker()
    trainer = training_run.start_trainer(spec)
    assert trainer.wait(180) == 1, training_run.log("trainer")[-3000:]
    assert training_run.termination_message() == (
        f"episodes failed: the run trained nothing in 2 steps: step 2: 32 of 32 episodes "
        f"failed: {ERROR}")
    assert "outcome" not in training_run.progress()
