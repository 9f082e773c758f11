"""The reward workers' part of the run's state machine, pure: their own words (ECS tasks and
what RunTask answered, worker pods, turned into one sentence the run's status and Events can
carry), and the rules (`plan_workers`): the trainer starts at minReplicas, the rest are asked
for again with backoff, and a run short of minReplicas for readyTimeoutSeconds fails.

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

from mtrl_api.run import MultiTurnRLRunSpec, WorkersProblem
from mtrl_operator.reconcile.draft import (
    Act,
    Draft,
    EcsTask,
    Event,
    Placement,
    WorkerProblem,
    duration,
)
from mtrl_operator.reconcile.pods import cannot_start, unschedulable

MAX_WORDS = 1024
PLACEMENT_BACKOFF_S = (10.0, 300.0)  # first retry after a shortfall, and the cap (doubling)


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
            last = (container.get("lastState") or {}).get("terminated") or {}
            if last.get("exitCode"):  # restarted after a failure: a crash loop, whatever
                told = _last_line(last.get("message") or "")  # the moment's state says
                words = f"a worker container is crash-looping: exit code {last['exitCode']}"
                return WorkerProblem("CrashLoopBackOff", _clip(f"{words}: {told}" if told else
                                                               words))
        if (stuck := cannot_start(pod)) is not None:
            reason, said = stuck
            return WorkerProblem(reason, _clip(
                f"a worker container cannot start ({reason}): {said}".rstrip(": ")))
        if (placement := unschedulable(pod)) is not None:
            return WorkerProblem("Unschedulable",
                                 _clip(f"a worker pod cannot be scheduled: {placement}"))
    return None


# ------------------------------------------------------------------ the workers' rules


@dataclass(frozen=True)
class WorkerPlan:
    actions: list[Act]
    requeue: float | None
    enough: bool  # minReplicas ready: the trainer may start
    expired: str | None = None  # short of minReplicas for too long: why the run must fail


def _worker_words(st: Draft, spec: MultiTurnRLRunSpec) -> None:
    """The workers' problem in status: what this reconcile's RunTask answered, else what the
    tasks or pods say, else the last words, until every worker is ready. Each new cause is
    an Event; a shortfall or a crash backs the next RunTask off."""
    obs, ws = st.obs, st.s.workers
    said, short = obs.worker_problem, False
    if obs.placement is not None:  # a try just happened
        ws.next_placement_time = None
        short = obs.placement.short
        said = placement_problem(obs.placement) or said
    if short or obs.workers_stopped > ws.stopped:  # a shortfall, or a task stopped on its own
        ws.placement_failures += 1
        ws.next_placement_time = obs.now + dt.timedelta(
            seconds=placement_backoff(ws.placement_failures))
    ws.stopped = obs.workers_stopped
    if said is not None:
        problem = WorkersProblem(reason=said.reason, message=said.words)
        if ws.problem != problem:
            st.events.append(Event("Warning", said.reason, said.words))
        ws.problem = problem
    elif obs.workers_ready >= spec.workers.max_replicas:  # all there: what was said is over
        ws.problem, ws.placement_failures, ws.next_placement_time = None, 0, None


def plan_workers(st: Draft, spec: MultiTurnRLRunSpec) -> WorkerPlan:
    """Workers before the GPUs: the trainer starts once `minReplicas` are ready, and the rest
    are asked for again (with backoff after a shortfall) without holding the trainer back. A
    run short of `minReplicas` for `readyTimeoutSeconds`, before or during training, fails
    with the workers' last words."""
    obs, workers, ws = st.obs, spec.workers, st.s.workers
    _worker_words(st, spec)
    enough = obs.workers_ready >= workers.min_replicas
    problem = ws.problem
    summary = (f"{obs.workers_ready}/{workers.max_replicas} workers ready (minimum "
               f"{workers.min_replicas})")
    st.cond("WorkersReady", enough,
            "WorkersReady" if enough else (problem.reason if problem else "WaitingForWorkers"),
            f"{summary}: {problem.message}" if problem else summary)
    requeue: float | None = None
    ws.short_since = None if enough else (ws.short_since or obs.now)
    if ws.short_since is not None:
        short_for = (obs.now - ws.short_since).total_seconds()
        if short_for >= workers.ready_timeout_seconds:
            return WorkerPlan([], None, False, (
                f"fewer than spec.workers.minReplicas ({workers.min_replicas}) workers were "
                f"ready for {duration(workers.ready_timeout_seconds)}: "
                f"{problem.message if problem else 'no worker became ready'}"))
        requeue = min(0.5, workers.ready_timeout_seconds - short_for)
    actions: list[Act] = []
    # ECS tasks have no watch: look again soon. The controller doubles the wait while
    # nothing changes, so a short first look costs little however long the workers take.
    if not obs.workers_exist or obs.workers_desired < workers.max_replicas:
        after = ws.next_placement_time
        if after is None or obs.now >= after:
            actions, requeue = [Act.ENSURE_WORKERS], 0.5
        else:
            wait = (after - obs.now).total_seconds()
            requeue = wait if requeue is None else min(requeue, wait)
    return WorkerPlan(actions, requeue, enough)
