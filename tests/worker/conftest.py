"""A fake trainer and real worker processes against the session's moto server.

The fake trainer is the real GenerationServer (in its own thread and event loop) with a scripted
sampler: for a Wordle sample whose secret is GUESSES[k], it answers GUESSES[turn], so the episode
is won at turn k. Workers are `python -m mtrl_worker` subprocesses configured by MTRL_* only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import pytest

from mtrl_rollout.generation import GenerationServer
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import GenerateRequest, GenerateResponse, RolloutRequest
from mtrl_rollout.queues import RunQueues, create_run_queues, resource_tags
from mtrl_rollout.sqs import Sqs
from mtrl_testbed.ports import free_port, wait_until

from .fakes import scripted_response

GUESSES = ["slate", "crane", "pious", "brick", "mound", "fight"]
ARTIFACTS = Path(os.environ.get("MTRL_TEST_ARTIFACTS", Path(__file__).parents[2] / "out" / "test"))


@dataclass
class Sampler:
    """Scripted policy; `delay_s` holds every answer back, to keep episodes mid-flight."""

    delay_s: float = 0.0
    long_reply_for: set[str] = field(default_factory=set)
    seen_samples: set[str] = field(default_factory=set)
    requests: int = 0

    async def __call__(self, request: GenerateRequest) -> GenerateResponse:
        self.requests += 1
        self.seen_samples.add(request.sample_id)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        text = f"<guess>{GUESSES[request.turn % len(GUESSES)]}</guess>"
        if request.sample_id in self.long_reply_for:  # a completion too large for one SQS message
            text = "hmm " * 3000 + text
        return scripted_response(request, text)


class FakeTrainer(threading.Thread):
    def __init__(self, queues: RunQueues, bucket: str, sampler: Sampler) -> None:
        super().__init__(daemon=True)
        self.queues = queues
        self.bucket = bucket
        self.sampler = sampler
        self._loop: asyncio.AbstractEventLoop | None = None
        self._halt: asyncio.Event | None = None
        self._started = threading.Event()

    def run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop, self._halt = asyncio.get_running_loop(), asyncio.Event()
        sqs = Sqs(pool_size=16)
        codec = Codec(boto3.client("s3"), self.bucket)
        server = GenerationServer(
            sqs,
            self.queues.generate_url,
            self.queues.dlq_url,
            self.sampler,
            codec=codec,
            receivers=3,
        )
        self._started.set()
        await server.serve(self._halt)
        sqs.close()

    def start_serving(self) -> FakeTrainer:
        self.start()
        self._started.wait(10)
        return self

    def stop(self) -> None:
        assert self._loop is not None and self._halt is not None
        self._loop.call_soon_threadsafe(self._halt.set)
        self.join(15)


@dataclass
class WorkerProcess:
    worker_id: str
    health_port: int
    log_path: Path
    proc: subprocess.Popen[bytes]

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"worker exited {self.proc.returncode}: {self.log()[-2000:]}")
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        with urllib.request.urlopen(url, timeout=1) as resp:
            return resp.status == 200

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@dataclass
class Run:
    """One run's queues, bucket and fake trainer, plus a factory for its workers."""

    run_id: str
    prefix: str
    queues: RunQueues
    bucket: str
    sampler: Sampler
    aws_env: dict[str, str]
    workers: list[WorkerProcess] = field(default_factory=list)

    def start_worker(self, **overrides: str) -> WorkerProcess:
        worker_id = overrides.pop("MTRL_WORKER_ID", f"w{len(self.workers)}")
        port = free_port()
        env = {
            "MTRL_RUN_ID": self.run_id,
            "MTRL_RUN_NAME": "wordle-test",
            "MTRL_NAMESPACE": "default",
            "MTRL_ROLLOUT_QUEUE_URL": self.queues.rollout_url,
            "MTRL_RESULT_QUEUE_URL": self.queues.result_url,
            "MTRL_GENERATE_QUEUE_URL": self.queues.generate_url,
            "MTRL_DLQ_URL": self.queues.dlq_url,
            "MTRL_PAYLOAD_BUCKET": self.bucket,
            "MTRL_ENVIRONMENT": "wordle",
            "MTRL_QUEUE_PREFIX": self.prefix,
            "MTRL_WORKER_ID": worker_id,
            "MTRL_HEALTH_PORT": str(port),
            "MTRL_POLL_WAIT_S": "1",
            "MTRL_EPISODE_TIMEOUT_S": "60",
            **overrides,
        }
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        log_path = ARTIFACTS / f"{self.prefix}-{worker_id}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "mtrl_worker"],
                env=os.environ | self.aws_env | env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        worker = WorkerProcess(worker_id, port, log_path, proc)
        self.workers.append(worker)
        return worker

    def request(self, sample_id: str, secret: str, **fields: object) -> RolloutRequest:
        return RolloutRequest(
            run_id=self.run_id,
            step=0,
            group_id=f"g-{secret}",
            sample_id=sample_id,
            policy_version=0,
            data={"secret": secret},
            max_length=100_000,
            **fields,
        )


def wait_ready(*workers: WorkerProcess, timeout: float = 60) -> None:
    for worker in workers:
        wait_until(worker.ready, timeout, f"worker {worker.worker_id}")


@pytest.fixture
def run(aws_env: dict[str, str]) -> Iterator[Run]:
    prefix = f"w-{uuid.uuid4().hex[:10]}"
    run_id = f"uid-{prefix}"
    sqs = boto3.client("sqs")
    queues = create_run_queues(
        sqs,
        prefix,
        resource_tags(run_id, "default", "wordle-test", "test"),
        visibility_timeout_s=3,
        max_receive_count=5,
    )
    boto3.client("s3").create_bucket(
        Bucket=prefix, CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
    )
    sampler = Sampler()
    trainer = FakeTrainer(queues, prefix, sampler).start_serving()
    the_run = Run(run_id, prefix, queues, prefix, sampler, aws_env)
    yield the_run
    for worker in the_run.workers:
        if worker.proc.poll() is None:
            worker.kill()
    trainer.stop()
