"""Pure readings of observed objects: the trainer's pods, its report, the spec's checks."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from mtrl_api import (
    CONFIG_ERROR_EXIT_CODE,
    CONFIG_ERROR_PREFIX,
    DIVERGED_PREFIX,
    EPISODES_FAILED_PREFIX,
    NOTHING_TRAINED_PREFIX,
    PROGRESS_KEY,
)
from mtrl_api.environments import EnvironmentInfo, catalog
from mtrl_api.run import (
    FARGATE_MEMORY_MIB,
    MultiTurnRLRunSpec,
    Progress,
    WorkerBackend,
    WorkersSpec,
    fargate_memory_text,
)
from mtrl_operator.reconcile.draft import TrainerObserved, TrainerReport
from mtrl_operator.reconcile.pods import bound, cannot_start, unschedulable
from mtrl_operator.settings import Settings


def queue_hold(queue: str, workloads: list[dict[str, Any]]) -> str:
    """What a trainer held by Kueue waits for, in Kueue's words: its Workload's newest
    eviction (preempted, or its ClusterQueue stopped) or why it has no quota yet
    (kueue.x-k8s.io/v1beta2 Workload conditions Evicted and QuotaReserved)."""
    words = ""
    for workload in sorted(workloads, key=lambda w: w["metadata"].get("creationTimestamp", "")):
        conditions = {c.get("type"): c for c in (workload.get("status") or {}).get(
            "conditions") or []}
        evicted, reserved = conditions.get("Evicted"), conditions.get("QuotaReserved")
        if evicted and evicted.get("status") == "True":
            words = f"evicted ({evicted.get('reason')}): {evicted.get('message', '')}"
        elif reserved and reserved.get("status") == "False":
            words = reserved.get("message") or reserved.get("reason") or ""
    head = (f"waiting for Kueue admission in queue {queue}" if queue
            else "suspended, waiting to be admitted")
    return f"{head}: {words}" if words else head


MAX_CAUSE = 1024  # of the trainer's own words in the run's message


def failed_containers(pods: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(pod name, container status) of every container that exited non-zero, init
    containers first, in pod order."""
    out = []
    for pod in pods:
        status = pod.get("status") or {}
        for container in [*(status.get("initContainerStatuses") or []),
                          *(status.get("containerStatuses") or [])]:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated.get("exitCode"):
                out.append(((pod.get("metadata") or {}).get("name", ""), container))
    return out


def disruption(pods: list[dict[str, Any]]) -> str:
    """Why the pods were stopped from outside, if they were: the DisruptionTarget condition
    the API server, the scheduler or the kubelet sets on a pod it evicts or preempts
    (kubernetes.io/docs/concepts/workloads/pods/disruptions/#pod-disruption-conditions)."""
    for pod in pods:
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True":
                said = c.get("message") or ""
                return f"{c.get('reason') or 'Disrupted'}: {said}" if said else \
                    c.get("reason") or "Disrupted"
    return ""


def with_cause(trainer: TrainerObserved, pods: list[dict[str, Any]]) -> TrainerObserved:
    """A failed trainer, told in its own words: the termination message of a container of its
    pods that failed (the trainer writes one line; with FallbackToLogsOnError the kubelet puts
    the tail of the log there instead), its last line, and whether it was a configuration
    error (exit code 2, or the message says so: torchrun exits 1 whatever its child did),
    episodes that kept failing or a gradient that was not finite; or that its pods were evicted
    or preempted."""
    if said := disruption(pods):
        return replace(trainer, disrupted=said[:MAX_CAUSE])
    failed = failed_containers(pods)
    if not failed:
        return trainer
    pod, container = failed[0]  # the first failed container tells
    terminated = container["state"]["terminated"]
    code = terminated["exitCode"]
    lines = [line.strip() for line in (terminated.get("message") or "").splitlines()]
    cause = next((line for line in reversed(lines) if line), "")
    config_error = code == CONFIG_ERROR_EXIT_CODE or cause.startswith(CONFIG_ERROR_PREFIX)
    told = f"{cause[:MAX_CAUSE]} (exit code {code})" if cause else f"exit code {code}"
    return replace(trainer, message=f"{told}; {trainer.message}" if trainer.message else told,
                   config_error=config_error, failed_in=(pod, container["name"]),
                   episodes_failed=cause.startswith(EPISODES_FAILED_PREFIX),
                   nothing_trained=cause.startswith(NOTHING_TRAINED_PREFIX),
                   diverged=cause.startswith(DIVERGED_PREFIX))


def with_pods(trainer: TrainerObserved, pods: list[dict[str, Any]]) -> TrainerObserved:
    """A pending trainer as its pods tell it: bound to a node (holding it, billed), and then
    what keeps its container from starting in the kubelet's words ("ImagePullBackOff: Back-off
    pulling image ..."); or not placed, in the scheduler's ("0/12 nodes are available: 12
    Insufficient nvidia.com/gpu. ..."), instead of waiting in silence for a node that may never
    come or an image that will never pull."""
    held = any(bound(pod) for pod in pods)
    for pod in pods:
        if (stuck := cannot_start(pod)) is not None:
            reason, said = stuck
            name = (pod.get("metadata") or {}).get("name", "")
            words = f"pod {name} cannot start its container ({reason}): {said}".rstrip(": ")
            return replace(trainer, message=words[:MAX_CAUSE], waiting=words[:MAX_CAUSE],
                           bound=held)
    for pod in pods:
        if (placement := unschedulable(pod)) is not None:
            return replace(trainer, message=f"its pod cannot be scheduled: {placement[:MAX_CAUSE]}",
                           unschedulable=True, bound=held)
    return replace(trainer, bound=held)


def _progress_json(obj: dict[str, Any]) -> dict[str, Any]:
    try:
        data = json.loads((obj.get("data") or {}).get(PROGRESS_KEY) or "{}")
    except json.JSONDecodeError:
        return {}  # a half-written or foreign report is ignored, never fatal
    return data if isinstance(data, dict) else {}


def progress_from_configmap(obj: dict[str, Any]) -> Progress | None:
    data = _progress_json(obj)
    try:
        return Progress.model_validate(data) if data else None
    except ValidationError:
        return None


def _count(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def trainer_report(obj: dict[str, Any]) -> TrainerReport | None:
    """What the trainer last wrote with its progress (trainer/mtrl_trainer/progress.py): the
    launch it ran as (MTRL_LAUNCH) and the operator's attempt number (MTRL_ATTEMPT), how far
    it got, the steps that trained, and "Succeeded" once training finished and its last
    checkpoint was saved. All outlive the trainer's workload; none is taken on trust: a
    field of the wrong type reads as absent."""
    data = _progress_json(obj)
    if not data:
        return None
    outcome = data.get("outcome")
    return TrainerReport(launch=_count(data, "launch"), attempt=_count(data, "attempt"),
                         outcome=outcome if isinstance(outcome, str) else None,
                         step=_count(data, "step") or 0,
                         total_steps=_count(data, "totalSteps") or 0,
                         trained_steps=_count(data, "trainedSteps"))


def _environment_problem(spec: MultiTurnRLRunSpec,
                         env: EnvironmentInfo) -> tuple[str, str] | None:
    """What the environment itself would refuse: its arguments, reward components, inline
    tasks, or a generated dataset it cannot make (mtrl_api's catalog says what it takes)."""
    if problems := env.argument_problems(spec.rollout.environment_args):
        return ("InvalidEnvironmentArgs",
                f"spec.rollout.environmentArgs: {'; '.join(problems)}")
    known = [c.name for c in env.components]
    unknown = [c.name for c in spec.reward.components if c.name not in known]
    if unknown:
        return ("UnknownRewardComponent",
                f"spec.reward.components {', '.join(map(repr, unknown))} are not reward "
                f"components of environment {env.name!r} (it has: {', '.join(known)})")
    inline = spec.dataset.inline
    for split, tasks in (("train", inline.train), ("validation", inline.validation)) \
            if inline is not None else ():
        for i, task in enumerate(tasks):
            if (problem := env.task_problem(task)) is not None:
                return ("InvalidTask", f"spec.dataset.inline.{split}[{i}]: {problem}")
    if spec.dataset.generated is not None and not env.generates_tasks:
        return ("DatasetNotGenerated",
                f"spec.dataset.generated: environment {env.name!r} cannot generate its own "
                "tasks; use spec.dataset.inline or spec.dataset.s3")
    return None


def spec_problem(spec: MultiTurnRLRunSpec, settings: Settings) -> tuple[str, str] | None:
    """Checks the schema cannot express; a run that fails one ends Failed with the reason."""
    workers: WorkersSpec = spec.workers
    default_image = WorkersSpec.model_fields["image"].default
    envs = catalog()
    name = spec.rollout.environment
    if workers.image == default_image and name not in envs:
        return ("UnknownEnvironment",
                f"spec.rollout.environment {name!r} is not provided by the default worker "
                f"image (it has: {', '.join(sorted(envs))})")
    # Checked whatever the worker image: an image that plays a catalogued environment runs
    # this distribution's plug-in, and every one of its workers would refuse these arguments,
    # weights or tasks at start, crash, and be restarted for ever.
    if (env := envs.get(name)) is not None and (problem := _environment_problem(spec, env)):
        return problem
    if spec.lifecycle.max_cost_usd is not None and settings.price(spec.trainer.instance_type) is None:
        return ("NoPrice", f"spec.lifecycle.maxCostUSD needs a price for instance type "
                f"{spec.trainer.instance_type!r}; the operator has "
                f"{', '.join(sorted(settings.prices)) or 'none'} (chart value pricing)")
    if workers.backend == WorkerBackend.ECS_FARGATE:
        if not (workers.ecs.subnets or settings.ecs_subnets):
            return ("NoSubnets", "backend ecs-fargate needs subnets: set "
                    "spec.workers.ecs.subnets or the operator's MTRL_ECS_SUBNETS")
        if not (workers.ecs.security_groups or settings.ecs_security_groups):
            return ("NoSecurityGroups", "backend ecs-fargate needs security groups: set "
                    "spec.workers.ecs.securityGroups or the operator's MTRL_ECS_SECURITY_GROUPS")
        if not (workers.ecs.execution_role_arn or settings.ecs_execution_role_arn):
            # Fargate refuses awslogs without it ("Fargate requires task definition to have
            # execution role ARN to support log driver awslogs").
            return ("NoExecutionRole", "backend ecs-fargate sends the workers' logs to "
                    "CloudWatch Logs with the task execution role: set spec.workers.ecs."
                    "executionRoleArn or the operator's MTRL_ECS_EXECUTION_ROLE_ARN")
        # The schema refuses these; a run stored before its rules existed still fails here.
        if workers.cpu not in FARGATE_MEMORY_MIB:
            return ("InvalidFargateSize", f"Fargate takes cpu {', '.join(map(str, FARGATE_MEMORY_MIB))},"
                    f" not {workers.cpu}")
        if workers.memory not in FARGATE_MEMORY_MIB[workers.cpu]:
            return ("InvalidFargateSize", f"Fargate cpu {workers.cpu} takes memory "
                    f"{fargate_memory_text(workers.cpu)}, not {workers.memory}")
    return None
