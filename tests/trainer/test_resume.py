"""Kill-and-resume: a SIGKILLed trainer restarts from its latest S3 checkpoint and finishes with
every step updated exactly once."""

from __future__ import annotations

import io
import signal
import time

import boto3
import pytest

torch = pytest.importorskip("torch")

from mtrl_trainer.checkpoint import CheckpointStore  # noqa: E402

from .conftest import TrainingRun, on_engine, run_spec  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.aws]


ENGINES = pytest.mark.parametrize("engine", ["mtrl", "trl"])


@ENGINES
def test_sigkill_then_resume_continues_from_latest_checkpoint(training_run: TrainingRun,
                                                              engine: str) -> None:
    spec = on_engine(run_spec(training_run.bucket, maxSteps=6), engine)
    spec["output"] |= {"checkpointIntervalSteps": 1, "keepCheckpoints": 10}
    spec["dataset"]["evalIntervalSteps"] = 0
    store = CheckpointStore(training_run.output_uri(spec), keep=10, client=boto3.client("s3"))
    training_run.start_worker()
    first = training_run.start_trainer(spec, "trainer-1")
    deadline = time.monotonic() + 120
    while not any(s >= 3 for s in store.committed_steps()):
        assert first.poll() is None, training_run.log("trainer-1")[-3000:]
        assert time.monotonic() < deadline, "no checkpoint at step 3 in time"
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    resumed_from = store.committed_steps()[-1]
    assert 3 <= resumed_from < 6

    second = training_run.start_trainer(spec, "trainer-2")
    assert second.wait(180) == 0, training_run.log("trainer-2")[-3000:]
    assert f"resumed from checkpoint at step {resumed_from}" in training_run.log("trainer-2")

    final = torch.load(io.BytesIO(store._get(store._key("checkpoints/step-000006/trainer_state.pt"))),
                       weights_only=False)
    history = final["history"]
    assert [h["step"] for h in history] == [1, 2, 3, 4, 5, 6]  # none lost, none twice
    attempts = [h["attempt"] for h in history]
    assert len(set(attempts)) == 2
    assert attempts.index(attempts[-1]) == resumed_from  # the restart began after the checkpoint
    # Optimizer steps carried over: one per step that had a learning signal, in order.
    updates = [h["optimizerSteps"] for h in history]
    assert updates == [sum(h["updated"] for h in history[: i + 1]) for i in range(6)]
    assert training_run.progress()["step"] == 6


@ENGINES
def test_sigterm_saves_a_checkpoint_at_the_step_it_was_on_and_the_next_start_continues(
        training_run: TrainingRun, engine: str) -> None:
    """No checkpoint is due before the end (interval 100): the one SIGTERM makes is all a
    restart has. The step in progress when it came is the only work lost."""
    spec = on_engine(run_spec(training_run.bucket, maxSteps=8), engine)
    spec["output"] |= {"checkpointIntervalSteps": 100, "keepCheckpoints": 10}
    spec["dataset"]["evalIntervalSteps"] = 0
    store = CheckpointStore(training_run.output_uri(spec), keep=10, client=boto3.client("s3"))
    training_run.start_worker()
    first = training_run.start_trainer(spec, "trainer-1")
    saved = [training_run.terminate_at(first, "trainer-1", 3, store, timeout_s=120)]
    assert training_run.progress()["latestCheckpoint"].endswith(f"step-{saved[0]:06d}/")

    second = training_run.start_trainer(spec, "trainer-2")
    assert second.wait(180) == 0, training_run.log("trainer-2")[-3000:]
    assert f"resumed from checkpoint at step {saved[0]}" in training_run.log("trainer-2")
    final = torch.load(io.BytesIO(store._get(store._key("checkpoints/step-000008/trainer_state.pt"))),
                       weights_only=False)
    assert [h["step"] for h in final["history"]] == list(range(1, 9))  # none lost, none twice
