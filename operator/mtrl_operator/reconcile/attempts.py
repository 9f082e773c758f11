"""The trainer's part of the run's state machine: one attempt at a time, and what its
outcome means: success, proven by the current launch's own report, ends the run; a failure
starts the next attempt while the operator owns retries and the backoff limit allows, except
after a configuration error, episodes that kept failing or steps that trained nothing; an
evicted or preempted trainer resumes without counting; a trainer with no step for
progressTimeoutSeconds is a hung (failed) attempt, and one whose pod holds a node without
starting for startupTimeoutSeconds a failed one. Pure."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from mtrl_api.run import LauncherKind, MultiTurnRLRunSpec, Phase
from mtrl_operator.launchers import retry_owner
from mtrl_operator.reconcile.draft import (
    SUCCEEDED_OUTCOME,
    Act,
    Decision,
    Draft,
    Event,
    Observed,
    TrainerObserved,
    TrainerReport,
    TrainerState,
    duration,
    teardown,
)
from mtrl_operator.reconcile.retries import RetryOwner

MAX_RETRY_BACKOFF_SECONDS = 600.0  # the Job controller's MaxJobPodFailureBackOff
_OWNER_TEXT = {RetryOwner.HYPERPOD_AUTO_RESUME: "HyperPod auto-resume",
               RetryOwner.HYPERPOD_TRAINING_OPERATOR: "the HyperPod training operator"}


@dataclass(frozen=True)
class Evidence:
    """What the current launch's own report proves: that it trained (`proven`), that it played
    every step and trained nothing (`nothing_trained`), or neither, and then what is missing."""

    proven: bool = False
    nothing_trained: bool = False
    missing: str = ""


def this_launch(st: Draft) -> TrainerReport | None:
    """The trainer's report, if the current launch wrote it: it carries the launch number the
    operator gave that workload (MTRL_LAUNCH). A report of an earlier launch (the same attempt
    before a suspension, a predecessor that is gone) proves nothing about this one."""
    report = st.obs.report
    return report if report is not None and report.of_launch(st.s.trainer_launch) else None


def evidence(st: Draft, spec: MultiTurnRLRunSpec) -> Evidence:
    """Success needs the current launch's report of it: the outcome, every step played
    (grpo.maxSteps) and at least one that trained the adapter. A workload that completed, an
    exit code of 0 or a report of another launch are not evidence."""
    report, total = this_launch(st), spec.grpo.max_steps
    if report is None:
        return Evidence(missing=f"without a progress report of its launch ({st.s.trainer_launch},"
                                " MTRL_LAUNCH)")
    played = f"after {report.step} of {total} steps"
    if report.outcome != SUCCEEDED_OUTCOME:
        return Evidence(missing=f"{played} without reporting an outcome")
    if report.step < total:
        return Evidence(missing=f"reporting {SUCCEEDED_OUTCOME} {played}")
    if report.trained_steps is None:
        return Evidence(missing=f"reporting {SUCCEEDED_OUTCOME} without trainedSteps")
    return Evidence(proven=report.trained_steps > 0, nothing_trained=report.trained_steps == 0)


def _launched_and_gone(st: Draft, obs: Observed, attempt: int) -> bool:
    """The current launch's workload existed and is gone. Asked for alone is not enough: the
    operator may have stopped between recording the launch and creating it. Seen by a
    reconcile, or reported from by its trainer (a report carrying its launch number), is:
    then creating it again would run a finished or failed attempt a second time."""
    if st.s.launched_attempt < attempt:
        return False
    return st.s.observed_attempt >= attempt or this_launch(st) is not None


def _vanished(spec: MultiTurnRLRunSpec, attempt: int) -> str:
    kind = spec.trainer.launcher.value
    ttl = (" (a HyperPodPyTorchJob is deleted by its runPolicy.ttlSecondsAfterFinished)"
           if spec.trainer.launcher == LauncherKind.HYPERPOD_PYTORCH_JOB else "")
    return (f"the {kind} of attempt {attempt} was deleted before the operator saw its "
            f"outcome{ttl}, and its trainer reported no success: counted as a failed attempt")


def under_way(st: Draft) -> bool:
    """The current attempt's trainer was created: it exists, or was seen or reported from, so
    its outcome is read whatever the workers do. Recorded alone is not enough: a launch cut
    short before its create call waits for `minReplicas` workers like any other, since
    the workers may have gone while the operator was away."""
    return st.obs.trainers_exist or _launched_and_gone(st, st.obs, st.s.attempts)


def trainer_finished(st: Draft, spec: MultiTurnRLRunSpec) -> bool:
    """The current launch's trainer finished: its report says so, or its workload does (which
    is then judged by the report)."""
    trainer, proof = st.obs.trainer, evidence(st, spec)
    return proof.proven or proof.nothing_trained or (
        trainer is not None and trainer.attempt == st.s.attempts
        and trainer.state == TrainerState.SUCCEEDED)


def trainer(st: Draft, spec: MultiTurnRLRunSpec) -> Decision:
    """One attempt at a time; its outcome ends the run or starts the next attempt. The run
    succeeds on the current launch's own evidence alone, whatever its workload says: a
    workload that completed without it is a failed attempt that names what is missing, and
    one that failed after its trainer proved success (a crash on the way out) ends the run
    Succeeded."""
    attempt = st.s.attempts
    trainer = _current_attempt(st, spec, attempt)
    if isinstance(trainer, Decision):
        return trainer
    proof = evidence(st, spec)
    if proof.proven or proof.nothing_trained:
        return _trained(st, spec, attempt, proof)
    if trainer.state == TrainerState.SUCCEEDED:
        trainer = replace(trainer, state=TrainerState.FAILED,
                          message=f"the trainer exited 0 {proof.missing}")
    _clock(st, trainer)
    if (never := _never_started(st, spec, trainer)) is not None:
        trainer = replace(trainer, state=TrainerState.FAILED, message=never, never_started=True)
    if trainer.state == TrainerState.RUNNING and (hung := _hang(st, spec)) is not None:
        trainer = replace(trainer, state=TrainerState.FAILED, message=hung, hung=True)
    if trainer.state == TrainerState.FAILED:
        return _failed_attempt(st, spec, trainer)
    running = trainer.state == TrainerState.RUNNING
    if trainer.held and not any(c.type == "TrainerReady" and c.reason == "AwaitingAdmission"
                                for c in st.s.conditions):
        # Queued at creation, or evicted (preempted) while it ran: said once, as it happens.
        st.events.append(Event("Warning" if st.s.phase == Phase.RUNNING else "Normal",
                               "TrainerQueued", f"attempt {attempt}: {trainer.message}"))
    st.cond("TrainerReady", running, "Unschedulable" if trainer.unschedulable else
            "AwaitingAdmission" if trainer.held else
            "ContainerCannotStart" if trainer.waiting else trainer.state.value, trainer.message)
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


def _trained(st: Draft, spec: MultiTurnRLRunSpec, attempt: int, proof: Evidence) -> Decision:
    """The current launch reported its outcome with every step played: Succeeded if a step
    trained the adapter, else Failed (NothingTrained, not retried: another attempt would play
    the same tasks to the same end)."""
    report = this_launch(st)
    assert report is not None
    total = spec.grpo.max_steps
    if proof.proven:
        st.cond("TrainerReady", False, "TrainerSucceeded",
                "the trainer reported that training finished")
        st.finish(True, "TrainingComplete",
                  f"trained {total} steps ({report.trained_steps} updated the adapter) in "
                  f"{attempt} attempt(s)")
    else:
        st.finish(False, "NothingTrained",
                  f"the trainer played all {total} steps and no step updated the adapter: every "
                  "group's rewards were equal or lost an episode, so GRPO had nothing to learn "
                  "from (status.progress.zeroVarianceFraction, failedEpisodeFraction)")
    return st.done(teardown(st.obs), requeue=0.2)


def _clock(st: Draft, trainer: TrainerObserved) -> None:
    """When the current launch's pods were first seen holding a node, and running."""
    running = trainer.state in (TrainerState.RUNNING, TrainerState.RESTARTING)
    if (trainer.bound or running) and st.s.trainer_bound_time is None:
        st.s.trainer_bound_time = st.obs.now
    if running and st.s.trainer_running_time is None:
        st.s.trainer_running_time = st.obs.now


def _never_started(st: Draft, spec: MultiTurnRLRunSpec, trainer: TrainerObserved) -> str | None:
    """Why a trainer whose pod holds a node but never ran counts as a failed attempt
    (lifecycle.startupTimeoutSeconds after it was bound), or None; the run is requeued for
    the moment it would."""
    limit, since = spec.lifecycle.startup_timeout_seconds, st.s.trainer_bound_time
    if (not limit or since is None or st.s.trainer_running_time is not None
            or trainer.state != TrainerState.PENDING):
        return None
    left = limit - (st.obs.now - since).total_seconds()
    if left > 0:
        st.deadline_in = left if st.deadline_in is None else min(st.deadline_in, left)
        return None
    said = trainer.waiting or trainer.message or "the kubelet gave no reason"
    return (f"its pod was bound to a node {duration(limit)} ago and never started "
            f"(spec.lifecycle.startupTimeoutSeconds): {said}")


def _hang(st: Draft, spec: MultiTurnRLRunSpec) -> str | None:
    """Why a running trainer counts as hung (no step for progressTimeoutSeconds, counted from
    the newest of its last step and its start), or None; the run is requeued for the moment
    it would be."""
    timeout = spec.lifecycle.progress_timeout_seconds
    marks = [t for t in (st.s.progress.last_step_time, st.s.trainer_running_time) if t]
    if not timeout or not marks:
        return None
    since = max(marks)
    left = timeout - (st.obs.now - since).total_seconds()
    if left > 0:
        st.deadline_in = left if st.deadline_in is None else min(st.deadline_in, left)
        return None
    step = st.s.progress.step
    return f"no step for {duration(timeout)} since " + \
        (f"step {step}" if step else "the trainer started")


def _current_attempt(st: Draft, spec: MultiTurnRLRunSpec,
                     attempt: int) -> TrainerObserved | Decision:
    """The current attempt's trainer as observed, or what to do while it has none."""
    obs = st.obs
    if obs.trainer is not None and obs.trainer.attempt == attempt:
        st.s.observed_attempt = max(st.s.observed_attempt, attempt)
        return obs.trainer
    if obs.trainers_exist:  # an older attempt is still there; remove it first
        st.s.message = f"removing the trainer of an earlier attempt before attempt {attempt}"
        return st.wait([Act.DELETE_TRAINER], requeue=1.0)
    proof = evidence(st, spec)
    if proof.proven or proof.nothing_trained:
        # The workload is gone (a ttlSecondsAfterFinished of 0 deletes a finished
        # HyperPodPyTorchJob at once), but its trainer recorded that it finished.
        return TrainerObserved(attempt, TrainerState.SUCCEEDED,
                               "the trainer reported that training finished")
    if _launched_and_gone(st, obs, attempt):
        return TrainerObserved(attempt, TrainerState.FAILED, _vanished(spec, attempt))
    if (wait := _backing_off(st, attempt)) is not None:
        return wait
    # Recorded before the create call (status is written before any action), so a workload
    # that exists once is never created a second time; a new launch gets a new number, which
    # the trainer echoes, so no report of an earlier one stands for it.
    if st.s.launched_attempt < attempt:
        st.s.launched_attempt = attempt
        st.s.trainer_launch += 1
        st.s.trainer_bound_time = st.s.trainer_running_time = None
    st.cond("TrainerReady", False, "CreatingTrainer", f"attempt {attempt}")
    return st.wait([Act.ENSURE_TRAINER], requeue=2.0, attempt=attempt)


def retry_backoff(base: float, failed_attempts: int) -> float:
    """Seconds between a failed attempt and the next: `base` after the first failure, doubled
    for each one after it, at most 10 minutes (kubernetes pkg/controller/job: 10 s doubling up
    to MaxJobPodFailureBackOff)."""
    return min(base * 2 ** max(failed_attempts - 1, 0), MAX_RETRY_BACKOFF_SECONDS)


def _backing_off(st: Draft, attempt: int) -> Decision | None:
    """Wait, saying so, while a failed attempt's backoff lasts."""
    due = st.s.next_attempt_time
    if due is None or st.obs.now >= due:
        return None
    left = (due - st.obs.now).total_seconds()
    why = (f"backing off {duration(left)} before attempt {attempt} after "
           f"{st.s.failed_attempts} failed attempt(s)")
    st.cond("TrainerReady", False, "BackingOff", why)
    st.s.message = f"waiting for the trainer: {why}"
    return st.wait([], requeue=left)


def _failed_attempt(st: Draft, spec: MultiTurnRLRunSpec, trainer: TrainerObserved) -> Decision:
    """A new attempt while the operator owns retries and the backoff limit allows one; none
    after a configuration error, episodes that kept failing or a training that diverged, which
    the next attempt would hit again. A trainer that was evicted or preempted resumes in a new
    attempt, counted as no failure."""
    attempt, lifecycle = trainer.attempt, spec.lifecycle
    cleanup = [Act.DELETE_TRAINER] if st.obs.trainers_exist else []
    if trainer.config_error or trainer.episodes_failed or trainer.diverged \
            or trainer.nothing_trained:
        reason, what = (("TrainerConfigError", "a configuration error") if trainer.config_error
                        else ("NothingTrained", "steps that trained nothing")
                        if trainer.nothing_trained
                        else ("EpisodesFailed", "episodes that kept failing")
                        if trainer.episodes_failed
                        else ("TrainingDiverged", "a gradient that was not finite"))
        st.finish(False, reason, f"the trainer stopped in attempt {attempt} on {what}, not "
                                 f"retried: {trainer.message}")
        return st.done(teardown(st.obs), requeue=0.2)
    if trainer.disrupted:
        st.s.attempts = attempt + 1
        st.cond("TrainerReady", False, "Disrupted", trainer.disrupted)
        st.events.append(Event("Warning", "TrainerDisrupted",
                               f"attempt {attempt} was stopped from outside ({trainer.disrupted});"
                               f" resuming in attempt {attempt + 1} from the latest checkpoint, "
                               "not counted as a failure"))
        return st.wait(cleanup, requeue=0.5)
    reason = ("TrainerHung" if trainer.hung else "TrainerStartTimeout" if trainer.never_started
              else "TrainerFailed")
    owner = retry_owner(spec.trainer, st.obs.namespace)
    if owner != RetryOwner.OPERATOR:
        st.finish(False, reason,
                  f"the {spec.trainer.launcher.value} failed after the retries "
                  f"{_OWNER_TEXT[owner]} makes (trainer.autoResumeMaxRetries="
                  f"{spec.trainer.auto_resume_max_retries}); the operator does not retry "
                  f"on top of them: {trainer.message}")
        return st.done(teardown(st.obs), requeue=0.2)
    st.s.failed_attempts += 1
    if st.s.failed_attempts <= lifecycle.backoff_limit:
        st.s.attempts = attempt + 1
        st.s.next_attempt_time = st.obs.now + dt.timedelta(
            seconds=retry_backoff(st.obs.retry_backoff_seconds, st.s.failed_attempts))
        st.cond("TrainerReady", False, reason if reason != "TrainerFailed" else "Retrying",
                trainer.message)
        st.events.append(Event("Warning", reason,
                               f"attempt {attempt} {'hung' if trainer.hung else 'failed'} "
                               f"({trainer.message}); starting attempt {attempt + 1} from the "
                               "latest checkpoint"))
        return st.wait(cleanup, requeue=0.5)
    st.finish(False, "BackoffLimitExceeded",
              f"the trainer failed {st.s.failed_attempts} time(s), more than backoffLimit "
              f"{lifecycle.backoff_limit}; last: {trainer.message}")
    return st.done(teardown(st.obs), requeue=0.2)
