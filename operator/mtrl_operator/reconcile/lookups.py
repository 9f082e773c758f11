"""What a reconcile looks up, decided from what it already knows.

The controller fetches what these ask for and nothing else, so what a reconcile costs (AWS
calls, live reads from the API server) is decided here and tested without servers.
"""

from __future__ import annotations

from typing import Any

from mtrl_api.run import MultiTurnRLRunSpec, MultiTurnRLRunStatus, WorkerBackend
from mtrl_operator.naming import LABEL_ATTEMPT
from mtrl_operator.reconcile.draft import SUCCEEDED_OUTCOME, TrainerObserved, TrainerReport, TrainerState

QUEUE_ROLES = 4  # a run's queues: rollout and generate, requests and responses

Workload = tuple[tuple[str, str], dict[str, Any]]  # ((kind, name), object)


def needs_aws(status: MultiTurnRLRunStatus, deleting: bool) -> bool:
    """A finished run whose status records nothing left in AWS needs no AWS calls."""
    left = status.resources.queues or status.resources.task_arns or \
        status.resources.task_definition_arn
    return deleting or not status.phase.finished or bool(left)


def is_live(spec: MultiTurnRLRunSpec | None, status: MultiTurnRLRunStatus, deleting: bool) -> bool:
    """A run that can still train: the one whose missing pieces are worth explaining."""
    return spec is not None and not deleting and not status.phase.finished


def worker_backends(spec: MultiTurnRLRunSpec | None) -> tuple[WorkerBackend, ...]:
    """Where the run's workers may be: without a readable spec the backend is unknown, so
    both are looked at (a run deleted with a broken spec still leaves nothing behind)."""
    return (spec.workers.backend,) if spec is not None else tuple(WorkerBackend)


def needs_stopped_tasks(live: bool, spec: MultiTurnRLRunSpec | None, live_tasks: int) -> bool:
    """Some workers are missing: the stopped tasks say why, and EnsureWorkers needs them all
    (the tasks of every client token, to start only what is missing)."""
    return live and spec is not None and live_tasks < spec.workers.max_replicas


def queues_listed_again(live: bool, roles: set[str], age_s: float, resync_s: float) -> bool:
    """Whether a reconcile lists the run's queues or trusts the last listing: a live run whose
    every queue was there less than a resync period ago trusts it (a queue deleted behind the
    operator's back is seen within that period); a run being provisioned, finished or deleted
    always looks again."""
    return not live or len(roles) < QUEUE_ROLES or age_s >= resync_s


def tasks_may_exist(queues: int, deleting: bool, status: MultiTurnRLRunStatus) -> bool:
    """Whether to list the run's ECS tasks at all: workers start only once the queues exist,
    so a run with none that never recorded a worker (a new run, before its queues) has
    none. A run being deleted or finished is always looked at, and so is one whose status
    names workers: its queues may have gone while its tasks run."""
    recorded = status.resources.task_arns or status.resources.task_definition_arn
    return queues > 0 or deleting or status.phase.finished or bool(recorded)


def task_definition_may_exist(queues: int, deleting: bool, status: MultiTurnRLRunStatus) -> bool:
    """Whether to look up the run's task definitions when no live task names one: workers
    (and their definition) come after the queues, or the status recorded one."""
    return queues == QUEUE_ROLES or deleting or status.phase.finished or \
        status.resources.task_definition_arn is not None


def attempt_of(workload: dict[str, Any]) -> int:
    return int((workload["metadata"].get("labels") or {}).get(LABEL_ATTEMPT, "0"))


def current_workload(workloads: dict[tuple[str, str], dict[str, Any]],
                     attempt: int) -> Workload | None:
    """The workload of the run's current attempt, if it is cached."""
    return next(((key, obj) for key, obj in workloads.items() if attempt_of(obj) == attempt),
                None)


def needs_live_trainer_read(found: bool, spec: MultiTurnRLRunSpec | None,
                            status: MultiTurnRLRunStatus, deleting: bool) -> bool:
    """`decide` takes a missing workload of a launched attempt for one that is gone for good,
    so a cache that has not caught up (a restart's first reconcile, a watch behind a create)
    must not say so: the workload and the progress ConfigMap are read from the API server."""
    return not found and is_live(spec, status, deleting) and \
        status.launched_attempt >= status.attempts >= 1


def needs_live_report(trainer: TrainerObserved, report: TrainerReport | None,
                      status: MultiTurnRLRunStatus) -> bool:
    """A workload that ended is judged by its launch's report: unless the cached report
    already is that launch's outcome, it is read from the API server (once per ending: the
    verdict that follows ends the attempt or the run)."""
    ended = trainer.state in (TrainerState.SUCCEEDED, TrainerState.FAILED)
    return ended and not (report is not None and report.of_launch(status.trainer_launch)
                          and report.outcome == SUCCEEDED_OUTCOME)


def needs_trainer_pods(trainer: TrainerObserved | None, live: bool) -> bool:
    """A failed trainer's pods hold its own words (read while they are still there: the next
    action deletes the workload, the run's message keeps them); a pending one's say whether
    the scheduler can place it."""
    return live and trainer is not None and \
        trainer.state in (TrainerState.FAILED, TrainerState.PENDING)


def trainer_pods_live(trainer: TrainerObserved) -> bool:
    """Whether the trainer's pods are read from the API server rather than the cache: a failed
    trainer's, once per attempt, because the pods' watch may not have brought the container's
    termination yet when the workload's says Failed, and the words are lost with the workload;
    a pending trainer's are looked at on every poll, and a cache a moment behind is as good."""
    return trainer.state == TrainerState.FAILED


def needs_worker_pods(live: bool, desired: int, ready: int) -> bool:
    """Workers short of ready: the kubelet's and the worker's words say why."""
    return live and ready < desired


def needs_queue_hold(trainer: TrainerObserved) -> bool:
    """A trainer its queue holds suspended: its Kueue Workload says why (read from the API
    server while it waits; a Workload carries none of the operator's labels to watch by)."""
    return trainer.held
