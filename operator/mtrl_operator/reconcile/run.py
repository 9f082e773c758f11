"""The run's state machine, as one pure function: observed state in, actions and status out.

Nothing here talks to a server. `decide` is called on every event and every resync; it must
give the same answer for the same observation (level-triggered), so a crash between any two
actions is repaired by calling it again.

Order is cost order: queues, then workers, then the GPU trainer only once workers are ready;
on the way out the trainer goes first, then workers, then queues.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from enum import StrEnum

from mtrl_api.run import (
    VALIDATION_HISTORY,
    Condition,
    LauncherKind,
    MultiTurnRLRunSpec,
    MultiTurnRLRunStatus,
    Phase,
    Progress,
    ResourceRefs,
    ValidationPoint,
    WorkersProblem,
    WorkersStatus,
)
from mtrl_operator.naming import ANNOTATION_FORCE_RELEASE
from mtrl_operator.reconcile.cost import budget, metered
from mtrl_operator.reconcile.retries import RetryOwner, retry_owner
from mtrl_operator.reconcile.workers import (
    EcsTask,
    Placement,
    WorkerProblem,
    placement_backoff,
    placement_problem,
)

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
    disrupted: str = ""  # its pods were evicted or preempted (the API server's words)
    hung: bool = False  # running, but no step for spec.lifecycle.progressTimeoutSeconds


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
    # What the trainer wrote into its progress ConfigMap, which outlives the workload: the
    # attempt that last reported, and "Succeeded" once training finished and was saved.
    reported_attempt: int | None = None
    trainer_outcome: str | None = None
    preflight: str | None = None  # what preflight checked, when it ran and passed
    price: float | None = None  # USD per node-hour of the trainer's instance type, if known
    # The workers in their own words: a stopped ECS task, a crash-looping pod (None: nothing
    # to say now); ECS tasks that stopped on their own; what this reconcile's RunTask answered
    # (set when the decision is taken again after EnsureWorkers); every task listed.
    worker_problem: WorkerProblem | None = None
    workers_stopped: int = 0
    placement: Placement | None = None
    ecs_tasks: tuple[EcsTask, ...] = ()


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


class _Draft:
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


def _merged_progress(previous: Progress, reported: Progress) -> Progress:
    """The trainer's latest report, with what the run keeps across reports: the collapse
    streak, the latest evaluation (a step without one reports none) and their history, and the
    latest checkpoint."""
    out = reported.model_copy()
    out.collapse_streak = previous.collapse_streak
    out.last_step_time = previous.last_step_time
    out.latest_checkpoint = reported.latest_checkpoint or previous.latest_checkpoint
    history = [p for p in previous.validation_history if p.step != reported.step]
    if reported.validation_success_rate is None:
        out.validation_success_rate = previous.validation_success_rate
        out.validation_step = previous.validation_step
        out.validation_pass_at_k = previous.validation_pass_at_k
        out.validation_history = previous.validation_history
    else:
        out.validation_step = reported.step
        out.validation_history = [*history, ValidationPoint(
            step=reported.step, success_rate=reported.validation_success_rate,
            pass_at_k=reported.validation_pass_at_k)][-VALIDATION_HISTORY:]
    return out


def _merge_observations(st: _Draft, obs: Observed) -> None:
    refs = obs.resources
    st.s.resources = refs
    if obs.spec is not None:
        running = obs.trainer is not None and obs.trainer.state in (TrainerState.RUNNING,
                                                                    TrainerState.RESTARTING)
        st.s.cost = metered(st.s.cost, obs.spec, running, obs.price, obs.now)
    if obs.progress is not None:
        new_step = obs.progress.step != st.s.progress.step
        st.s.progress = _merged_progress(st.s.progress, obs.progress)
        if new_step:  # the hang clock: when a step was seen, on the operator's own clock
            st.s.progress.last_step_time = obs.now
        if st.s.progress.latest_checkpoint and st.s.output_uri:
            st.s.adapter_uri = f"{st.s.output_uri}/adapter/"
        mean = st.s.progress.reward_mean
        st.s.progress.reward_display = "" if mean is None else f"{mean:.3f}"
    if obs.spec is not None:
        total = obs.spec.grpo.max_steps
        st.s.progress.total_steps = total
        st.s.progress.display = f"{st.s.progress.step}/{total}"
        desired = obs.workers_desired or obs.spec.workers.max_replicas
        st.s.workers = st.s.workers.model_copy(update={
            "desired": desired, "ready": obs.workers_ready,
            "display": f"{obs.workers_ready}/{desired}"})


def _reward_collapse(st: _Draft, obs: Observed, previous: Progress) -> None:
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


def _episodes_failing(st: _Draft, obs: Observed, previous: Progress) -> None:
    """A reported step that lost more than rollout.maxFailedEpisodeFraction of its episodes
    is named, in the environment's words, until a step does not."""
    spec, progress = obs.spec, st.s.progress
    if spec is None or progress.failed_episode_fraction is None or progress.step == previous.step:
        return
    limit = spec.rollout.max_failed_episode_fraction
    failing = progress.failed_episode_fraction > limit
    was = any(c.type == "EpisodesFailing" and c.status == "True" for c in st.s.conditions)
    message = (f"{progress.failed_episode_fraction:.0%} of the episodes of step {progress.step} "
               f"failed (more than spec.rollout.maxFailedEpisodeFraction {limit:g}): "
               f"{progress.episode_error or 'no error given'}")
    st.cond("EpisodesFailing", failing, "EpisodeErrors" if failing else "EpisodesSucceed",
            message if failing else "")
    if failing and not was:
        st.events.append(Event("Warning", "EpisodesFailing", message))


def _duration(seconds: float) -> str:
    """30m, 90s, 2h: how people say a timeout."""
    whole = round(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


_OWNER_TEXT = {RetryOwner.HYPERPOD_AUTO_RESUME: "HyperPod auto-resume",
               RetryOwner.HYPERPOD_TRAINING_OPERATOR: "the HyperPod training operator"}


def _launched_and_gone(st: _Draft, obs: Observed, attempt: int) -> bool:
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
    """The whole state machine: each concern below either decides or passes the run on, in
    the order a reader would ask (is it going away, can it run at all, is it over, ...)."""
    st = _Draft(obs)
    previous_progress = obs.status.progress
    _merge_observations(st, obs)
    _reward_collapse(st, obs, previous_progress)
    _episodes_failing(st, obs, previous_progress)
    st.s.observed_generation = obs.generation
    if (decision := _deletion(st) or _invalid_spec(st) or _finished(st)) is not None:
        return decision
    spec = obs.spec
    assert spec is not None  # a run without a readable spec is finished or deleting
    return (_start_and_deadline(st, spec) or _suspension(st, spec) or _queues(st)
            or _workers_then_trainer(st, spec))


FORCE_RELEASE_HINT_AFTER = 3  # failed teardowns in a row before the status says how to let go


def stalled(status: MultiTurnRLRunStatus, *, deleting: bool, cause: str, failures: int,
            namespace: str, name: str, now: dt.datetime, generation: int) -> MultiTurnRLRunStatus:
    """The status of a run whose reconcile failed (AWS unreachable, no credentials, the API
    server refusing a write): never blank. It keeps its phase (Pending if it had none;
    Terminating while deleting) and says what failed and that it retries; a deletion that keeps
    failing says how to release the run without cleanup. A finished run is left as it is."""
    if status.phase.finished and not deleting:
        return status
    out = status.model_copy(deep=True)
    if deleting:
        out.phase = Phase.TERMINATING
        out.message = f"waiting to delete the run's resources: {cause}; retrying"
        if failures >= FORCE_RELEASE_HINT_AFTER:
            out.message += (f" (failed {failures} times in a row; to release the run without "
                            f"cleanup: kubectl annotate mtrlrun {name} -n {namespace} "
                            f"{ANNOTATION_FORCE_RELEASE}=true, and the orphan sweeper deletes "
                            "what is left in AWS)")
    else:
        out.message = f"{cause}; retrying"
    out.conditions = set_condition(out.conditions, "Progressing", False, "ReconcileError", cause,
                                   now, generation)
    return out


def _deletion(st: _Draft) -> Decision | None:
    """Deleting: everything goes, in cost order, then the finalizer."""
    if not st.obs.deleting:
        return None
    st.phase(Phase.TERMINATING, "deleting the run's resources")
    # The workers' logs outlive a finished run (that is when they are read), not the run.
    actions = _teardown(st.obs) or ([Act.DELETE_LOGS] if st.obs.logs_exist else [])
    return st.done(actions or [Act.REMOVE_FINALIZER], requeue=1.0 if actions else None)


def _invalid_spec(st: _Draft) -> Decision | None:
    """A spec the schema accepted but that cannot run: Failed with its reason, nothing kept."""
    if st.obs.spec_error is None or st.s.phase.finished:
        return None
    reason, message = st.obs.spec_error
    st.cond("Preflight", False, reason, message)
    st.finish(False, reason, message)
    return st.done(_teardown(st.obs), requeue=1.0)


def _finished(st: _Draft) -> Decision | None:
    """Finished (or unreadable): tear down what is left, then wait for the TTL."""
    spec = st.obs.spec
    if not st.s.phase.finished and spec is not None:
        return None
    actions = _teardown(st.obs)
    if actions:
        return st.done(actions, requeue=1.0)
    ttl = spec.lifecycle.ttl_seconds_after_finished if spec else None
    if ttl is None or st.s.completion_time is None:
        return st.done([])
    expires = st.s.completion_time + dt.timedelta(seconds=ttl)
    if st.obs.now >= expires:
        return st.done([Act.DELETE_RUN])
    return st.done([], requeue=(expires - st.obs.now).total_seconds())


def _start_and_deadline(st: _Draft, spec: MultiTurnRLRunSpec) -> Decision | None:
    """The first look starts the clock; the deadline counts from then, suspended time
    included (as Job's activeDeadlineSeconds does)."""
    if st.s.start_time is None:
        st.s.start_time = st.obs.now
        st.s.attempts = max(st.s.attempts, 1)
        st.cond("Progressing", True, "Provisioning", "creating queues")
    if st.obs.preflight:
        st.cond("Preflight", True, "Passed", st.obs.preflight)
    if st.s.output_uri is None:  # the same folder the trainer computes from the run's identity
        st.s.output_uri = spec.output.run_uri(st.obs.namespace, st.obs.name, st.obs.uid)
    over_budget, spent_in = budget(st.s.cost, spec, st.obs.price, st.obs.now)
    if over_budget:
        st.finish(False, "BudgetExceeded", over_budget)
        return st.done(_teardown(st.obs), requeue=1.0)
    st.deadline_in = spent_in
    limit = spec.lifecycle.active_deadline_seconds
    if limit is None:
        return None
    deadline = st.s.start_time + dt.timedelta(seconds=limit)
    if st.obs.now >= deadline:
        st.finish(False, "DeadlineExceeded", f"the run was active longer than {limit}s")
        return st.done(_teardown(st.obs), requeue=1.0)
    until = (deadline - st.obs.now).total_seconds()
    st.deadline_in = until if spent_in is None else min(until, spent_in)
    return None


def _suspension(st: _Draft, spec: MultiTurnRLRunSpec) -> Decision | None:
    """Suspended: compute goes, trainer first; queues and progress stay. Suspending lasts
    until the trainer is gone, even if the run is resumed meanwhile (KubeRay's RayJob does
    the same): the trainer the operator deleted itself is then never taken for one that
    vanished, and resuming starts the same attempt again from its latest checkpoint."""
    obs = st.obs
    stopping = obs.trainers_exist and st.s.phase == Phase.SUSPENDING
    if not spec.lifecycle.suspend and not stopping:
        if st.s.phase == Phase.SUSPENDING:  # resumed after the trainer went, seen or not
            _forget_the_stopped_attempt(st)
        if st.s.phase in (Phase.PENDING, Phase.SUSPENDED, Phase.SUSPENDING):
            st.phase(Phase.PROVISIONING, "creating queues, workers and trainer")
        return None
    st.cond("Progressing", False, "Suspended", "the run is suspended")
    if obs.trainers_exist:
        st.phase(Phase.SUSPENDING, "suspending: stopping the trainer")
        return st.wait([Act.DELETE_TRAINER], requeue=1.0)
    _forget_the_stopped_attempt(st)
    if not spec.lifecycle.suspend:  # resumed while the trainer was being stopped
        st.phase(Phase.PROVISIONING, "resuming: creating workers and trainer")
        return None
    if obs.workers_exist:
        st.phase(Phase.SUSPENDING, "suspending: stopping the workers")
        return st.wait([Act.DELETE_WORKERS], requeue=1.0)
    st.cond("TrainerReady", False, "Suspended", "")
    st.cond("WorkersReady", False, "Suspended", "")
    st.phase(Phase.SUSPENDED, "suspended; set spec.lifecycle.suspend=false to resume from the "
                              "latest checkpoint")
    return st.wait([])


def _forget_the_stopped_attempt(st: _Draft) -> None:
    """The operator deleted the trainer itself: resuming creates the same attempt again, and
    the workers' clocks and words start again."""
    st.s.launched_attempt = min(st.s.launched_attempt, st.s.attempts - 1)
    st.s.observed_attempt = min(st.s.observed_attempt, st.s.attempts - 1)
    st.s.workers = WorkersStatus()


def _queues(st: _Draft) -> Decision | None:
    ready = st.obs.queues_ready
    st.cond("QueuesReady", ready, "QueuesCreated" if ready else "CreatingQueues",
            "" if ready else "creating SQS queues")
    if ready:
        return None
    return st.wait([Act.ENSURE_QUEUES], requeue=0.1)  # CreateQueue returns once it exists


@dataclass(frozen=True)
class _WorkerPlan:
    actions: list[Act]
    requeue: float | None
    enough: bool  # minReplicas ready: the trainer may start
    expired: str | None = None  # short of minReplicas for too long: why the run must fail


def _worker_words(st: _Draft, spec: MultiTurnRLRunSpec) -> None:
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


def _workers(st: _Draft, spec: MultiTurnRLRunSpec) -> _WorkerPlan:
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
            return _WorkerPlan([], None, False, (
                f"fewer than spec.workers.minReplicas ({workers.min_replicas}) workers were "
                f"ready for {_duration(workers.ready_timeout_seconds)}: "
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
    return _WorkerPlan(actions, requeue, enough)


def _workers_then_trainer(st: _Draft, spec: MultiTurnRLRunSpec) -> Decision:
    """The workers' actions, then the trainer's: a trainer asked for (or still there) is
    looked at whatever the workers do, so its outcome always ends the run."""
    plan = _workers(st, spec)
    if plan.expired and not _trainer_succeeded(st):  # a trainer that finished ends the run
        st.finish(False, "WorkersUnavailable", plan.expired)
        return st.done(_teardown(st.obs), requeue=1.0)
    launched = st.s.launched_attempt >= st.s.attempts or st.obs.trainers_exist
    if not plan.enough and not launched:
        problem = st.s.workers.problem
        st.s.message = (f"waiting for workers: {st.obs.workers_ready}/"
                        f"{spec.workers.max_replicas} ready (minimum "
                        f"{spec.workers.min_replicas})"
                        + (f": {problem.message}" if problem else ""))
        return st.wait(plan.actions, requeue=plan.requeue)
    trainer = _trainer(st, spec)
    if trainer.status.phase.finished:
        return trainer
    requeues = [r for r in (plan.requeue, trainer.requeue_after) if r is not None]
    return replace(trainer, actions=[*plan.actions, *trainer.actions],
                   requeue_after=min(requeues) if requeues else None)


def _trainer_succeeded(st: _Draft) -> bool:
    """The current attempt's trainer finished training, by its workload or its report."""
    trainer = st.obs.trainer
    return st.obs.trainer_outcome == SUCCEEDED_OUTCOME or (
        trainer is not None and trainer.attempt == st.s.attempts
        and trainer.state == TrainerState.SUCCEEDED)


def _trainer(st: _Draft, spec: MultiTurnRLRunSpec) -> Decision:
    """One attempt at a time; its outcome ends the run or starts the next attempt."""
    attempt = st.s.attempts
    trainer = _current_attempt(st, spec, attempt)
    if isinstance(trainer, Decision):
        return trainer
    if trainer.state == TrainerState.SUCCEEDED:
        st.cond("TrainerReady", False, "TrainerSucceeded", trainer.message)
        st.finish(True, "TrainingComplete", f"trained {st.s.progress.step} steps in "
                                            f"{attempt} attempt(s)")
        return st.done(_teardown(st.obs), requeue=0.2)
    if trainer.state == TrainerState.RUNNING and (hung := _hang(st, spec)) is not None:
        trainer = replace(trainer, state=TrainerState.FAILED, message=hung, hung=True)
    if trainer.state == TrainerState.FAILED:
        return _failed_attempt(st, spec, trainer)
    running = trainer.state == TrainerState.RUNNING
    st.cond("TrainerReady", running,
            "Unschedulable" if trainer.unschedulable else trainer.state.value, trainer.message)
    if not running:  # say what it waits for on the run, not only in its condition
        st.s.message = f"waiting for the trainer (attempt {attempt}): " \
                       f"{trainer.message or trainer.state.value.lower()}"
    if running:
        st.cond("Progressing", True, "Training", f"step {st.s.progress.display}")
        message = f"training: step {st.s.progress.display}"
        problem = st.s.workers.problem
        if problem is not None and st.obs.workers_ready < spec.workers.max_replicas:
            message += (f" (workers {st.obs.workers_ready}/{spec.workers.max_replicas}: "
                        f"{problem.message})")
        st.phase(Phase.RUNNING, message)
    return st.wait([])


def _hang(st: _Draft, spec: MultiTurnRLRunSpec) -> str | None:
    """Why a running trainer counts as hung (no step for progressTimeoutSeconds, counted from
    the newest of its last step and its start), or None; the run is requeued for the moment
    it would be."""
    timeout = spec.lifecycle.progress_timeout_seconds
    marks = [t for t in (st.s.progress.last_step_time, st.s.cost.running_since) if t]
    if not timeout or not marks:
        return None
    since = max(marks)
    left = timeout - (st.obs.now - since).total_seconds()
    if left > 0:
        st.deadline_in = left if st.deadline_in is None else min(st.deadline_in, left)
        return None
    step = st.s.progress.step
    return f"no step for {_duration(timeout)} since " + \
        (f"step {step}" if step else "the trainer started")


def _current_attempt(st: _Draft, spec: MultiTurnRLRunSpec,
                     attempt: int) -> TrainerObserved | Decision:
    """The current attempt's trainer as observed, or what to do while it has none."""
    obs = st.obs
    if obs.trainer is not None and obs.trainer.attempt == attempt:
        st.s.observed_attempt = max(st.s.observed_attempt, attempt)
        return obs.trainer
    if obs.trainers_exist:  # an older attempt is still there; remove it first
        return st.wait([Act.DELETE_TRAINER], requeue=1.0)
    if obs.trainer_outcome == SUCCEEDED_OUTCOME:
        # The workload is gone (a ttlSecondsAfterFinished of 0 deletes a finished
        # HyperPodPyTorchJob at once), but the trainer recorded that it finished.
        return TrainerObserved(attempt, TrainerState.SUCCEEDED,
                               "the trainer reported that training finished")
    if _launched_and_gone(st, obs, attempt):
        return TrainerObserved(attempt, TrainerState.FAILED, _vanished(spec, attempt))
    # Recorded before the create call (status is written before any action), so a workload
    # that exists once is never created a second time.
    st.s.launched_attempt = attempt
    st.cond("TrainerReady", False, "CreatingTrainer", f"attempt {attempt}")
    return st.wait([Act.ENSURE_TRAINER], requeue=2.0, attempt=attempt)


def _failed_attempt(st: _Draft, spec: MultiTurnRLRunSpec, trainer: TrainerObserved) -> Decision:
    """A new attempt while the operator owns retries and the backoff limit allows one; none
    after a configuration error or episodes that kept failing, which the next attempt would
    hit again. A trainer that was evicted or preempted resumes in a new attempt, counted as
    no failure."""
    attempt, lifecycle = trainer.attempt, spec.lifecycle
    cleanup = [Act.DELETE_TRAINER] if st.obs.trainers_exist else []
    if trainer.config_error or trainer.episodes_failed:
        reason, what = (("TrainerConfigError", "a configuration error") if trainer.config_error
                        else ("EpisodesFailed", "episodes that kept failing"))
        st.finish(False, reason, f"the trainer stopped in attempt {attempt} on {what}, not "
                                 f"retried: {trainer.message}")
        return st.done(_teardown(st.obs), requeue=0.2)
    if trainer.disrupted:
        st.s.attempts = attempt + 1
        st.cond("TrainerReady", False, "Disrupted", trainer.disrupted)
        st.events.append(Event("Warning", "TrainerDisrupted",
                               f"attempt {attempt} was stopped from outside ({trainer.disrupted});"
                               f" resuming in attempt {attempt + 1} from the latest checkpoint, "
                               "not counted as a failure"))
        return st.wait(cleanup, requeue=0.5)
    reason = "TrainerHung" if trainer.hung else "TrainerFailed"
    owner = retry_owner(spec.trainer.launcher, st.obs.namespace)
    if owner != RetryOwner.OPERATOR:
        st.finish(False, reason,
                  f"the {spec.trainer.launcher.value} failed after the retries "
                  f"{_OWNER_TEXT[owner]} makes (trainer.autoResumeMaxRetries="
                  f"{spec.trainer.auto_resume_max_retries}); the operator does not retry "
                  f"on top of them: {trainer.message}")
        return st.done(_teardown(st.obs), requeue=0.2)
    st.s.failed_attempts += 1
    if st.s.failed_attempts <= lifecycle.backoff_limit:
        st.s.attempts = attempt + 1
        st.cond("TrainerReady", False, "TrainerHung" if trainer.hung else "Retrying",
                trainer.message)
        st.events.append(Event("Warning", reason,
                               f"attempt {attempt} {'hung' if trainer.hung else 'failed'} "
                               f"({trainer.message}); starting attempt {attempt + 1} from the "
                               "latest checkpoint"))
        return st.wait(cleanup, requeue=0.5)
    st.finish(False, "BackoffLimitExceeded",
              f"the trainer failed {st.s.failed_attempts} time(s), more than backoffLimit "
              f"{lifecycle.backoff_limit}; last: {trainer.message}")
    return st.done(_teardown(st.obs), requeue=0.2)
