"""The Argo CD health check for MultiTurnRLTrigger, over statuses the operator's own decision
function (`triggers.decide.observe`) writes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from mtrl_operator.api.run import Phase
from mtrl_operator.api.trigger import MultiTurnRLTriggerSpec, MultiTurnRLTriggerStatus
from mtrl_operator.triggers import decide
from mtrl_operator.triggers.decide import QueueState, RunView
from tests.argocd.test_health_lua import ARGOCD, health

pytest.importorskip("lupa")

SCRIPT = ARGOCD / "health-multiturnrltrigger.lua"
NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
QUEUE = QueueState("http://sqs/123456789012/q", "arn:aws:sqs:us-west-2:123456789012:q", None)
SPEC: dict[str, Any] = {
    "source": {"s3": {"bucket": "my-rl-data", "prefix": "incoming/"}},
    "runTemplate": {"spec": {"model": {"name": "Qwen/Qwen3-8B"},
                             "rollout": {"environment": "wordle"},
                             "output": {"s3Uri": "s3://out/wordle"}}}}
TWO_ACTIVE = [RunView("a", Phase.RUNNING, NOW), RunView("b", Phase.PENDING, NOW),
              RunView("c", Phase.FAILED, NOW)]


def trigger(queue: QueueState | None = QUEUE, problem: tuple[str, str] | None = None,
            runs: list[RunView] | None = None, suspend: bool = False, generation: int = 1,
            observed: int | None = 1) -> dict[str, Any]:
    """A MultiTurnRLTrigger as Argo CD reads it, its status written by decide.observe."""
    spec = {**SPEC, "suspend": suspend}
    obj: dict[str, Any] = {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLTrigger",
                           "metadata": {"name": "wordle", "namespace": "team-a",
                                        "generation": generation}, "spec": spec}
    if observed is not None:
        status = decide.observe(MultiTurnRLTriggerStatus(),
                                MultiTurnRLTriggerSpec.model_validate(spec), observed,
                                runs or [], queue, problem, NOW)
        obj["status"] = status.wire()
    return obj


@pytest.mark.parametrize(("obj", "expected"), [
    (trigger(observed=None), ("Progressing", "Waiting for the operator")),
    (trigger(queue=None), ("Progressing", "Provisioning: setting up the queue and the bucket's "
                                          "notification")),
    (trigger(runs=TWO_ACTIVE), ("Healthy", "Watching: watching s3://my-rl-data/incoming/*.jsonl; "
                                           "2 active runs")),
    (trigger(runs=TWO_ACTIVE[:1]), ("Healthy", "Watching: watching s3://my-rl-data/incoming/"
                                               "*.jsonl; 1 active run")),
    (trigger(), ("Healthy", "Watching: watching s3://my-rl-data/incoming/*.jsonl; 0 active runs")),
    (trigger(suspend=True), ("Suspended", "Suspended: notifications wait in the queue until "
                                          "spec.suspend is false")),
    (trigger(problem=("AwsError", "PutBucketNotificationConfiguration: AccessDenied: no")),
     ("Degraded", "AwsError: PutBucketNotificationConfiguration: AccessDenied: no")),
    (trigger(generation=3, observed=2),
     ("Progressing", "Waiting for the operator to observe generation 3 (last observed 2)")),
], ids=["no-status", "provisioning", "watching", "one-run", "idle", "suspended", "aws-error",
        "stale"])
def test_trigger_health(obj: dict[str, Any], expected: tuple[str, str]) -> None:
    assert health(obj, SCRIPT) == expected


def test_suspend_set_before_the_operator_saw_it_waits() -> None:
    obj = trigger(suspend=False, generation=2, observed=1)
    obj["spec"]["suspend"] = True
    assert health(obj, SCRIPT)[0] == "Progressing"


def test_an_empty_status_waits_for_the_operator() -> None:
    obj = trigger(observed=None)
    obj["status"] = {}
    assert health(obj, SCRIPT) == ("Progressing", "Waiting for the operator")
