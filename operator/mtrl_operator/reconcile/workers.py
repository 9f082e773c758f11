"""The reward workers in their own words, pure: ECS tasks and what RunTask answered, worker
pods, turned into one sentence the run's status and Events can carry.

Real fleets fail half-way: RunTask answers HTTP 200 with fewer tasks than asked and one
`failures` entry per missing task (Fargate short of capacity), a task stops with a
`stoppedReason` and its container's exit code, a pod crash-loops. Each becomes a
`WorkerProblem`: a reason (CamelCase, the condition's and the Event's) and words that stay the
same while the cause does (no counts that move), so each distinct cause is announced once.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any

# What the operator says when it stops a task itself (teardown, suspension): such a stop is
# not the workers' failure.
OPERATOR_STOP_REASON = "mtrl: run finished, suspended or deleted"
MAX_WORDS = 1024
PLACEMENT_BACKOFF_S = (10.0, 300.0)  # first retry after a shortfall, and the cap (doubling)


@dataclass(frozen=True)
class EcsTask:
    """One worker task as DescribeTasks tells it."""

    arn: str
    last_status: str
    desired_status: str
    health: str = "UNKNOWN"
    task_definition_arn: str = ""
    stopped_reason: str = ""
    stop_code: str = ""
    exit_code: int | None = None  # the worker container's
    container_reason: str = ""  # e.g. "OutOfMemoryError: Container killed due to memory usage"
    stopped_at: dt.datetime | None = None

    @property
    def live(self) -> bool:
        return self.desired_status == "RUNNING" and self.last_status not in ("STOPPED",
                                                                           "DEPROVISIONING")

    @property
    def ready(self) -> bool:
        return self.live and self.last_status == "RUNNING" and self.health != "UNHEALTHY"

    @property
    def stopped_on_its_own(self) -> bool:
        """Stopped, and not because the operator said so."""
        return not self.live and self.stopped_reason != OPERATOR_STOP_REASON

    @property
    def id(self) -> str:
        return self.arn.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Placement:
    """What the RunTask calls of one EnsureWorkers answered."""

    asked: int
    started: int
    failures: tuple[str, ...] = ()  # each failure's reason (with its detail, if any)

    @property
    def short(self) -> bool:
        return self.started < self.asked


@dataclass(frozen=True)
class WorkerProblem:
    reason: str
    words: str


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_WORDS else text[: MAX_WORDS - 3] + "..."


def placement_problem(placement: Placement) -> WorkerProblem | None:
    """A shortfall in the words ECS gave: the most frequent failure reason."""
    if not placement.short:
        return None
    reasons = Counter(placement.failures)
    said = reasons.most_common(1)[0][0] if reasons else "no reason given"
    capacity = any("capacity" in r.lower() for r in reasons)
    return WorkerProblem("CapacityUnavailable" if capacity else "PlacementFailed",
                         _clip(f"ECS RunTask could not start every task: {said}"))


def placement_backoff(failures: int) -> float:
    """Seconds before the missing tasks are asked for again after `failures` shortfalls or
    crashes in a row: 10 s, doubling, at most 5 minutes (the Job controller's and ECS
    services' convention)."""
    first, cap = PLACEMENT_BACKOFF_S
    return min(cap, first * 2 ** max(failures - 1, 0))


def newest_stopped(tasks: list[EcsTask]) -> EcsTask | None:
    """The task that stopped on its own most recently, if any did."""
    stopped = [t for t in tasks if t.stopped_on_its_own]
    oldest = dt.datetime.min.replace(tzinfo=dt.UTC)
    return max(stopped, key=lambda t: (t.stopped_at or oldest, t.arn)) if stopped else None


def stopped_task_problem(task: EcsTask, last_line: str = "") -> WorkerProblem:
    """A task that stopped on its own, told by ECS (its stoppedReason, the container's exit
    code and reason) and by the worker's own last log line, if known."""
    words = f"ECS task {task.id} stopped: {task.stopped_reason or task.stop_code or 'no reason'}"
    details = []
    if task.exit_code is not None:
        details.append(f"exit code {task.exit_code}")
    if task.container_reason:
        details.append(task.container_reason)
    if details:
        words += f" ({'; '.join(details)})"
    if last_line:
        words += f": {last_line}"
    return WorkerProblem("TaskStopped", _clip(words))


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def pod_problem(pods: list[dict[str, Any]]) -> WorkerProblem | None:
    """What keeps worker pods from being ready, in the kubelet's and the worker's words:
    a container that keeps exiting (its last termination message or log tail), one that
    cannot start (an image it cannot pull), or a pod the scheduler cannot place. The first
    pod by name that has one tells."""
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        status = pod.get("status") or {}
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            last = (container.get("lastState") or {}).get("terminated") or {}
            if last.get("exitCode"):  # restarted after a failure: a crash loop, whatever
                told = _last_line(last.get("message") or "")  # the moment's state says
                words = f"a worker container is crash-looping: exit code {last['exitCode']}"
                return WorkerProblem("CrashLoopBackOff", _clip(f"{words}: {told}" if told else
                                                               words))
            if waiting.get("reason") in ("ImagePullBackOff", "ErrImagePull",
                                         "CreateContainerConfigError", "InvalidImageName"):
                return WorkerProblem(waiting["reason"], _clip(
                    f"a worker container cannot start ({waiting['reason']}): "
                    f"{waiting.get('message') or ''}".rstrip(": ")))
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                    and condition.get("reason") == "Unschedulable":
                return WorkerProblem("Unschedulable", _clip(
                    f"a worker pod cannot be scheduled: {condition.get('message') or ''}"))
    return None
