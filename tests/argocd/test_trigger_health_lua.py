"""The Argo CD health check for MultiTurnRLTrigger, run as Argo CD runs it (tests/argocd/luacheck.py),
over statuses the operator's own decision function (`mtrl_operator.reconcile.trigger.observe`) writes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from mtrl_api.run import Phase
from mtrl_api.trigger import MultiTurnRLTriggerSpec, MultiTurnRLTriggerStatus
from mtrl_operator.reconcile import trigger as reconcile_trigger
from mtrl_operator.reconcile.trigger import QueueState, RunView
from tests.argocd.luacheck import ArgoCD

NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
QUEUE = QueueState("http://sqs/123456789012/q", "arn:aws:sqs:us-west-2:123456789012:q", None)
SPEC: dict[str, Any] = {
    "source": {"s3": {"bucket": "my-rl-data", "prefix": "incoming/"}},
    "runTemplate": {"spec": {"model": {"name": "Qwen/Qwen3-8B"},
                             "rollout": {"environment": "wordle"},
                             "output": {"s3Uri": "s3://out/wordle"}}}}
TWO_ACTIVE = [RunView("a", Phase.RUNNING, NOW), RunView("b", Phase.PENDING, NOW),
              RunView("c", Phase.FAILED, NOW)]
AWS_ERROR = ("AwsError", "PutBucketNotificationConfiguration: AccessDenied: no")


def trigger(queue: QueueState | None = QUEUE, problem: tuple[str, str] | None = None,
            runs: list[RunView] | None = None, suspend: bool = False, generation: int = 1,
            observed: int | None = 1) -> dict[str, Any]:
    """A MultiTurnRLTrigger as Argo CD reads it, its status written by reconcile_trigger.observe."""
    spec = {**SPEC, "suspend": suspend}
    obj: dict[str, Any] = {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLTrigger",
                           "metadata": {"name": "wordle", "namespace": "team-a",
                                        "generation": generation}, "spec": spec}
    if observed is not None:
        status = reconcile_trigger.observe(MultiTurnRLTriggerStatus(),
                                MultiTurnRLTriggerSpec.model_validate(spec), observed,
                                runs or [], queue, problem, NOW)
        obj["status"] = status.wire()
    return obj


# Every Ready state reconcile_trigger.observe writes (problem, provisioning, suspended,
# watching), and none.
STATES: dict[str, tuple[dict[str, Any], tuple[str, str]]] = {
    "no-status": (trigger(observed=None), ("Progressing", "Waiting for the operator")),
    "provisioning": (trigger(queue=None), ("Progressing", "Provisioning: setting up the queue and the "
                                                          "bucket's notification")),
    "watching": (trigger(runs=TWO_ACTIVE), ("Healthy", "Watching: watching s3://my-rl-data/"
                                                       "incoming/*.jsonl; 2 active runs")),
    "one-run": (trigger(runs=TWO_ACTIVE[:1]), ("Healthy", "Watching: watching s3://my-rl-data/"
                                                          "incoming/*.jsonl; 1 active run")),
    "idle": (trigger(), ("Healthy", "Watching: watching s3://my-rl-data/incoming/*.jsonl; "
                                    "0 active runs")),
    "suspended": (trigger(suspend=True), ("Suspended", "Suspended: notifications wait in the queue "
                                                       "until spec.suspend is false")),
    "suspended-aws-error": (trigger(suspend=True, problem=AWS_ERROR),
                            ("Suspended", "Suspended: PutBucketNotificationConfiguration: "
                                          "AccessDenied: no")),
    "aws-error": (trigger(problem=AWS_ERROR),
                  ("Degraded", "AwsError: PutBucketNotificationConfiguration: AccessDenied: no")),
}


@pytest.mark.parametrize("state", list(STATES))
def test_trigger_health(argocd: ArgoCD, state: str) -> None:
    obj, expected = STATES[state]
    assert argocd.health(obj) == expected


@pytest.mark.parametrize("state", [s for s in STATES if s != "no-status"])
def test_stale_observed_generation_is_progressing(argocd: ArgoCD, state: str) -> None:
    obj = STATES[state][0]
    stale = {**obj, "metadata": {**obj["metadata"], "generation": obj["status"]["observedGeneration"] + 2}}
    assert argocd.health(stale) == ("Progressing",
                                    "Waiting for the operator to observe generation 3 (last observed 1)")


def test_suspend_set_before_the_operator_saw_it_waits(argocd: ArgoCD) -> None:
    obj = trigger(suspend=False, generation=2, observed=1)
    obj["spec"]["suspend"] = True
    assert argocd.health(obj)[0] == "Progressing"


def test_an_empty_status_waits_for_the_operator(argocd: ArgoCD) -> None:
    obj = trigger(observed=None)
    obj["status"] = {}
    assert argocd.health(obj) == ("Progressing", "Waiting for the operator")
