"""The run's state machine, as one pure function: observed state in, actions and status out.

Nothing here talks to a server. `decide` is called on every event and every resync; it must
give the same answer for the same observation (level-triggered), so a crash between any two
actions is repaired by calling it again.

Order is cost order: queues, then workers, then the GPU trainer only once workers are ready;
on the way out the trainer goes first, then workers, then queues.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum

from mtrl_operator.api.run import (
    Condition,
    LauncherKind,
    MultiTurnRLRunSpec,
    MultiTurnRLRunStatus,
    Phase,
    Progress,
    ResourceRefs,
    WorkersStatus,
)
from mtrl_operator.retries import RetryOwner, retry_owner

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
    workers_exist: bool = False
    workers_desired: int = 0
    workers_ready: int = 0
    trainer: TrainerObserved | None = None  # the current attempt's workload, if it exists
    trainers_exist: bool = False  # any attempt's workload
    resources: ResourceRefs = field(default_factory=ResourceRefs)
    progress: Progress | None = None
    namespace: str = ""  # the run's: whether HyperPod auto-resume applies depends on it
    # What the trainer wrote into its progress ConfigMap, which outlives the workload: the
    # attempt that last reported, and "Succeeded" once training finished and was saved.
    reported_attempt: int | None = None
    trainer_outcome: str | None = None


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


class _Status:
    """A mutable draft of the status, turned back into the model at the end."""

    def __init__(self, obs: Observed) -> None:
        self.obs = obs
        self.s = obs.status.model_copy(deep=True)
        self.events: list[Event] = []

    def cond(self, type_: str, status: bool | None, reason: str, message: str = "") -> None:
        self.s.conditions = set_condition(self.s.conditions, type_, status, reason, message,
                                          self.obs.now, self.obs.generation)

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


# --------------------------------------------------------------------------- decide


def _teardown(obs: Observed, keep_queues: bool = False) -> list[Act]:
    """Cost order: GPUs first, then workers, then queues; each only once the previous is gone,
    so a failure half-way never leaves the expensive part running."""
    if obs.trainers_exist:
        return [Act.DELETE_TRAINER]
    if obs.workers_exist:
        return [Act.DELETE_WORKERS]
    if obs.queues_exist and not keep_queues:
        return [Act.DELETE_QUEUES]
    return []


def _merge_observations(st: _Status, obs: Observed) -> None:
    refs = obs.resources
    st.s.resources = refs
    if obs.progress is not None:
        streak = st.s.progress.collapse_streak
        st.s.progress = obs.progress.model_copy()
        st.s.progress.collapse_streak = streak
    if obs.spec is not None:
        total = obs.spec.grpo.max_steps
        st.s.progress.total_steps = total
        st.s.progress.display = f"{st.s.progress.step}/{total}"
        desired = obs.workers_desired or obs.spec.workers.max_replicas
        st.s.workers = WorkersStatus(desired=desired, ready=obs.workers_ready,
                                     display=f"{obs.workers_ready}/{desired}")


def _reward_collapse(st: _Status, obs: Observed, previous: Progress) -> None:
    spec = obs.spec
    progress = st.s.progress
    if spec is None or progress.zero_variance_fraction is None or progress.step == previous.step:
        return
    collapse = spec.reward.collapse
    above = progress.zero_variance_fraction >= collapse.zero_variance_threshold
    streak = (previous.collapse_streak + 1) if above else 0
    progress.collapse_streak = streak
    raised = streak >= collapse.window_steps
    was = any(c.type == "RewardCollapse" and c.status == "True" for c in st.s.conditions)
    message = (f"{progress.zero_variance_fraction:.0%} of groups had equal rewards for "
               f"{streak} consecutive steps (threshold {collapse.zero_variance_threshold:.0%}, "
               f"window {collapse.window_steps}); GRPO gets no signal from them")
    st.cond("RewardCollapse", raised, "ZeroVarianceGroups" if raised else "RewardsVary",
            message if raised else "")
    if raised and not was:
        st.events.append(Event("Warning", "RewardCollapse", message))


_OWNER_TEXT = {RetryOwner.HYPERPOD_AUTO_RESUME: "HyperPod auto-resume",
               RetryOwner.HYPERPOD_TRAINING_OPERATOR: "the HyperPod training operator"}


def _launched_and_gone(st: _Status, obs: Observed, attempt: int) -> bool:
    """The current attempt's workload existed and is gone. Asked for alone is not enough: the
    operator may have stopped between recording the attempt and creating it. Seen by a
    reconcile, or reported from by its trainer, is: then creating it again would run a
    finished or failed attempt a second time."""
    if st.s.launched_attempt < attempt:
        return False
    return st.s.observed_attempt >= attempt or obs.reported_attempt == attempt


def _vanished(spec: MultiTurnRLRunSpec, attempt: int) -> str:
    kind = spec.trainer.launcher.value
    ttl = (" (a HyperPodPyTorchJob is deleted by its runPolicy.ttlSecondsAfterFinished)"
           if spec.trainer.launcher == LauncherKind.HYPERPOD_PYTORCH_JOB else "")
    return (f"the {kind} of attempt {attempt} was deleted before the operator saw its "
            f"outcome{ttl}, and its trainer reported no success: counted as a failed attempt")


def decide(obs: Observed) -> Decision:
    st = _Status(obs)
    previous_progress = obs.status.progress
    _merge_observations(st, obs)
    _reward_collapse(st, obs, previous_progress)
    st.s.observed_generation = obs.generation
    spec = obs.spec

    def done(actions: list[Act], requeue: float | None = None, attempt: int = 0) -> Decision:
        return Decision(actions, st.s, st.events, attempt, requeue)

    # Deletion: everything goes, then the finalizer.
    if obs.deleting:
        st.phase(Phase.TERMINATING, "deleting the run's resources")
        actions = _teardown(obs)
        return done(actions or [Act.REMOVE_FINALIZER], requeue=1.0 if actions else None)

    # A spec the schema accepted but that cannot run: Failed with its reason, nothing kept.
    if obs.spec_error is not None and not st.s.phase.finished:
        reason, message = obs.spec_error
        st.finish(False, reason, message)
        return done(_teardown(obs), requeue=1.0)

    # Finished: tear down what is left, then wait for the TTL.
    if st.s.phase.finished or spec is None:
        actions = _teardown(obs)
        if actions:
            return done(actions, requeue=1.0)
        ttl = spec.lifecycle.ttl_seconds_after_finished if spec else None
        if ttl is not None and st.s.completion_time is not None:
            expires = st.s.completion_time + dt.timedelta(seconds=ttl)
            if obs.now >= expires:
                return done([Act.DELETE_RUN])
            return done([], requeue=(expires - obs.now).total_seconds())
        return done([])

    lifecycle = spec.lifecycle
    if st.s.start_time is None:
        st.s.start_time = obs.now
        st.s.attempts = max(st.s.attempts, 1)
        st.cond("Progressing", True, "Provisioning", "creating queues")

    # Deadline: counted from the start, suspended time included (as Job does).
    if lifecycle.active_deadline_seconds is not None:
        deadline = st.s.start_time + dt.timedelta(seconds=lifecycle.active_deadline_seconds)
        if obs.now >= deadline:
            st.finish(False, "DeadlineExceeded",
                      f"the run was active longer than {lifecycle.active_deadline_seconds}s")
            return done(_teardown(obs), requeue=1.0)
        deadline_in = (deadline - obs.now).total_seconds()
    else:
        deadline_in = None

    def wait(actions: list[Act], requeue: float | None = None, attempt: int = 0) -> Decision:
        """Requeue no later than the deadline."""
        if deadline_in is not None:
            requeue = min(requeue, deadline_in) if requeue is not None else deadline_in
        return done(actions, requeue, attempt)

    # Suspended: compute goes, queues and progress stay.
    if lifecycle.suspend:
        actions = _teardown(obs, keep_queues=True)
        st.cond("Progressing", False, "Suspended", "the run is suspended")
        if actions:
            st.phase(Phase.SUSPENDED if st.s.phase == Phase.SUSPENDED else Phase.TERMINATING,
                     "suspending: stopping the trainer and workers")
            return wait(actions, requeue=1.0)
        st.cond("TrainerReady", False, "Suspended", "")
        st.cond("WorkersReady", False, "Suspended", "")
        # The operator deleted the trainer itself: resuming creates the same attempt again.
        st.s.launched_attempt = min(st.s.launched_attempt, st.s.attempts - 1)
        st.s.observed_attempt = min(st.s.observed_attempt, st.s.attempts - 1)
        st.phase(Phase.SUSPENDED, "suspended; set spec.lifecycle.suspend=false to resume "
                                  "from the latest checkpoint")
        return wait([])

    if st.s.phase in (Phase.PENDING, Phase.SUSPENDED):
        st.phase(Phase.PROVISIONING, "creating queues, workers and trainer")

    # 1. Queues.
    st.cond("QueuesReady", obs.queues_ready, "QueuesCreated" if obs.queues_ready else
            "CreatingQueues", "" if obs.queues_ready else "creating SQS queues")
    if not obs.queues_ready:  # CreateQueue returns once the queue exists: look again at once
        return wait([Act.ENSURE_QUEUES], requeue=0.1)

    # 2. Workers; the trainer waits for enough of them.
    enough = obs.workers_ready >= spec.workers.min_replicas
    st.cond("WorkersReady", enough, "WorkersReady" if enough else "WaitingForWorkers",
            f"{obs.workers_ready}/{spec.workers.max_replicas} workers ready "
            f"(minimum {spec.workers.min_replicas})")
    # ECS tasks have no watch: look again soon. The controller doubles the wait while
    # nothing changes, so a short first look costs little however long the workers take.
    if not obs.workers_exist or obs.workers_desired < spec.workers.max_replicas:
        return wait([Act.ENSURE_WORKERS], requeue=0.5)
    if not enough and obs.trainer is None:
        return wait([], requeue=0.5)

    # 3. Trainer, one attempt at a time.
    attempt = st.s.attempts
    trainer = obs.trainer
    if trainer is not None and trainer.attempt == attempt:
        st.s.observed_attempt = max(st.s.observed_attempt, attempt)
    elif obs.trainers_exist:  # an older attempt is still there; remove it first
        return wait([Act.DELETE_TRAINER], requeue=1.0)
    elif obs.trainer_outcome == SUCCEEDED_OUTCOME:
        # The workload is gone (a ttlSecondsAfterFinished of 0 deletes a finished
        # HyperPodPyTorchJob at once), but the trainer recorded that it finished.
        trainer = TrainerObserved(attempt, TrainerState.SUCCEEDED,
                                  "the trainer reported that training finished")
    elif _launched_and_gone(st, obs, attempt):
        trainer = TrainerObserved(attempt, TrainerState.FAILED, _vanished(spec, attempt))
    else:
        # Recorded before the create call (status is written before any action), so a
        # workload that exists once is never created a second time.
        st.s.launched_attempt = attempt
        st.cond("TrainerReady", False, "CreatingTrainer", f"attempt {attempt}")
        return wait([Act.ENSURE_TRAINER], requeue=2.0, attempt=attempt)

    if trainer.state == TrainerState.SUCCEEDED:
        st.cond("TrainerReady", False, "TrainerSucceeded", trainer.message)
        st.finish(True, "TrainingComplete", f"trained {st.s.progress.step} steps in "
                                            f"{attempt} attempt(s)")
        return done(_teardown(obs), requeue=0.2)
    if trainer.state == TrainerState.FAILED:
        owner = retry_owner(spec.trainer.launcher, obs.namespace)
        if owner != RetryOwner.OPERATOR:
            st.finish(False, "TrainerFailed",
                      f"the {spec.trainer.launcher.value} failed after the retries "
                      f"{_OWNER_TEXT[owner]} makes (trainer.autoResumeMaxRetries="
                      f"{spec.trainer.auto_resume_max_retries}); the operator does not retry "
                      f"on top of them: {trainer.message}")
            return done(_teardown(obs), requeue=0.2)
        failures = attempt
        if failures <= lifecycle.backoff_limit:
            st.s.attempts = attempt + 1
            st.cond("TrainerReady", False, "Retrying", trainer.message)
            st.events.append(Event("Warning", "TrainerFailed",
                                   f"attempt {attempt} failed ({trainer.message}); starting "
                                   f"attempt {attempt + 1} from the latest checkpoint"))
            return wait([Act.DELETE_TRAINER] if obs.trainers_exist else [], requeue=0.5)
        st.finish(False, "BackoffLimitExceeded",
                  f"the trainer failed {failures} time(s), more than backoffLimit "
                  f"{lifecycle.backoff_limit}; last: {trainer.message}")
        return done(_teardown(obs), requeue=0.2)

    running = trainer.state == TrainerState.RUNNING
    st.cond("TrainerReady", running, trainer.state.value, trainer.message)
    if running:
        st.cond("Progressing", True, "Training", f"step {st.s.progress.display}")
        st.phase(Phase.RUNNING, f"training: step {st.s.progress.display}")
    return wait([], requeue=None)

