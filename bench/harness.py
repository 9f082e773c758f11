"""One training run for a benchmark: the real trainer and one real worker over SQS and S3 (moto).

`python -m mtrl_trainer` runs with the spec at $MTRL_CONFIG, as the operator runs it, and one
`python -m mtrl_worker` plays the run's environment; the result is the run's metrics.jsonl (and,
asked for, other JSON-lines files of its output folder, such as eval.jsonl).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3

from mtrl_rollout.queues import create_run_queues, resource_tags


def train(spec: dict[str, Any], workdir: Path, label: str, *, timeout_s: float = 1800,
          environment_args: dict[str, Any] | None = None,
          worker_concurrency: int = 256) -> list[dict[str, Any]]:
    """Train `spec` (its output.s3Uri's bucket is made here) and return its metrics.jsonl."""
    return train_outputs(spec, workdir, label, timeout_s=timeout_s,
                         environment_args=environment_args,
                         worker_concurrency=worker_concurrency)["metrics.jsonl"]


def train_outputs(spec: dict[str, Any], workdir: Path, label: str, *, timeout_s: float = 1800,
                  environment_args: dict[str, Any] | None = None, worker_concurrency: int = 256,
                  files: tuple[str, ...] = ("metrics.jsonl",)) -> dict[str, list[dict[str, Any]]]:
    """Train `spec` and return the JSON-lines `files` of its output folder, by name."""
    prefix = f"{label}-{uuid.uuid4().hex[:8]}"
    run_id = f"uid-{prefix}"
    queues = create_run_queues(boto3.client("sqs"), prefix,
                               resource_tags(run_id, "default", "bench", "bench"))
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=prefix, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    spec = spec | {"output": spec["output"] | {"s3Uri": f"s3://{prefix}/run"}}
    config = workdir / f"{prefix}.json"
    config.write_text(json.dumps(spec))
    env = os.environ | {
        "MTRL_RUN_ID": run_id, "MTRL_RUN_NAME": "bench", "MTRL_NAMESPACE": "bench",
        "MTRL_ROLLOUT_QUEUE_URL": queues.rollout_url, "MTRL_RESULT_QUEUE_URL": queues.result_url,
        "MTRL_GENERATE_QUEUE_URL": queues.generate_url, "MTRL_DLQ_URL": queues.dlq_url,
        "MTRL_PAYLOAD_BUCKET": prefix, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    arguments = environment_args if environment_args is not None else \
        spec["rollout"].get("environmentArgs", {})
    with open(workdir / f"{prefix}-worker.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "mtrl_worker"], stdout=log,
                                  stderr=subprocess.STDOUT, env=env | {
            "MTRL_ENVIRONMENT": spec["rollout"]["environment"], "MTRL_QUEUE_PREFIX": prefix,
            "MTRL_WORKER_ID": "w0", "MTRL_ENVIRONMENT_ARGS": json.dumps(arguments),
            "MTRL_HEALTH_PORT": "0", "MTRL_POLL_WAIT_S": "1",
            "MTRL_CONCURRENCY": str(worker_concurrency)})
    trainer_log = workdir / f"{prefix}-trainer.log"
    try:
        with open(trainer_log, "wb") as log:
            code: int | None = subprocess.run(
                [sys.executable, "-m", "mtrl_trainer"], stdout=log, stderr=subprocess.STDOUT,
                timeout=timeout_s, env=env | {"MTRL_CONFIG": str(config),
                                              "MTRL_COLLECT_GRACE_S": "10"}).returncode
    except subprocess.TimeoutExpired:
        code = None  # subprocess.run has killed it
    finally:
        worker.terminate()
        worker.wait(30)
    # Every run's output files are kept beside its logs (what a failed run wrote so far too:
    # metrics.jsonl has every step reported), so nothing measured is lost to a later crash.
    kept: dict[str, Path] = {}
    for name in files:
        with contextlib.suppress(s3.exceptions.NoSuchKey):
            body = s3.get_object(Bucket=prefix, Key=f"run/bench/bench/{run_id}/{name}")["Body"]
            kept[name] = workdir / f"{prefix}-{name}"
            kept[name].write_bytes(body.read())
    if code != 0 or len(kept) < len(files):
        tail = trainer_log.read_text(errors="replace")[-2000:]
        what = (f"ran past {timeout_s:.0f} s" if code is None else f"exited {code}" if code
                else f"wrote no {', '.join(sorted(set(files) - set(kept)))}")
        raise SystemExit(f"the trainer of {label} {what}; its log: {trainer_log}; kept: "
                         f"{', '.join(map(str, kept.values())) or 'no output file'}\n{tail}")
    return {name: [json.loads(line) for line in path.read_text().splitlines()]
            for name, path in kept.items()}


class SqsProbe:
    """The AWS endpoint's own latency while something else runs: one SendMessage and one
    ReceiveMessage on a scratch queue every `period_s`, from a thread of this process. On
    loopback an idle moto answers in about 10 ms; a busy one queues every caller's requests
    (one Python process), and what it adds shows here as well as in the run's own turns."""

    def __init__(self, period_s: float = 0.25) -> None:
        self._period_s = period_s
        self._sqs = boto3.client("sqs")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe, name="sqs-probe", daemon=True)
        self.round_trips: list[float] = []  # seconds per SendMessage + ReceiveMessage

    def __enter__(self) -> SqsProbe:
        self._url = self._sqs.create_queue(QueueName=f"probe-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._sqs.delete_queue(QueueUrl=self._url)

    def _probe(self) -> None:
        while not self._stop.wait(self._period_s):
            started = time.perf_counter()
            self._sqs.send_message(QueueUrl=self._url, MessageBody="probe")
            for message in self._sqs.receive_message(QueueUrl=self._url).get("Messages", []):
                self._sqs.delete_message(QueueUrl=self._url, ReceiptHandle=message["ReceiptHandle"])
            self.round_trips.append(time.perf_counter() - started)

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.round_trips) * 1000 if self.round_trips else None
