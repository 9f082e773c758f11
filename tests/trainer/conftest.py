"""A training run against the session's moto server: the run's queues and output bucket,
`python -m mtrl_worker` processes playing the learnable `target` environment, and the trainer
itself as a `python -m mtrl_trainer` subprocess configured the way the operator configures it
(a run.json at $MTRL_CONFIG plus MTRL_* variables)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from mtrl_rollout.queues import RunQueues, create_run_queues, resource_tags
from mtrl_testbed.ports import free_port

if TYPE_CHECKING:
    from mtrl_trainer.checkpoint import CheckpointStore

ARTIFACTS = Path(os.environ.get("MTRL_TEST_ARTIFACTS", Path(__file__).parents[2] / "out" / "test"))
TARGET_CHAR = "a"


def target_token_id() -> int:
    from mtrl_trainer.tokenizer import CharChatTokenizer

    return CharChatTokenizer().encode(TARGET_CHAR)[0]


def run_spec(bucket: str, **grpo: Any) -> dict[str, Any]:
    """A tiny learnable run: the reward is the fraction of completion tokens equal to 'a'."""
    tasks = [{"target_token_id": str(target_token_id())} for _ in range(4)]
    return {
        "model": {"name": "random:tiny-qwen2", "dtype": "float32", "maxSequenceLength": 256,
                  "lora": {"rank": 8, "alpha": 16, "dropout": 0.0}},
        "grpo": {"groupSize": 8, "promptsPerStep": 4, "maxSteps": 12, "learningRate": 0.02,
                 "maxNewTokens": 12, "temperature": 1.0, "lossType": "dapo", "seed": 7, **grpo},
        "rollout": {"environment": "target", "maxTurns": 1, "episodeTimeoutSeconds": 60},
        "dataset": {"inline": {"train": tasks, "validation": tasks[:2]}, "evalIntervalSteps": 4},
        "output": {"s3Uri": f"s3://{bucket}/run", "checkpointIntervalSteps": 2,
                   "keepCheckpoints": 2},
    }


def on_engine(spec: dict[str, Any], engine: str) -> dict[str, Any]:
    """`spec` trained by `engine`, in one CPU process (which the TRL engine requires)."""
    return spec | {"trainer": {"engine": engine, "gpusPerNode": 0}}


@dataclass
class TrainingRun:
    run_id: str
    prefix: str
    queues: RunQueues
    bucket: str
    aws_env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    namespace: str = "trainer-tests"
    name: str = "tiny"

    def output_uri(self, spec: dict[str, Any]) -> str:
        """The run's own folder under spec.output.s3Uri, as the trainer computes it."""
        return f"{spec['output']['s3Uri']}/{self.namespace}/{self.name}/{self.run_id}"

    def queue_env(self) -> dict[str, str]:
        return {
            "MTRL_RUN_ID": self.run_id,
            "MTRL_RUN_NAME": self.name,
            "MTRL_NAMESPACE": self.namespace,
            "MTRL_ROLLOUT_QUEUE_URL": self.queues.rollout_url,
            "MTRL_RESULT_QUEUE_URL": self.queues.result_url,
            "MTRL_GENERATE_QUEUE_URL": self.queues.generate_url,
            "MTRL_DLQ_URL": self.queues.dlq_url,
            "MTRL_PAYLOAD_BUCKET": self.bucket,
        }

    def _spawn(self, args: list[str], env: dict[str, str], log_name: str) -> subprocess.Popen[bytes]:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with open(ARTIFACTS / f"{self.prefix}-{log_name}.log", "ab") as log:
            proc = subprocess.Popen(args, env=os.environ | self.aws_env | self.queue_env() | env,
                                    stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(proc)
        return proc

    def log(self, log_name: str) -> str:
        return (ARTIFACTS / f"{self.prefix}-{log_name}.log").read_text(errors="replace")

    def start_worker(self, name: str = "w0",
                     environment_args: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self._spawn([sys.executable, "-m", "mtrl_worker"], {
            "MTRL_ENVIRONMENT": "target",
            "MTRL_ENVIRONMENT_ARGS": json.dumps(environment_args or {}),
            "MTRL_QUEUE_PREFIX": self.prefix,
            "MTRL_WORKER_ID": name,
            "MTRL_HEALTH_PORT": str(free_port()),
            "MTRL_POLL_WAIT_S": "1",
            "MTRL_EPISODE_TIMEOUT_S": "60",
        }, name)

    def start_trainer(self, spec: dict[str, Any], name: str = "trainer",
                      processes: int = 1) -> subprocess.Popen[bytes]:
        """`python -m mtrl_trainer`, or with `processes` > 1 under torchrun as the operator's
        Job runs it (`mtrl torchrun --standalone --nproc-per-node=N -m mtrl_trainer`, torchrun
        under mtrl_trainer.launch)."""
        config = ARTIFACTS / f"{self.prefix}-run.json"
        config.write_text(json.dumps(spec))
        command = [sys.executable, "-m", "mtrl_trainer"] if processes == 1 else [
            sys.executable, "-m", "mtrl_trainer.launch", "--standalone",
            f"--nproc-per-node={processes}", "-m", "mtrl_trainer"]
        return self._spawn(command, {
            "MTRL_CONFIG": str(config),
            "MTRL_PROGRESS_FILE": str(self.progress_path),
            "MTRL_TERMINATION_MESSAGE_PATH": str(self.termination_path),
            "MTRL_COLLECT_GRACE_S": "10",
            # Two cores shared with the worker and moto: one intra-op thread is fastest.
            "OMP_NUM_THREADS": "1",
        }, name)

    def wait_for_step(self, trainer: subprocess.Popen[bytes], name: str, step: int,
                      timeout_s: float) -> int:
        """Until `trainer` (still running) has reported `step`; the step it reported."""
        deadline = time.monotonic() + timeout_s
        while ((self.progress() or {}).get("step") or 0) < step:
            assert trainer.poll() is None, self.log(name)[-3000:]
            assert time.monotonic() < deadline, f"no step {step} in {timeout_s:.0f} s"
            time.sleep(0.05)
        return int(self.progress()["step"])

    def terminate_at(self, trainer: subprocess.Popen[bytes], name: str, step: int,
                     store: CheckpointStore, timeout_s: float) -> int:
        """SIGTERM to `trainer` once it has reported `step`: it exits 143 with one checkpoint,
        at that step or the one it was playing, and says so in its termination message. The
        checkpoint's step."""
        reported = self.wait_for_step(trainer, name, step, timeout_s)
        trainer.send_signal(signal.SIGTERM)
        assert trainer.wait(60) == 143, self.log(name)[-3000:]
        saved = store.committed_steps()
        assert len(saved) == 1 and saved[0] in (reported, reported + 1), (saved, reported)
        total = (self.progress() or {}).get("totalSteps")
        assert self.termination_message() == (f"terminated by SIGTERM at step {saved[0]}/{total}: "
                                              f"checkpoint saved at step {saved[0]}")
        return int(saved[0])

    @property
    def termination_path(self) -> Path:
        return ARTIFACTS / f"{self.prefix}-termination-log"

    def termination_message(self) -> str:
        return self.termination_path.read_text() if self.termination_path.exists() else ""

    @property
    def progress_path(self) -> Path:
        return ARTIFACTS / f"{self.prefix}-progress.json"

    def metrics(self, spec: dict[str, Any]) -> list[dict[str, Any]]:
        """The run's metrics.jsonl: one report per step."""
        bucket, _, prefix = self.output_uri(spec).removeprefix("s3://").partition("/")
        body = boto3.client("s3").get_object(Bucket=bucket, Key=f"{prefix}/metrics.jsonl")["Body"]
        return [json.loads(line) for line in body.read().decode().splitlines()]

    def progress(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.progress_path.read_text())
        except (OSError, json.JSONDecodeError):
            return None


@pytest.fixture
def training_runs(aws_env: dict[str, str]) -> Iterator[Callable[[], TrainingRun]]:
    """A factory of training runs, each with its own identity, queues and bucket."""
    made: list[TrainingRun] = []

    def make() -> TrainingRun:
        prefix = f"tr-{uuid.uuid4().hex[:10]}"
        run_id = f"uid-{prefix}"
        queues = create_run_queues(
            boto3.client("sqs"), prefix, resource_tags(run_id, "default", "trainer-test", "test"),
            visibility_timeout_s=30, max_receive_count=5,
        )
        boto3.client("s3").create_bucket(
            Bucket=prefix, CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
        )
        made.append(TrainingRun(run_id, prefix, queues, prefix, aws_env))
        return made[-1]

    yield make
    for run in made:
        for proc in run.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def training_run(training_runs: Callable[[], TrainingRun]) -> TrainingRun:
    return training_runs()
