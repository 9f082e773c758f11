"""What the run's state machine reads and writes, and the draft of a decision: the
observation (`Observed`, with the trainer, the workers and AWS as the controller saw them),
the decision (`Decision`: actions, status, Events, requeue), conditions, and the teardown
order. Pure: nothing here talks to a server."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum

from mtrl_api.run import (
    Condition,
    MultiTurnRLRunSpec,
    MultiTurnRLRunStatus,
    Phase,
    Progress,
    ResourceRefs,
)

# What the operator says when it stops a task itself (teardown, suspension): such a stop is
# not the workers' failure.
OPERATOR_STOP_REASON = "mtrl: run finished, suspended or deleted"

# The run's conditions this operator writes (and owns under server-side apply); others'
# conditions on the run are theirs and left alone.
CONDITION_TYPES = frozenset({"Preflight", "Progressing", "QueuesReady", "WorkersReady", "TrainerReady",
                             "Complete", "Failed", "RewardCollapse", "EpisodesFailing"})
SUCCEEDED_OUTCOME = "Succeeded"  # what a trainer writes into its progress once training is done


class TrainerState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Act(StrEnum):
    """What the controller must do, in the order given."""

    ENSURE_QUEUES = "EnsureQueues"
    ENSURE_WORKERS = "EnsureWorkers"
    ENSURE_TRAINER = "EnsureTrainer"
    DELETE_TRAINER = "DeleteTrainer"
    DELETE_WORKERS = "DeleteWorkers"
    DELETE_QUEUES = "DeleteQueues"
    DELETE_LOGS = "DeleteLogs"
    DELETE_RUN = "DeleteRun"
    REMOVE_FINALIZER = "RemoveFinalizer"


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class TrainerObserved:
    attempt: int
    state: TrainerState
    message: str = ""
    config_error: bool = False  # the trainer said retrying cannot help
    unschedulable: bool = False  # the scheduler said no node fits its pods
    failed_in: tuple[str, str] | None = None  # (pod, container) whose failure told the cause
    episodes_failed: bool = False  # the trainer stopped because the run's episodes kept failing
    diverged: bool = False  # the trainer stopped on a step whose gradient norm was not finite
    nothing_trained: bool = False  # the trainer played every step and none updated the adapter
    disrupted: str = ""  # its pods were evicted or preempted (the API server's words)
    hung: bool = False  # running, but no step for spec.lifecycle.progressTimeoutSeconds
    never_started: bool = False  # bound to a node, not running after startupTimeoutSeconds
    held: bool = False  # suspended by its queue (Kueue) until admitted
    bound: bool = False  # a pod of it is bound to a node (and holds it), running or not
    waiting: str = ""  # why a bound pod's container has not started, in the kubelet's words


@dataclass(frozen=True)
class TrainerReport:
    """What the trainer last wrote into the run's progress ConfigMap, which outlives its
    workload (docs/trainer-contract.md): the launch it ran as (MTRL_LAUNCH), the attempt, how
    far it got, the steps whose update trained the adapter, and "Succeeded" once training
    finished and its last checkpoint was saved."""

    launch: int | None = None
    attempt: int | None = None
    outcome: str | None = None
    step: int = 0
    total_steps: int = 0
    trained_steps: int | None = None

    def of_launch(self, launch: int) -> bool:
        """Written by launch `launch` (the operator's numbers start at 1): the only report
        that says anything about that workload."""
        return launch > 0 and self.launch == launch


@dataclass(frozen=True)
class Observed:
    """Everything `decide` may look at."""

    now: dt.datetime
    generation: int
    deleting: bool
    spec: MultiTurnRLRunSpec | None
    spec_error: tuple[str, str] | None  # (reason, message) of a spec that cannot run
    status: MultiTurnRLRunStatus
    queues_ready: bool = False
    queues_exist: bool = False
    logs_exist: bool = False  # the run's own worker log group (looked for only when deleting)
    workers_exist: bool = False
    workers_desired: int = 0
    workers_ready: int = 0
    trainer: TrainerObserved | None = None  # the current attempt's workload, if it exists
    trainers_exist: bool = False  # any attempt's workload
    # (kind, name) of every trainer workload seen: what DeleteTrainer deletes.
    trainer_workloads: tuple[tuple[str, str], ...] = ()
    resources: ResourceRefs = field(default_factory=ResourceRefs)
    progress: Progress | None = None
    namespace: str = ""  # the run's: whether HyperPod auto-resume applies depends on it
    name: str = ""
    uid: str = ""
    # What the trainer last wrote into its progress ConfigMap, whichever launch wrote it.
    report: TrainerReport | None = None
    preflight: str | None = None  # what preflight checked, when it ran and passed
    price: float | None = None  # USD per node-hour of the trainer's instance type, if known
    retry_backoff_seconds: float = 10.0  # before the attempt after the first failed one
    # The workers in their own words: a stopped ECS task, a crash-looping pod (None: nothing
    # to say now); ECS tasks that stopped on their own; what this reconcile's RunTask answered
    # (set when the decision is taken again after EnsureWorkers); every task listed.
    worker_problem: WorkerProblem | None = None
    workers_stopped: int = 0
    placement: Placement | None = None
    ecs_tasks: tuple[EcsTask, ...] = ()
    # The run's active task definitions were listed: none in `resources` means none exists.
    task_definitions_listed: bool = False


@dataclass(frozen=True)
class Decision:
    actions: list[Act]
    status: MultiTurnRLRunStatus
    events: list[Event] = field(default_factory=list)
    attempt: int = 0  # the trainer attempt ENSURE_TRAINER creates
    requeue_after: float | None = None


# --------------------------------------------------------------------------- conditions


def set_condition(conditions: list[Condition], type_: str, status: bool | None, reason: str,
                  message: str, now: dt.datetime, generation: int) -> list[Condition]:
    """Conditions with `type_` set; lastTransitionTime moves only when the status changes."""
    value = "Unknown" if status is None else ("True" if status else "False")
    out, found = [], False
    for c in conditions:
        if c.type != type_:
            out.append(c)
            continue
        found = True
        moved = c.status != value
        out.append(Condition(type=type_, status=value, reason=reason, message=message,
                             observed_generation=generation,
                             last_transition_time=now if moved else c.last_transition_time))
    if not found:
        out.append(Condition(type=type_, status=value, reason=reason, message=message,
                             observed_generation=generation, last_transition_time=now))
    return out


class Draft:
    """The decision being made: a mutable copy of the status, the Events it posts, and the
    deadline (if any) that caps every requeue."""

    def __init__(self, obs: Observed) -> None:
        self.obs = obs
        self.s = obs.status.model_copy(deep=True)
        self.events: list[Event] = []
        self.deadline_in: float | None = None

    def cond(self, type_: str, status: bool | None, reason: str, message: str = "") -> None:
        self.s.conditions = set_condition(self.s.conditions, type_, status, reason, message,
                                          self.obs.now, self.obs.generation)

    def alarm(self, type_: str, raised: bool, reason: str, clear_reason: str,
              message: str) -> None:
        """A condition that warns (RewardCollapse, EpisodesFailing): its message while
        raised, and a Warning Event of its name when it rises."""
        was = any(c.type == type_ and c.status == "True" for c in self.s.conditions)
        self.cond(type_, raised, reason if raised else clear_reason, message if raised else "")
        if raised and not was:
            self.events.append(Event("Warning", type_, message))

    def phase(self, phase: Phase, message: str, warning: bool = False) -> None:
        if self.s.phase != phase:
            self.events.append(Event("Warning" if warning else "Normal", phase.value, message))
        self.s.phase = phase
        self.s.message = message

    def finish(self, succeeded: bool, reason: str, message: str) -> None:
        if self.s.completion_time is None:
            self.s.completion_time = self.obs.now
        self.cond("Complete", succeeded, reason if succeeded else "NotCompleted",
                  message if succeeded else "")
        self.cond("Failed", not succeeded, reason if not succeeded else "NotFailed",
                  message if not succeeded else "")
        self.cond("Progressing", False, reason, message)
        self.phase(Phase.SUCCEEDED if succeeded else Phase.FAILED, message, warning=not succeeded)

    def done(self, actions: list[Act], requeue: float | None = None,
             attempt: int = 0) -> Decision:
        return Decision(actions, self.s, self.events, attempt, requeue)

    def wait(self, actions: list[Act], requeue: float | None = None,
             attempt: int = 0) -> Decision:
        """A decision of a live run: requeued no later than its deadline."""
        if self.deadline_in is not None:
            requeue = self.deadline_in if requeue is None else min(requeue, self.deadline_in)
        return self.done(actions, requeue, attempt)


# --------------------------------------------------------------------------- decide


def teardown(obs: Observed, keep_queues: bool = False) -> list[Act]:
    """Cost order: GPUs first, then workers, then queues; each only once the previous is gone,
    so a failure half-way never leaves the expensive part running."""
    if obs.trainers_exist:
        return [Act.DELETE_TRAINER]
    if obs.workers_exist:
        return [Act.DELETE_WORKERS]
    if obs.queues_exist and not keep_queues:
        return [Act.DELETE_QUEUES]
    return []


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


def duration(seconds: float) -> str:
    """30m, 90s, 2h: how people say a timeout."""
    whole = round(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"
