"""Every launcher answers the same small interface (mtrl_operator.launchers, as Kueue's
GenericJob): what it builds, how its state reads, whether its queue holds it, who retries it."""

from __future__ import annotations

import pytest

from mtrl_api.run import LauncherKind, MultiTurnRLRunSpec
from mtrl_operator import launchers
from mtrl_operator.naming import RunNames
from mtrl_operator.reconcile.draft import TrainerState
from mtrl_operator.reconcile.retries import RetryOwner

NAMES = RunNames("team-a", "wordle", "uid-1")
OWNER = {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun", "name": "wordle",
         "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}
DONE = {"Job": {"type": "Complete", "status": "True"},
        "PyTorchJob": {"type": "Succeeded", "status": "True"},
        "HyperPodPyTorchJob": {"type": "Completed", "status": "True"}}


def spec(kind: LauncherKind) -> MultiTurnRLRunSpec:
    return MultiTurnRLRunSpec.model_validate({
        "model": {"name": "Qwen/Qwen3-8B"}, "rollout": {"environment": "wordle"},
        "dataset": {"generated": {}}, "output": {"s3Uri": "s3://bucket/runs"},
        "trainer": {"launcher": kind.value}})


@pytest.mark.parametrize("kind", list(LauncherKind))
def test_each_launcher_builds_reads_and_names_its_retry_owner(kind: LauncherKind) -> None:
    launcher = launchers.of(kind)
    assert launcher.kind == kind
    workload = launcher.build(NAMES, spec(kind), {}, 3, OWNER)[-1]
    assert workload["kind"] == kind.value and workload["metadata"]["name"] == NAMES.trainer(3)
    assert launcher.state(workload, 3).state == TrainerState.PENDING
    assert not launcher.suspended(workload)
    done = {**workload, "status": {"conditions": [DONE[kind.value]]}}
    assert launchers.observe(kind.value, done, 3).state == TrainerState.SUCCEEDED
    owner = launcher.retry_owner(spec(kind).trainer, "team-a")
    assert owner == (RetryOwner.HYPERPOD_TRAINING_OPERATOR
                     if kind == LauncherKind.HYPERPOD_PYTORCH_JOB else RetryOwner.OPERATOR)
