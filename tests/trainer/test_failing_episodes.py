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


def test_results_that_never_come_are_failed_episodes(training_run: TrainingRun) -> None:
    """No worker answers (crashed, or its results cannot be written or read back: a role
    without s3:PutObject for large payloads): every result is late. Late results used to
    count for nothing, so such a run trained nothing step after step and ended Succeeded."""
    spec = run_spec(training_run.bucket, maxSteps=6)
    spec["rollout"] |= {"episodeTimeoutSeconds": 5, "maxFailingSteps": 2}
    spec["dataset"]["evalIntervalSteps"] = 0
    trainer = training_run.start_trainer(spec)  # and no worker
    assert trainer.wait(240) == 1, training_run.log("trainer")[-3000:]
    message = training_run.termination_message()
    assert message.startswith("episodes failed: 2 steps in a row lost more than "
                              "spec.rollout.maxFailedEpisodeFraction 0.5 of their episodes; "
                              "step 2: 32 of 32 episodes failed: no result came back"), message
    assert training_run.progress()["failedEpisodeFraction"] == 1.0


def test_a_run_whose_every_group_scored_alike_ends_with_nothing_trained(
        training_run: TrainingRun) -> None:
    """A target token the model never samples: every reward is 0, every group's advantages
    are zero, no step updates the adapter. It used to report Succeeded."""
    spec = run_spec(training_run.bucket, maxSteps=2)
    tasks = [{"target_token_id": "999999"}] * 4
    spec["dataset"] = {"inline": {"train": tasks}, "evalIntervalSteps": 0}
    training_run.start_worker()
    trainer = training_run.start_trainer(spec)
    assert trainer.wait(180) == 1, training_run.log("trainer")[-3000:]
    assert training_run.termination_message() == (
        "nothing trained: the run played 2 steps and made no optimizer update: every group's "
        "rewards were equal, so every advantage was zero; see status.progress.zeroVarianceFraction")
    progress = training_run.progress()
    assert "outcome" not in progress and progress["trainedSteps"] == 0
