"""Trainer launchers: one small interface per kind of workload the trainer runs in (as Kueue's
`jobframework.GenericJob` is per job kind), so that the state machine and the controller never
ask which kind it is.

A launcher builds its workload (the objects of one attempt, in creation order), reads its state
from the workload's own status, says whether its queue holds it suspended, and says who owns
its retries. What the pods run, their placement and their words are shared
(`builders/trainer.py`, `reconcile/readings.py`); each launcher's particulars are in its module:
`job` (an indexed Job and a headless Service), `pytorchjob` (Kubeflow, with HyperPod
auto-resume), `hyperpod` (HyperPodPyTorchJob). Pure.
"""

from __future__ import annotations

from typing import Any, Protocol

from mtrl_api.run import LauncherKind, MultiTurnRLRunSpec, TrainerSpec
from mtrl_operator.launchers import hyperpod, job, pytorchjob
from mtrl_operator.naming import RunNames
from mtrl_operator.reconcile.draft import TrainerObserved, TrainerState
from mtrl_operator.reconcile.retries import RetryOwner


class Launcher(Protocol):
    kind: LauncherKind

    def build(self, names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str],
              attempt: int, owner: dict[str, Any]) -> list[dict[str, Any]]:
        """The objects of one attempt's workload, in creation order (the workload last)."""
        ...

    def state(self, obj: dict[str, Any], attempt: int) -> TrainerObserved:
        """The workload's state from its own status (its pods are read apart)."""
        ...

    def suspended(self, obj: dict[str, Any]) -> bool:
        """Whether its queue (Kueue) holds it suspended: no pods, no cost."""
        ...

    def retry_owner(self, trainer: TrainerSpec, namespace: str) -> RetryOwner:
        """Who starts it again after a failure: exactly one owner (`reconcile/retries.py`)."""
        ...


LAUNCHERS: dict[LauncherKind, Launcher] = {
    LauncherKind.JOB: job.JobLauncher(),
    LauncherKind.PYTORCH_JOB: pytorchjob.PyTorchJobLauncher(),
    LauncherKind.HYPERPOD_PYTORCH_JOB: hyperpod.HyperPodLauncher(),
}


def of(kind: LauncherKind | str) -> Launcher:
    """The launcher of `spec.trainer.launcher`, or of a workload's `kind`."""
    return LAUNCHERS[LauncherKind(kind)]


def observe(kind: str, obj: dict[str, Any], attempt: int) -> TrainerObserved:
    """The workload as the state machine sees it: its state, unless its queue holds it (a
    workload that ended is judged by its end, suspended or not)."""
    launcher = of(kind)
    observed = launcher.state(obj, attempt)
    if observed.state in (TrainerState.SUCCEEDED, TrainerState.FAILED) \
            or not launcher.suspended(obj):
        return observed
    return TrainerObserved(attempt, TrainerState.PENDING, f"the {kind} is suspended", held=True)


def retry_owner(trainer: TrainerSpec, namespace: str) -> RetryOwner:
    return of(trainer.launcher).retry_owner(trainer, namespace)


def build(names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str], attempt: int,
          owner: dict[str, Any]) -> list[dict[str, Any]]:
    return of(spec.trainer.launcher).build(names, spec, env, attempt, owner)
