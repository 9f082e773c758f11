"""Progress reports after each step: a JSON file and/or the run's progress ConfigMap.

The operator creates the ConfigMap (named in MTRL_PROGRESS_CONFIGMAP) with a Role that lets the
trainer's ServiceAccount get and patch that one object, watches it, and copies
`progress.json` into the run's status; the schema is the status' `progress` in camelCase plus
`policyVersion`, `trainedSteps`, `attempt` (the operator's attempt number, MTRL_ATTEMPT), `launch`
(the operator's launch number, MTRL_LAUNCH: which workload wrote the report) and, once training
finished and its last checkpoint is saved, `outcome: "Succeeded"`. The ConfigMap outlives the
trainer's workload, so the operator learns how an attempt ended even when something (a
HyperPodPyTorchJob's ttlSecondsAfterFinished of 0) deleted the workload first. A failed report
is logged and never stops training: progress is advisory, checkpoints are the record.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from mtrl_api import PROGRESS_KEY

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ComponentReport:
    name: str
    mean: float
    std: float
    zero_variance_fraction: float


@dataclass(frozen=True)
class ProgressReport:
    step: int
    total_steps: int
    reward_mean: float | None
    reward_std: float | None
    success_rate: float | None
    zero_variance_fraction: float | None
    validation_success_rate: float | None
    tokens_per_second: float | None
    components: list[ComponentReport]
    policy_version: int
    validation_pass_at_k: dict[int, float] = field(default_factory=dict)
    validation_greedy_success_rate: float | None = None  # dataset.evalGreedy
    # How the step trained (camelCase keys): off-policy lag, importance weights, time split.
    # They go to metrics.jsonl and the progress ConfigMap; status keeps the fields above.
    training: dict[str, Any] = field(default_factory=dict)
    failed_episode_fraction: float | None = None
    episode_error: str = ""  # the step's most frequent one, in the environment's words
    trained_steps: int | None = None  # steps of this run whose update trained the adapter

    def to_json(self) -> dict[str, Any]:
        return {
            **self.training,
            "step": self.step,
            "totalSteps": self.total_steps,
            "rewardMean": self.reward_mean,
            "rewardStd": self.reward_std,
            "successRate": self.success_rate,
            "zeroVarianceFraction": self.zero_variance_fraction,
            "validationSuccessRate": self.validation_success_rate,
            "validationPassAtK": [{"k": k, "value": v}
                                  for k, v in sorted(self.validation_pass_at_k.items())],
            "validationGreedySuccessRate": self.validation_greedy_success_rate,
            "tokensPerSecond": self.tokens_per_second,
            "components": [
                {"name": c.name, "mean": c.mean, "std": c.std,
                 "zeroVarianceFraction": c.zero_variance_fraction}
                for c in self.components
            ],
            "policyVersion": self.policy_version,
            "trainedSteps": self.trained_steps,
            "failedEpisodeFraction": self.failed_episode_fraction,
            "episodeError": self.episode_error,
            "updatedAt": _now(),
        }


class ProgressSink(Protocol):
    def report(self, body: dict[str, Any]) -> None: ...


class FileSink:
    def __init__(self, path: Path) -> None:
        self.path = path

    def report(self, body: dict[str, Any]) -> None:
        # Write-then-rename: a reader never sees half a file.
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)


class ConfigMapSink:
    """Merge-patches the run's progress ConfigMap (in-cluster or KUBECONFIG credentials)."""

    def __init__(self, name: str, namespace: str) -> None:
        from lightkube import Client

        self.name, self.namespace = name, namespace
        self._client = Client(namespace=namespace, field_manager="mtrl-trainer")

    def report(self, body: dict[str, Any]) -> None:
        from lightkube.resources.core_v1 import ConfigMap
        from lightkube.types import PatchType

        patch = {"data": {PROGRESS_KEY: json.dumps(body)}}
        self._client.patch(ConfigMap, self.name, patch, namespace=self.namespace,
                           patch_type=PatchType.MERGE)


class StepLines:
    """JSON lines grouped by step in one object of the run's output folder. S3 has no append:
    the object is rewritten whenever a step's lines change. A resumed trainer keeps the lines of
    the steps its checkpoint holds and drops the later ones, which it plays again."""

    KEY: str

    def __init__(self, output_uri: str, resumed_step: int, client: Any | None = None) -> None:
        from mtrl_trainer import s3

        self._s3 = client or s3.client()
        self.bucket, prefix = s3.parse_s3_uri(output_uri)
        self.key = s3.join(prefix, self.KEY)
        self._lines: dict[int, list[str]] = {}
        if resumed_step:
            try:
                body = self._s3.get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
            except self._s3.exceptions.NoSuchKey:
                body = b""
            for line in body.decode().splitlines():
                step = json.loads(line).get("step", 0)
                if step <= resumed_step:
                    self._lines.setdefault(step, []).append(line)

    def put(self, step: int, bodies: list[dict[str, Any]]) -> None:
        """Step `step`'s lines are `bodies` (replacing any it had)."""
        self._lines[step] = [json.dumps(body) for body in bodies]
        self._write()

    def _write(self) -> None:
        text = "".join(f"{line}\n" for step in sorted(self._lines) for line in self._lines[step])
        self._s3.put_object(Bucket=self.bucket, Key=self.key, Body=text.encode())


class MetricsHistory(StepLines):
    """Every step's report, one JSON line per step, in <run's output folder>/metrics.jsonl (a
    few hundred bytes a step)."""

    KEY = "metrics.jsonl"

    def report(self, body: dict[str, Any]) -> None:
        self.put(body["step"], [body])


class EvaluationLog(StepLines):
    """Every play of every held-out evaluation, one JSON line each, in <run's output folder>/
    eval.jsonl: the per-game results that a paired comparison of two evaluations (before and
    after training, greedy and sampled) needs, which the rates in metrics.jsonl average away."""

    KEY = "eval.jsonl"

    def add(self, step: int, plays: list[dict[str, Any]]) -> None:
        """More plays of the evaluation after step `step` (sampled, then greedy)."""
        self._lines.setdefault(step, []).extend(json.dumps(play) for play in plays)
        self._write()


SUCCEEDED = "Succeeded"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class Progress:
    def __init__(self, sinks: list[ProgressSink], attempt: int | None = None,
                 launch: int | None = None) -> None:
        self.sinks = sinks
        self.attempt = attempt
        self.launch = launch
        self._last: dict[str, Any] | None = None
        self._checkpoint: str | None = None

    def report(self, report: ProgressReport) -> None:
        body = report.to_json()
        if self._checkpoint:
            body["latestCheckpoint"] = self._checkpoint
        self._send(body)

    def checkpointed(self, uri: str) -> None:
        """A checkpoint was committed: the last report again, naming it (and every report
        after it), so the run's status says what a retry resumes from."""
        self._checkpoint = uri
        if self._last is not None:
            self._send({**self._last, "latestCheckpoint": uri, "updatedAt": _now()})

    def succeeded(self, step: int, total_steps: int, trained_steps: int) -> None:
        """The last report again, marked as the outcome: written only after the final
        checkpoint, so a reader may take it as "this run is done". With the step reached and
        the steps that trained, it is the operator's evidence (docs/trainer-contract.md)."""
        body = self._last or {"components": [], "policyVersion": step}
        self._send({**body, "step": step, "totalSteps": total_steps,
                    "trainedSteps": trained_steps, "outcome": SUCCEEDED, "updatedAt": _now()})

    def _send(self, body: dict[str, Any]) -> None:
        if self.attempt is not None:
            body = {**body, "attempt": self.attempt}
        if self.launch is not None:  # which workload wrote it: the operator's MTRL_LAUNCH
            body = {**body, "launch": self.launch}
        self._last = body
        for sink in self.sinks:
            try:
                sink.report(body)
            except Exception:
                log.warning("progress report to %s failed", type(sink).__name__, exc_info=True)
