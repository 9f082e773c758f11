"""Pure readings of observed objects: trainer state, worker readiness, progress, spec checks."""

from __future__ import annotations

import functools
import json
from importlib.metadata import entry_points
from typing import Any

from pydantic import ValidationError

from mtrl_operator.api.run import MultiTurnRLRunSpec, Progress, WorkerBackend, WorkersSpec
from mtrl_operator.reconcile import TrainerObserved, TrainerState
from mtrl_operator.settings import Settings

# Fargate's valid memory (MiB) for each cpu size.
FARGATE_MEMORY = {
    256: (512, 2048), 512: (1024, 4096), 1024: (2048, 8192), 2048: (4096, 16384),
    4096: (8192, 30720), 8192: (16384, 61440), 16384: (32768, 122880),
}


def _true_conditions(obj: dict[str, Any]) -> list[str]:
    return [c.get("type", "") for c in (obj.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"]


def _message(obj: dict[str, Any], type_: str) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c.get("message") or c.get("reason") or ""
    return ""


def trainer_state(kind: str, obj: dict[str, Any], attempt: int) -> TrainerObserved:
    true = _true_conditions(obj)
    status = obj.get("status") or {}
    if kind == "Job":
        if "Complete" in true or "SuccessCriteriaMet" in true:
            return TrainerObserved(attempt, TrainerState.SUCCEEDED, "the trainer Job completed")
        if "Failed" in true or "FailureTarget" in true:
            return TrainerObserved(attempt, TrainerState.FAILED, _message(obj, "Failed")
                                   or _message(obj, "FailureTarget") or "the trainer Job failed")
        if (status.get("ready") or 0) > 0:
            return TrainerObserved(attempt, TrainerState.RUNNING, "")
        return TrainerObserved(attempt, TrainerState.PENDING, "waiting for trainer pods")
    # PyTorchJob and HyperPodPyTorchJob: the job controller's conditions, latest first.
    for type_, state in (("Succeeded", TrainerState.SUCCEEDED), ("Completed", TrainerState.SUCCEEDED),
                         ("Failed", TrainerState.FAILED), ("Restarting", TrainerState.RESTARTING),
                         ("Running", TrainerState.RUNNING)):
        if type_ in true:
            return TrainerObserved(attempt, state, _message(obj, type_))
    return TrainerObserved(attempt, TrainerState.PENDING, f"waiting for the {kind} controller")


def progress_from_configmap(obj: dict[str, Any]) -> Progress | None:
    raw = (obj.get("data") or {}).get("progress.json") or "{}"
    try:
        data = json.loads(raw)
        return Progress.model_validate(data) if data else None
    except (json.JSONDecodeError, ValidationError):
        return None  # a half-written or foreign report is ignored, never fatal


@functools.cache
def known_environments() -> frozenset[str]:
    """Environments the default worker image provides: this distribution's own plug-ins.
    Read once: scanning every installed distribution's entry points took a quarter of the
    operator's CPU when it ran on every reconcile."""
    try:
        from mtrl_worker.environments.registry import available
    except ImportError:  # an operator-only install: trust the run's name
        return frozenset(ep.name for ep in entry_points(group="mtrl.environments"))
    return frozenset(available())


def spec_problem(spec: MultiTurnRLRunSpec, settings: Settings) -> tuple[str, str] | None:
    """Checks the schema cannot express; a run that fails one ends Failed with the reason."""
    workers: WorkersSpec = spec.workers
    default_image = WorkersSpec.model_fields["image"].default
    envs = known_environments()
    if workers.image == default_image and envs and spec.rollout.environment not in envs:
        return ("UnknownEnvironment",
                f"spec.rollout.environment {spec.rollout.environment!r} is not provided by the "
                f"default worker image (it has: {', '.join(sorted(envs))})")
    if workers.backend == WorkerBackend.ECS_FARGATE:
        if not (workers.ecs.subnets or settings.ecs_subnets):
            return ("NoSubnets", "backend ecs-fargate needs subnets: set "
                    "spec.workers.ecs.subnets or the operator's MTRL_ECS_SUBNETS")
        if not (workers.ecs.security_groups or settings.ecs_security_groups):
            return ("NoSecurityGroups", "backend ecs-fargate needs security groups: set "
                    "spec.workers.ecs.securityGroups or the operator's MTRL_ECS_SECURITY_GROUPS")
        low, high = FARGATE_MEMORY[workers.cpu]
        if not low <= workers.memory <= high:
            return ("InvalidFargateSize", f"Fargate cpu {workers.cpu} takes memory between "
                    f"{low} and {high} MiB, not {workers.memory}")
    return None
