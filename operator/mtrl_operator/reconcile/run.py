"""The run's state machine, as one pure function: observed state in, actions and status out.

Nothing here talks to a server. `decide` is called on every event and every resync; it must
give the same answer for the same observation (level-triggered), so a crash between any two
actions is repaired by calling it again.

Order is cost order: queues, then workers, then the GPU trainer only once workers are ready;
on the way out the trainer goes first, then workers, then queues.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from mtrl_api.run import (
    VALIDATION_HISTORY,
    MultiTurnRLRunSpec,
    MultiTurnRLRunStatus,
    Phase,
    Progress,
    ValidationPoint,
    WorkersStatus,
)
from mtrl_operator.naming import ANNOTATION_FORCE_RELEASE
from mtrl_operator.reconcile.attempts import trainer, trainer_finished, under_way
from mtrl_operator.reconcile.cost import budget, metered, steady
from mtrl_operator.reconcile.draft import (  # the state machine's vocabulary, from here too
    CONDITION_TYPES,
    SUCCEEDED_OUTCOME,
    Act,
    Decision,
    Draft,
    Event,
    Observed,
    TrainerObserved,
    TrainerState,
    set_condition,
    teardown,
)
from mtrl_operator.reconcile.workers import plan_workers

__all__ = ["CONDITION_TYPES", "SUCCEEDED_OUTCOME", "Act", "Decision", "Event", "Observed",
           "TrainerObserved", "TrainerState", "decide", "set_condition", "stalled"]


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
        out.validation_greedy_success_rate = previous.validation_greedy_success_rate
        out.validation_history = previous.validation_history
    else:
        out.validation_step = reported.step
        out.validation_history = [*history, ValidationPoint(
            step=reported.step, success_rate=reported.validation_success_rate,
            pass_at_k=reported.validation_pass_at_k,
            greedy_success_rate=reported.validation_greedy_success_rate)][-VALIDATION_HISTORY:]
    return out


def _merge_observations(st: Draft, obs: Observed) -> None:
    refs = obs.resources
    st.s.resources = refs
    if st.s.start_time is None or st.s.cost.price is None:
        # The price the run starts with is the one it is metered and budgeted at to the end:
        # a helm upgrade that changes `pricing` applies to new runs.
        st.s.cost.price = obs.price
    if obs.spec is not None:
        trainer = obs.trainer
        holding = trainer is not None and trainer.attempt == st.s.attempts and (
            trainer.bound or trainer.state in (TrainerState.RUNNING, TrainerState.RESTARTING))
        st.s.cost = metered(st.s.cost, obs.spec, holding, st.s.cost.price, obs.now)
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


def _reward_collapse(st: Draft, obs: Observed, previous: Progress) -> None:
    spec = obs.spec
    progress = st.s.progress
    if spec is None or progress.zero_variance_fraction is None or progress.step == previous.step:
        return
    collapse = spec.reward.collapse
    above = progress.zero_variance_fraction >= collapse.zero_variance_threshold
    streak = (previous.collapse_streak + 1) if above else 0
    progress.collapse_streak = streak
    st.alarm("RewardCollapse", streak >= collapse.window_steps, "ZeroVarianceGroups",
             "RewardsVary",
             f"{progress.zero_variance_fraction:.0%} of groups had equal rewards for {streak} "
             f"consecutive steps (threshold {collapse.zero_variance_threshold:.0%}, window "
             f"{collapse.window_steps}); GRPO gets no signal from them")


def _episodes_failing(st: Draft, obs: Observed, previous: Progress) -> None:
    """A reported step that lost more than rollout.maxFailedEpisodeFraction of its episodes
    is named, in the environment's words, until a step does not."""
    spec, progress = obs.spec, st.s.progress
    if spec is None or progress.failed_episode_fraction is None or progress.step == previous.step:
        return
    limit = spec.rollout.max_failed_episode_fraction
    st.alarm("EpisodesFailing", progress.failed_episode_fraction > limit, "EpisodeErrors",
             "EpisodesSucceed",
             f"{progress.failed_episode_fraction:.0%} of the episodes of step {progress.step} "
             f"failed (more than spec.rollout.maxFailedEpisodeFraction {limit:g}): "
             f"{progress.episode_error or 'no error given'}")


def decide(obs: Observed) -> Decision:
    """The whole state machine: each concern below either decides or passes the run on, in
    the order a reader would ask (is it going away, can it run at all, is it over, ...)."""
    st = Draft(obs)
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


# What a teardown's progress changes: which pieces are left, how many workers run.
TEARDOWN_PROGRESS = frozenset({"resources", "workers"})


def is_news(shown: MultiTurnRLRunStatus, decision: Decision) -> bool:
    """Whether the decided status is worth a write over the one the run shows. The cost
    meter's moving totals are not (they ride along, or go alone now and then: `refresh_due`),
    nor is a teardown's progress: while a finished or deleted run's pieces go one by one, its
    status is written again when none is left to delete, not for each. Every status write of
    a run costs the API server a whole-object validation (about 20 ms of its CPU here); a run
    once took four writes to tear down, three of them only to cross off what went. A teardown
    that stalls still says so at once: its message and conditions change."""
    new, old = steady(decision.status).wire(), steady(shown).wire()
    if new == old:
        return False
    phase = decision.status.phase
    tearing_down = phase == shown.phase and (phase.finished or phase == Phase.TERMINATING) \
        and bool(decision.actions)
    if not tearing_down:
        return True
    return any(new.get(k) != old.get(k) for k in new.keys() | old.keys()
               if k not in TEARDOWN_PROGRESS)


def _deletion(st: Draft) -> Decision | None:
    """Deleting: everything goes, in cost order, then the finalizer."""
    if not st.obs.deleting:
        return None
    st.phase(Phase.TERMINATING, "deleting the run's resources")
    # The workers' logs outlive a finished run (that is when they are read), not the run.
    actions = teardown(st.obs) or ([Act.DELETE_LOGS] if st.obs.logs_exist else [])
    return st.done(actions or [Act.REMOVE_FINALIZER], requeue=1.0 if actions else None)


def _invalid_spec(st: Draft) -> Decision | None:
    """A spec the schema accepted but that cannot run: Failed with its reason, nothing kept."""
    if st.obs.spec_error is None or st.s.phase.finished:
        return None
    reason, message = st.obs.spec_error
    st.cond("Preflight", False, reason, message)
    st.finish(False, reason, message)
    return st.done(teardown(st.obs), requeue=1.0)


def _finished(st: Draft) -> Decision | None:
    """Finished (or unreadable): tear down what is left, then wait for the TTL."""
    spec = st.obs.spec
    if not st.s.phase.finished and spec is not None:
        return None
    actions = teardown(st.obs)
    if actions:
        return st.done(actions, requeue=1.0)
    ttl = spec.lifecycle.ttl_seconds_after_finished if spec else None
    if ttl is None or st.s.completion_time is None:
        return st.done([])
    expires = st.s.completion_time + dt.timedelta(seconds=ttl)
    if st.obs.now >= expires:
        return st.done([Act.DELETE_RUN])
    return st.done([], requeue=(expires - st.obs.now).total_seconds())


def _start_and_deadline(st: Draft, spec: MultiTurnRLRunSpec) -> Decision | None:
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
    over_budget, spent_in = budget(st.s.cost, spec, st.s.cost.price, st.obs.now)
    if over_budget:
        st.finish(False, "BudgetExceeded", over_budget)
        return st.done(teardown(st.obs), requeue=1.0)
    st.deadline_in = spent_in
    limit = spec.lifecycle.active_deadline_seconds
    if limit is None:
        return None
    deadline = st.s.start_time + dt.timedelta(seconds=limit)
    if st.obs.now >= deadline:
        st.finish(False, "DeadlineExceeded", f"the run was active longer than {limit}s")
        return st.done(teardown(st.obs), requeue=1.0)
    until = (deadline - st.obs.now).total_seconds()
    st.deadline_in = until if spent_in is None else min(until, spent_in)
    return None


def _suspension(st: Draft, spec: MultiTurnRLRunSpec) -> Decision | None:
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


def _forget_the_stopped_attempt(st: Draft) -> None:
    """The operator deleted the trainer itself: resuming creates the same attempt again, and
    the workers' clocks and words start again."""
    st.s.launched_attempt = min(st.s.launched_attempt, st.s.attempts - 1)
    st.s.observed_attempt = min(st.s.observed_attempt, st.s.attempts - 1)
    st.s.workers = WorkersStatus()


def _queues(st: Draft) -> Decision | None:
    ready = st.obs.queues_ready
    st.cond("QueuesReady", ready, "QueuesCreated" if ready else "CreatingQueues",
            "" if ready else "creating SQS queues")
    if ready:
        return None
    return st.wait([Act.ENSURE_QUEUES], requeue=0.1)  # CreateQueue returns once it exists


def _workers_then_trainer(st: Draft, spec: MultiTurnRLRunSpec) -> Decision:
    """The workers' actions, then the trainer's: a trainer asked for (or still there) is
    looked at whatever the workers do, so its outcome always ends the run."""
    plan = plan_workers(st, spec)
    if plan.expired and not trainer_finished(st, spec):  # a trainer that finished ends the run
        st.finish(False, "WorkersUnavailable", plan.expired)
        return st.done(teardown(st.obs), requeue=1.0)
    if not plan.enough and not under_way(st):
        problem = st.s.workers.problem
        st.s.message = (f"waiting for workers: {st.obs.workers_ready}/"
                        f"{spec.workers.max_replicas} ready (minimum "
                        f"{spec.workers.min_replicas})"
                        + (f": {problem.message}" if problem else ""))
        return st.wait(plan.actions, requeue=plan.requeue)
    decided = trainer(st, spec)
    if decided.status.phase.finished:
        return decided
    requeues = [r for r in (plan.requeue, decided.requeue_after) if r is not None]
    return replace(decided, actions=[*plan.actions, *decided.actions],
                   requeue_after=min(requeues) if requeues else None)
