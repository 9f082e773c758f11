"""The trainer's variables: shared with the workers, aliases, empty values, named problems."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from mtrl_trainer.config import ConfigError, TrainerConfig
from mtrl_worker.config import WorkerConfig

from .conftest import run_spec

SHARED = {"MTRL_RUN_ID": "uid-1", "MTRL_PAYLOAD_BUCKET": "payloads",
          **{f"MTRL_{n}": f"http://q/{n}" for n in
             ("ROLLOUT_QUEUE_URL", "RESULT_QUEUE_URL", "GENERATE_QUEUE_URL", "DLQ_URL")}}


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_spec("bucket-a")))
    return path


def test_one_env_block_serves_the_trainer_and_the_workers(spec_path: Path) -> None:
    env = {**SHARED, "MTRL_CONFIG": str(spec_path), "MTRL_ENVIRONMENT": "target"}
    trainer, worker = TrainerConfig.from_env(env), WorkerConfig.from_env(env)
    for name in ("run_id", "rollout_queue_url", "result_queue_url", "generate_queue_url",
                 "dlq_url", "payload_bucket"):
        assert getattr(trainer, name) == getattr(worker, name), name


def test_defaults_aliases_and_empty_variables(spec_path: Path) -> None:
    base = {**SHARED, "MTRL_CONFIG": str(spec_path)}
    config = TrainerConfig.from_env({**base, "MTRL_RUN_ID": "", "MTRL_NAMESPACE": "team-a",
                                     "MTRL_PROGRESS_CONFIGMAP": "tiny-progress",
                                     "MTRL_PROGRESS_FILE": "/tmp/p.json", "MTRL_DEVICE": ""})
    assert (config.run_id, config.run_name, config.namespace) == ("local", "local", "team-a")
    assert config.progress_config_map == "tiny-progress" and config.device is None
    assert config.progress_file == Path("/tmp/p.json") and config.collect_grace_s == 30.0
    both = {**base, "MTRL_POD_NAMESPACE": "pod-ns", "MTRL_NAMESPACE": "team-a"}
    assert TrainerConfig.from_env(both).namespace == "pod-ns"
    assert TrainerConfig.from_env(base).attempt != TrainerConfig.from_env(base).attempt


def test_bad_values_name_their_variables_after_the_specs_problems(tmp_path: Path) -> None:
    env = {**SHARED, "MTRL_DLQ_URL": "", "MTRL_COLLECT_GRACE_S": "soon",
           "MTRL_CONFIG": str(tmp_path / "missing.json")}
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_env(env)
    problems = str(info.value).removeprefix("invalid trainer configuration: ").split("; ")
    assert problems[0].startswith(f"MTRL_CONFIG: cannot read {tmp_path / 'missing.json'}")
    assert problems[1:] == ["MTRL_DLQ_URL is not set", "MTRL_COLLECT_GRACE_S: Input should be a "
                            "valid number, unable to parse string as a number"]
