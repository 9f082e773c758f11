"""`mtrl trainer-check -- COMMAND...`: does a trainer command keep the trainer contract
(docs/trainer-contract.md)? It runs the command as the operator's pod would (the same
environment variables, the run's spec in a file, its queues and output folder in AWS, here
moto unless $AWS_ENDPOINT_URL is set) against a real reward worker playing the learnable
`target` task, and reports each part of the contract it meets:

  trains       a valid run exits 0
  progress     every step is reported, the last one marked Succeeded
  episodes     each step's reward came back from episodes the worker played
  metrics      metrics.jsonl in the run's output folder, one line per step
  checkpoints  the last step's checkpoint is committed in the output folder
  config-error an invalid spec exits 2, its termination message beginning 'configuration error:'
  sigterm      SIGTERM (to the command's process, as the kubelet sends it) exits 143 within the
               grace period, with a checkpoint committed and the termination message saying so
  resume       the next start continues from that checkpoint, not from step 1

Exit 0 when every part passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GRACE_S = 30  # the pod's terminationGracePeriodSeconds here (the spec's least)
RUN_TIMEOUT_S = 300
TERMINATED_PREFIX = "terminated by SIGTERM"
CONFIG_ERROR_PREFIX = "configuration error:"


def run_spec(bucket: str, engine: str, steps: int, checkpoint_every: int) -> dict[str, Any]:
    """A tiny learnable run: a random model's share of 'a' tokens in its completions."""
    from mtrl_trainer.tokenizer import CharChatTokenizer

    target = str(CharChatTokenizer().encode("a")[0])
    return {
        "model": {"name": "random:tiny-qwen2", "dtype": "float32", "maxSequenceLength": 128,
                  "lora": {"rank": 8, "alpha": 16, "dropout": 0.0}},
        "trainer": {"engine": engine, "gpusPerNode": 0, "efaPerNode": 0,
                    "terminationGracePeriodSeconds": GRACE_S},
        # Enough completion tokens a step (8 x 2 x 12) that the random policy samples a
        # few targets, so some group's rewards differ and the step trains: a run that trains
        # nothing is no success (it stops with `nothing trained:`).
        "grpo": {"groupSize": 8, "promptsPerStep": 2, "maxSteps": steps, "learningRate": 0.02,
                 "maxNewTokens": 12, "seed": 7},
        "rollout": {"environment": "target", "maxTurns": 1, "episodeTimeoutSeconds": 60},
        "dataset": {"inline": {"train": [{"target_token_id": target}] * 2},
                    "evalIntervalSteps": 0},
        "output": {"s3Uri": f"s3://{bucket}/runs", "checkpointIntervalSteps": checkpoint_every,
                   "keepCheckpoints": 10},
    }


@dataclass
class Part:
    name: str
    passed: bool
    detail: str


@dataclass
class Bed:
    """One run's AWS side (queues, bucket) and the worker playing it."""

    command: list[str]
    engine: str
    root: Path
    prefix: str = field(default_factory=lambda: f"chk-{uuid.uuid4().hex[:8]}")
    worker: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        import boto3

        from mtrl_rollout.queues import create_run_queues, resource_tags

        self.uid = f"uid-{self.prefix}"
        self.queues = create_run_queues(boto3.client("sqs"), self.prefix,
                                        resource_tags(self.uid, "check", "check", "check"),
                                        visibility_timeout_s=30)
        self.s3 = boto3.client("s3")
        self.s3.create_bucket(Bucket=self.prefix, CreateBucketConfiguration={
            "LocationConstraint": self.s3.meta.region_name})

    def env(self, name: str) -> dict[str, str]:
        """The operator's variables for the run; each part of the check is a run of its own
        name (its own output folder), all of one UID, which the worker serves."""
        return {
            "MTRL_RUN_ID": self.uid, "MTRL_RUN_NAME": name, "MTRL_NAMESPACE": "check",
            "MTRL_ROLLOUT_QUEUE_URL": self.queues.rollout_url,
            "MTRL_RESULT_QUEUE_URL": self.queues.result_url,
            "MTRL_GENERATE_QUEUE_URL": self.queues.generate_url,
            "MTRL_DLQ_URL": self.queues.dlq_url, "MTRL_PAYLOAD_BUCKET": self.prefix,
            "MTRL_QUEUE_PREFIX": self.prefix, "MTRL_ATTEMPT": "1",
            "MTRL_LAUNCH": str(LAUNCH),
            "AWS_REGION": self.s3.meta.region_name,
        }

    def start_worker(self) -> None:
        from mtrl_testbed.ports import free_port

        with open(self.root / "worker.log", "ab") as log:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "mtrl_worker"], stdout=log, stderr=subprocess.STDOUT,
                env=os.environ | self.env("worker") | {
                    "MTRL_ENVIRONMENT": "target", "MTRL_WORKER_ID": "w0",
                    "MTRL_HEALTH_PORT": str(free_port()), "MTRL_POLL_WAIT_S": "1"})

    def start(self, label: str, name: str, spec: dict[str, Any]) -> Trainer:
        config = self.root / f"{label}.json"
        config.write_text(json.dumps(spec))
        files = Trainer(label, self.root)
        with open(files.log, "ab") as log:
            files.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=os.environ | self.env(name) | {
                    "MTRL_CONFIG": str(config), "MTRL_PROGRESS_FILE": str(files.progress),
                    "MTRL_TERMINATION_MESSAGE_PATH": str(files.termination),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        return files

    def output(self, name: str) -> str:
        return f"runs/check/{name}/{self.uid}"

    def object(self, key: str) -> bytes | None:
        try:
            return bytes(self.s3.get_object(Bucket=self.prefix, Key=key)["Body"].read())
        except self.s3.exceptions.NoSuchKey:
            return None

    def committed(self, name: str) -> list[int]:
        keys = self.s3.list_objects_v2(Bucket=self.prefix,
                                       Prefix=f"{self.output(name)}/checkpoints/")
        return sorted(int(k["Key"].split("step-")[1].split("/")[0])
                      for k in keys.get("Contents", []) if k["Key"].endswith("/COMPLETE"))

    def close(self) -> None:
        if self.worker is not None:
            self.worker.terminate()
            self.worker.wait(30)


@dataclass
class Trainer:
    label: str
    root: Path
    proc: subprocess.Popen[bytes] | None = None
    steps_seen: list[int] = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.root / f"{self.label}.log"

    @property
    def progress(self) -> Path:
        return self.root / f"{self.label}-progress.json"

    @property
    def termination(self) -> Path:
        return self.root / f"{self.label}-termination"

    def report(self) -> dict[str, Any]:
        with contextlib.suppress(OSError, json.JSONDecodeError):
            return dict(json.loads(self.progress.read_text()))
        return {}

    def wait(self, timeout: float, until: Callable[[dict[str, Any]], bool] | None = None
             ) -> int | None:
        """Its exit code (None if it still runs at `timeout`, or once `until` holds of its
        progress); records every step it reported meanwhile."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            step = self.report().get("step")
            if isinstance(step, int) and step not in self.steps_seen:
                self.steps_seen.append(step)
            if until is not None and until(self.report()):
                return None
            if (code := self.proc.poll()) is not None:
                return code
            time.sleep(0.1)
        return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def said(self) -> str:
        return self.termination.read_text().strip() if self.termination.exists() else ""

    def tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.strip().splitlines()[-1][:300] if text.strip() else "(no output)"


LAUNCH = 7  # MTRL_LAUNCH: a number no default would give, which the reports must echo


def check(command: list[str], engine: str, root: Path, steps: int = 3) -> list[Part]:
    bed = Bed(command, engine, root)
    parts: list[Part] = []
    try:
        bed.start_worker()
        parts += _valid_run(bed, steps)
        parts.append(_config_error(bed))
        parts += _sigterm_then_resume(bed)
    finally:
        bed.close()
    return parts


def _valid_run(bed: Bed, steps: int) -> list[Part]:
    trainer = bed.start(f"valid-{bed.engine}", "valid", run_spec(bed.prefix, bed.engine, steps, 1))
    code = trainer.wait(RUN_TIMEOUT_S)
    trainer.kill()
    last = trainer.report()
    body = bed.object(f"{bed.output('valid')}/metrics.jsonl") or b""
    lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
    rewards = [m.get("rewardMean") for m in lines]
    committed = bed.committed("valid")
    return [
        Part("trains", code == 0, f"exit code {code}" + ("" if code == 0 else
                                                          f": {trainer.tail()}")),
        Part("progress", last.get("step") == steps and last.get("totalSteps") == steps
             and last.get("outcome") == "Succeeded" and last.get("launch") == LAUNCH
             and isinstance(trained := last.get("trainedSteps"), int) and trained >= 1,
             f"last report: step {last.get('step')}/{last.get('totalSteps')}, outcome "
             f"{last.get('outcome')!r}, launch {last.get('launch')!r} (MTRL_LAUNCH {LAUNCH}), "
             f"trainedSteps {last.get('trainedSteps')!r}"),
        Part("episodes", len(rewards) == steps and all(isinstance(r, float) for r in rewards),
             f"rewardMean by step {rewards}"),
        Part("metrics", [m.get("step") for m in lines] == list(range(1, steps + 1)),
             f"metrics.jsonl steps {[m.get('step') for m in lines]}"),
        Part("checkpoints", steps in committed, f"committed checkpoints at steps {committed}"),
    ]


def _config_error(bed: Bed) -> Part:
    spec = run_spec(bed.prefix, bed.engine, 3, 1)
    spec["grpo"]["groupSize"] = 1  # GRPO needs a group to compare with
    trainer = bed.start(f"config-error-{bed.engine}", "config-error", spec)
    code = trainer.wait(RUN_TIMEOUT_S)
    trainer.kill()
    said = trainer.said()
    return Part("config-error", code == 2 and said.startswith(CONFIG_ERROR_PREFIX),
                f"exit code {code}, termination message {said[:200]!r}")


def _sigterm_then_resume(bed: Bed) -> list[Part]:
    name, steps = "sigterm", 6
    spec = run_spec(bed.prefix, bed.engine, steps, 100)  # only the one SIGTERM makes
    first = bed.start(f"sigterm-{bed.engine}", name, spec)
    code = first.wait(RUN_TIMEOUT_S, until=lambda r: (r.get("step") or 0) >= 2)
    if code is not None:
        return [Part("sigterm", False, f"exited {code} before step 2: {first.tail()}"),
                Part("resume", False, "not tried")]
    assert first.proc is not None
    first.proc.send_signal(signal.SIGTERM)  # to the command's process only, as the kubelet
    code = first.wait(GRACE_S)
    killed = code is None
    first.kill()
    committed = bed.committed(name)
    said = first.said()
    ended = (f"still running {GRACE_S}s after SIGTERM: killed" if killed else
             f"killed by signal {-code}" if code < 0 else f"exit code {code}")
    sigterm = Part("sigterm", code == 143 and bool(committed) and said.startswith(
        TERMINATED_PREFIX), f"{ended}, committed checkpoints {committed}, termination "
        f"message {said[:200]!r}")
    if not committed:
        return [sigterm, Part("resume", False, "no checkpoint to resume from")]
    second = bed.start(f"resume-{bed.engine}", name, spec)
    code = second.wait(RUN_TIMEOUT_S)
    second.kill()
    resumed = bool(second.steps_seen) and min(second.steps_seen) > committed[-1]
    return [sigterm, Part("resume", code == 0 and resumed,
                          f"exit code {code}; checkpoint at step {committed[-1]}, first step "
                          f"reported after the restart: {min(second.steps_seen, default=None)}")]


@contextlib.contextmanager
def _aws() -> Iterator[None]:
    from mtrl_testbed.moto import aws_endpoint

    with aws_endpoint():
        yield


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mtrl trainer-check", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--engine", default="mtrl", choices=["mtrl", "trl"],
                        help="spec.trainer.engine in the runs' spec (default mtrl)")
    parser.add_argument("--steps", type=int, default=3, help="steps of the valid run")
    parser.add_argument("--keep", type=Path, help="keep the runs' files (logs, specs) here")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the trainer command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the trainer command after --, e.g. -- python -m mtrl_trainer")
    with contextlib.ExitStack() as stack:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        root.mkdir(parents=True, exist_ok=True)
        stack.enter_context(_aws())
        parts = check(command, args.engine, root, args.steps)
    width = max(len(p.name) for p in parts)
    for part in parts:
        print(f"{'PASS' if part.passed else 'FAIL'}  {part.name:<{width}}  {part.detail}")
    failed = [p.name for p in parts if not p.passed]
    print(f"{len(parts) - len(failed)} of {len(parts)} parts of the trainer contract met"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
