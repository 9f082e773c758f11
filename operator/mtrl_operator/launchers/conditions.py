"""What a training job's conditions mean, for the launchers whose controller keeps a condition
history (Kubeflow's PyTorchJob, HyperPod's HyperPodPyTorchJob). Pure."""

from __future__ import annotations

from typing import Any

from mtrl_operator.reconcile.draft import TrainerObserved, TrainerState

# What the newest condition of a PyTorchJob or HyperPodPyTorchJob means. Kubeflow's types are
# in pkg/apis/kubeflow.org/v1/common_types.go; HyperPod's terminal ones are the recipes
# launcher's (Completed, Failed), see docs/hyperpod.md.
TRAINING_JOB_STATES = {"Succeeded": TrainerState.SUCCEEDED, "Completed": TrainerState.SUCCEEDED,
                       "Failed": TrainerState.FAILED, "Restarting": TrainerState.RESTARTING,
                       "Running": TrainerState.RUNNING}


def newest_true_condition(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The True condition with the latest lastTransitionTime; on a tie, the later in the list.

    A training job's conditions are a history, not a set of facts: after a fault HyperPod
    recovered from, `Failed=True` can stay in the list below a newer `Running`. AWS's own
    launcher reads the newest one (sagemaker-hyperpod-recipes,
    scripts/validations/validation_launchers/k8s_launcher.py: `.status.conditions[-1]`);
    ranking every True condition by type would let the stale Failed kill a healthy job.
    RFC 3339 timestamps in UTC ("Z") sort as strings; one without a time sorts first."""
    true = [(c.get("lastTransitionTime") or "", i, c) for i, c in
            enumerate((obj.get("status") or {}).get("conditions") or [])
            if c.get("status") == "True"]
    return max(true, key=lambda t: (t[0], t[1]))[2] if true else None


def training_job_state(kind: str, obj: dict[str, Any], attempt: int) -> TrainerObserved:
    newest = newest_true_condition(obj)
    state = TRAINING_JOB_STATES.get((newest or {}).get("type", ""))
    if newest is None or state is None:  # Created, or a type this operator does not know
        return TrainerObserved(attempt, TrainerState.PENDING, f"waiting for the {kind} controller")
    return TrainerObserved(attempt, state, newest.get("message") or newest.get("reason") or "")
