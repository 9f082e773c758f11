"""Configuration from the operator's mount and env vars; the progress file schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from mtrl_api.run import MultiTurnRLRunStatus
from mtrl_trainer.__main__ import main
from mtrl_trainer.config import ConfigError, TrainerConfig
from mtrl_trainer.progress import ComponentReport, FileSink, Progress, ProgressReport

from .conftest import run_spec

QUEUES = {f"MTRL_{n}": f"http://q/{n}" for n in
          ("ROLLOUT_QUEUE_URL", "RESULT_QUEUE_URL", "GENERATE_QUEUE_URL", "DLQ_URL")}


def test_reads_camelcase_spec_and_queue_urls(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_spec("bucket-a", epsilonHigh=0.3)))
    config = TrainerConfig.from_env({"MTRL_CONFIG": str(path), "MTRL_RUN_ID": "uid-1", **QUEUES})
    assert config.spec.grpo.epsilon_high == 0.3 and config.spec.grpo.group_size == 8
    assert config.generate_queue_url == "http://q/GENERATE_QUEUE_URL" and config.run_id == "uid-1"


def test_reports_every_problem_at_once(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"model": {"name": "x"}}))
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_env({"MTRL_CONFIG": str(path)})
    message = str(info.value)
    assert "rollout: Field required" in message and "MTRL_DLQ_URL is not set" in message


def test_main_exits_2_on_bad_config_and_leaves_the_cause_as_termination_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("MTRL_CONFIG", str(tmp_path / "missing.json"))
    monkeypatch.setenv("MTRL_TERMINATION_MESSAGE_PATH", str(termination))
    assert main([]) == 2
    message = termination.read_text()
    assert message.startswith("configuration error: invalid trainer configuration: MTRL_CONFIG: "
                              f"cannot read {tmp_path / 'missing.json'}")


def test_progress_file_schema(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    Progress([FileSink(path)]).report(ProgressReport(
        step=3, total_steps=10, reward_mean=0.5, reward_std=0.1, success_rate=0.25,
        zero_variance_fraction=0.5, validation_success_rate=None, tokens_per_second=100.0,
        components=[ComponentReport("target_fraction", 0.5, 0.1, 0.5)], policy_version=3,
        validation_pass_at_k={4: 0.75, 1: 0.25}, training={"isWeightMean": 0.98},
    ))
    body = json.loads(path.read_text())
    assert set(body) == {"step", "totalSteps", "rewardMean", "rewardStd", "successRate",
                         "zeroVarianceFraction", "validationSuccessRate", "validationPassAtK",
                         "tokensPerSecond", "components", "policyVersion", "updatedAt",
                         "isWeightMean", "failedEpisodeFraction", "episodeError",
                         "trainedSteps", "validationGreedySuccessRate"}
    assert body["validationPassAtK"] == [{"k": 1, "value": 0.25}, {"k": 4, "value": 0.75}]
    # What the operator copies into status.progress
    status = MultiTurnRLRunStatus.model_validate({"progress": body}).progress
    assert [(p.k, p.value) for p in status.validation_pass_at_k] == [(1, 0.25), (4, 0.75)]
    assert body["components"] == [{"name": "target_fraction", "mean": 0.5, "std": 0.1,
                                   "zeroVarianceFraction": 0.5}]
    assert body["updatedAt"].endswith("Z")


def test_reads_the_operators_attempt_number(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_spec("bucket-a")))
    base = {"MTRL_CONFIG": str(path), **QUEUES}
    assert TrainerConfig.from_env({**base, "MTRL_ATTEMPT": "3"}).operator_attempt == 3
    assert TrainerConfig.from_env(base).operator_attempt is None
    with pytest.raises(ConfigError, match="MTRL_ATTEMPT"):
        TrainerConfig.from_env({**base, "MTRL_ATTEMPT": "three"})


def test_a_committed_checkpoint_is_named_in_this_and_every_later_report(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    progress = Progress([FileSink(path)])

    def report(step: int) -> None:
        progress.report(ProgressReport(
            step=step, total_steps=10, reward_mean=0.5, reward_std=0.1, success_rate=None,
            zero_variance_fraction=None, validation_success_rate=None, tokens_per_second=None,
            components=[], policy_version=step))

    report(1)
    assert "latestCheckpoint" not in json.loads(path.read_text())
    report(2)
    progress.checkpointed("s3://b/out/checkpoints/step-000002/")
    body = json.loads(path.read_text())
    assert (body["step"], body["latestCheckpoint"]) == (2, "s3://b/out/checkpoints/step-000002/")
    report(3)
    assert json.loads(path.read_text())["latestCheckpoint"].endswith("step-000002/")


def test_progress_carries_the_launch_the_attempt_and_the_final_outcome(tmp_path: Path) -> None:
    """The operator reads them from the progress ConfigMap, also when the workload is gone;
    the launch says which workload wrote the report, the outcome with every step and the
    trained steps is its evidence of success."""
    path = tmp_path / "progress.json"
    progress = Progress([FileSink(path)], attempt=2, launch=5)
    progress.report(ProgressReport(
        step=10, total_steps=10, reward_mean=0.5, reward_std=0.1, success_rate=None,
        zero_variance_fraction=None, validation_success_rate=None, tokens_per_second=None,
        components=[], policy_version=10, trained_steps=9))
    body = json.loads(path.read_text())
    assert (body["attempt"], body["launch"], body["trainedSteps"]) == (2, 5, 9)
    assert "outcome" not in body
    progress.succeeded(10, 10, 9)
    final = json.loads(path.read_text())
    assert final["outcome"] == "Succeeded" and final["attempt"] == 2 and final["launch"] == 5
    assert final["step"] == 10 and final["rewardMean"] == 0.5 and final["trainedSteps"] == 9
    # A resumed trainer that finds the run already done reports its outcome at once, with
    # the steps its checkpoint says trained.
    resumed = tmp_path / "resumed.json"
    Progress([FileSink(resumed)], attempt=3, launch=6).succeeded(10, 10, 9)
    assert json.loads(resumed.read_text()) | {"updatedAt": ""} == {
        "step": 10, "totalSteps": 10, "trainedSteps": 9, "components": [], "policyVersion": 10,
        "outcome": "Succeeded", "attempt": 3, "launch": 6, "updatedAt": ""}


def test_the_schema_offers_exactly_the_random_presets_the_trainer_builds() -> None:
    from mtrl_api.run import RANDOM_MODEL_PRESETS
    from mtrl_trainer.models import RANDOM_PRESETS

    assert sorted(RANDOM_MODEL_PRESETS) == sorted(RANDOM_PRESETS)
