"""The state machine as a pure function: observation in, actions and status out."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from mtrl_api.run import (
    LauncherKind,
    MultiTurnRLRunSpec,
    MultiTurnRLRunStatus,
    PassAtK,
    Phase,
    Progress,
    QueueRef,
    ResourceRefs,
)
from mtrl_operator.reconcile import lookups
from mtrl_operator.reconcile.cost import steady
from mtrl_operator.reconcile.draft import TrainerReport
from mtrl_operator.reconcile.run import (
    Act,
    Observed,
    TrainerObserved,
    TrainerState,
    decide,
    is_news,
    stalled,
)

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
SPEC = MultiTurnRLRunSpec.model_validate({
    "model": {"name": "m"}, "rollout": {"environment": "wordle"},
    "dataset": {"inline": {"train": [{"secret": "crane"}]}}, "output": {"s3Uri": "s3://bucket/out"},
    "workers": {"minReplicas": 2, "maxReplicas": 4},
    "lifecycle": {"backoffLimit": 1, "activeDeadlineSeconds": 3600,
                  "ttlSecondsAfterFinished": 60},
    "reward": {"collapse": {"windowSteps": 2, "zeroVarianceThreshold": 0.9}},
})


def observed(**kw: object) -> Observed:
    base = Observed(now=NOW, generation=1, deleting=False, spec=SPEC, spec_error=None,
                    status=MultiTurnRLRunStatus())
    return replace(base, **kw)


def started(**kw: object) -> MultiTurnRLRunStatus:
    """A run past its first look; a launched attempt is its own launch unless told."""
    kw.setdefault("trainer_launch", kw.get("launched_attempt", 0))
    return MultiTurnRLRunStatus(phase=Phase.PROVISIONING, start_time=NOW, attempts=1, **kw)


def proof(launch: int = 1, step: int | None = None, trained: int | None = 2,
          outcome: str | None = "Succeeded") -> TrainerReport:
    """The trainer's report of success as launch `launch` writes it: every step played."""
    total = SPEC.grpo.max_steps
    return TrainerReport(launch=launch, attempt=1, outcome=outcome,
                         step=total if step is None else step, total_steps=total,
                         trained_steps=trained)


def ready(**kw: object) -> Observed:
    """Queues and workers ready: the trainer's turn."""
    base = {"status": started(), "queues_ready": True, "queues_exist": True,
            "workers_exist": True, "workers_desired": 4, "workers_ready": 2}
    return observed(**{**base, **kw})


def cond(status: MultiTurnRLRunStatus, type_: str) -> str:
    return next(c.status for c in status.conditions if c.type == type_)


def test_a_new_run_starts_with_queues_and_records_its_start() -> None:
    d = decide(observed())
    assert d.actions == [Act.ENSURE_QUEUES]
    assert d.status.phase == Phase.PROVISIONING and d.status.start_time == NOW
    assert d.status.attempts == 1
    assert [e.reason for e in d.events] == ["Provisioning"]


def test_workers_come_after_queues_and_the_trainer_waits_for_min_workers() -> None:
    d = decide(observed(status=started(), queues_ready=True, queues_exist=True))
    assert d.actions == [Act.ENSURE_WORKERS]
    d = decide(replace(ready(), workers_ready=1))
    assert d.actions == [] and cond(d.status, "WorkersReady") == "False"
    d = decide(ready())
    assert d.actions == [Act.ENSURE_TRAINER] and d.attempt == 1


def test_running_then_success_tears_down_gpus_first() -> None:
    running = ready(status=started(launched_attempt=1),
                    trainer=TrainerObserved(1, TrainerState.RUNNING), trainers_exist=True)
    d = decide(running)
    assert d.status.phase == Phase.RUNNING and d.actions == []
    done = replace(running, status=d.status, report=proof(),
                   trainer=TrainerObserved(1, TrainerState.SUCCEEDED))
    d = decide(done)
    assert d.status.phase == Phase.SUCCEEDED and d.status.completion_time == NOW
    assert d.actions == [Act.DELETE_TRAINER]
    d = decide(replace(done, status=d.status, trainer=None, trainers_exist=False))
    assert d.actions == [Act.DELETE_WORKERS]
    d = decide(replace(done, status=d.status, trainer=None, trainers_exist=False,
                       workers_exist=False))
    assert d.actions == [Act.DELETE_QUEUES]


def test_a_teardown_is_written_when_it_ends_not_for_each_piece_that_goes() -> None:
    refs = ResourceRefs(queues=[QueueRef(role="rollout", url="https://sqs/q")],
                        task_definition_arn="arn:td", task_arns=["arn:t1", "arn:t2"],
                        trainer_kind="PyTorchJob")
    running = ready(status=started(launched_attempt=1),
                    trainer=TrainerObserved(1, TrainerState.RUNNING), trainers_exist=True,
                    resources=refs)
    shown = decide(running).status
    done = replace(running, status=shown, report=proof(),
                   trainer=TrainerObserved(1, TrainerState.SUCCEEDED))
    d = decide(done)
    assert d.status.phase == Phase.SUCCEEDED and is_news(shown, d)
    shown = d.status
    # The trainer went, then the workers: the status would only cross them off.
    for left in (refs.model_copy(update={"trainer_kind": None}),
                 refs.model_copy(update={"trainer_kind": None, "task_arns": [],
                                         "task_definition_arn": None})):
        d = decide(replace(done, status=shown, trainer=None, trainers_exist=False,
                           workers_ready=0, workers_exist=bool(left.task_arns),
                           resources=left))
        assert d.actions and d.status.resources != shown.resources
        assert not is_news(shown, d)
    # Nothing left: written, and a finished run with nothing recorded asks AWS nothing more.
    d = decide(replace(done, status=shown, trainer=None, trainers_exist=False, workers_ready=0,
                       workers_exist=False, queues_exist=False, queues_ready=False,
                       resources=ResourceRefs()))
    assert d.actions == [] and is_news(shown, d)
    assert d.status.resources == ResourceRefs() and d.status.workers.ready == 0
    assert not lookups.needs_aws(d.status, deleting=False)


def test_a_teardown_that_stalls_or_a_deletion_that_begins_is_written_at_once() -> None:
    refs = ResourceRefs(task_arns=["arn:t1"])
    running = ready(trainer=TrainerObserved(1, TrainerState.RUNNING), trainers_exist=True,
                    resources=refs)
    shown = decide(running).status
    d = decide(replace(running, status=shown, deleting=True))
    assert d.status.phase == Phase.TERMINATING and is_news(shown, d)
    shown = d.status
    gone = replace(running, status=shown, deleting=True, trainer=None, trainers_exist=False)
    d = decide(gone)
    assert d.status.cost.running_since is None and is_news(shown, d), "the GPU meter stopped"
    shown = d.status
    d = decide(replace(gone, status=shown, resources=ResourceRefs()))
    assert d.actions and not is_news(shown, d)
    stuck = replace(d, status=d.status.model_copy(update={"message": "StopTask: throttled"}))
    assert is_news(shown, stuck)


def test_ttl_deletes_the_run_after_it_finishes() -> None:
    finished = MultiTurnRLRunStatus(phase=Phase.SUCCEEDED, completion_time=NOW)
    d = decide(observed(status=finished, now=NOW + dt.timedelta(seconds=30)))
    assert d.actions == [] and d.requeue_after == 30
    d = decide(observed(status=finished, now=NOW + dt.timedelta(seconds=61)))
    assert d.actions == [Act.DELETE_RUN]


def test_failure_retries_as_a_new_attempt_then_fails_at_the_backoff_limit() -> None:
    failed = ready(trainer=TrainerObserved(1, TrainerState.FAILED, "OOM"), trainers_exist=True)
    d = decide(failed)
    assert d.status.attempts == 2 and d.actions == [Act.DELETE_TRAINER]
    assert "TrainerFailed" in [e.reason for e in d.events]
    later = NOW + dt.timedelta(seconds=10)  # the backoff after one failed attempt
    d = decide(replace(failed, status=d.status, trainer=None, trainers_exist=False, now=later))
    assert d.actions == [Act.ENSURE_TRAINER] and d.attempt == 2
    d = decide(replace(failed, status=d.status, now=later,
                       trainer=TrainerObserved(2, TrainerState.FAILED, "OOM again")))
    assert d.status.phase == Phase.FAILED
    assert next(c for c in d.status.conditions if c.type == "Failed").reason == \
        "BackoffLimitExceeded"


def test_attempts_back_off_10s_doubling_as_the_job_controller_does() -> None:
    """A trainer that fails at once does not spend every attempt within seconds: the next
    attempt waits 10 s after the first failure, 20 s after the second, and says so."""
    spec = SPEC.model_copy(deep=True)
    spec.lifecycle.backoff_limit = 3
    status = started()
    for failures, wait in ((1, 10), (2, 20), (3, 40)):
        attempt = failures
        d = decide(ready(spec=spec, status=status, trainers_exist=True,
                         trainer=TrainerObserved(attempt, TrainerState.FAILED, "exit 1")))
        assert d.status.attempts == attempt + 1
        assert d.status.next_attempt_time == NOW + dt.timedelta(seconds=wait)
        early = decide(ready(spec=spec, status=d.status, now=NOW + dt.timedelta(seconds=wait - 1)))
        assert early.actions == [] and early.requeue_after == 1.0, early
        assert "backing off 1s before attempt" in early.status.message, early.status.message
        assert next(c for c in early.status.conditions if c.type == "TrainerReady").reason == \
            "BackingOff"
        due = decide(ready(spec=spec, status=d.status, now=NOW + dt.timedelta(seconds=wait)))
        assert due.actions == [Act.ENSURE_TRAINER] and due.attempt == attempt + 1
        status = due.status


def test_the_backoff_stops_doubling_at_10_minutes() -> None:
    from mtrl_operator.reconcile.attempts import retry_backoff
    assert [retry_backoff(10, n) for n in (1, 2, 3, 6, 7, 20)] == [10, 20, 40, 320, 600, 600]


def test_a_configuration_error_fails_the_run_without_another_attempt() -> None:
    failed = ready(trainer=TrainerObserved(
        1, TrainerState.FAILED, "configuration error: spec.output.resumeFrom: no committed "
        "checkpoint under s3://b/x (exit code 2)", config_error=True), trainers_exist=True)
    d = decide(failed)
    assert d.status.phase == Phase.FAILED and d.status.attempts == 1
    assert Act.ENSURE_TRAINER not in d.actions and Act.DELETE_TRAINER in d.actions
    assert next(c for c in d.status.conditions if c.type == "Failed").reason == \
        "TrainerConfigError"
    assert d.status.message == (
        "the trainer stopped in attempt 1 on a configuration error, not retried: configuration "
        "error: spec.output.resumeFrom: no committed checkpoint under s3://b/x (exit code 2)")


def test_deadline_fails_and_tears_down() -> None:
    late = ready(now=NOW + dt.timedelta(seconds=3601), trainers_exist=True,
                 trainer=TrainerObserved(1, TrainerState.RUNNING))
    d = decide(late)
    assert d.status.phase == Phase.FAILED and d.actions == [Act.DELETE_TRAINER]
    assert next(c for c in d.status.conditions if c.type == "Failed").reason == \
        "DeadlineExceeded"


def test_suspend_removes_compute_but_keeps_queues() -> None:
    spec = SPEC.model_copy(deep=True)
    spec.lifecycle.suspend = True
    d = decide(ready(spec=spec, trainers_exist=True,
                     trainer=TrainerObserved(1, TrainerState.RUNNING)))
    assert d.actions == [Act.DELETE_TRAINER]
    d = decide(ready(spec=spec, workers_exist=False))
    assert d.actions == [] and d.status.phase == Phase.SUSPENDED


def test_deletion_removes_everything_then_the_finalizer() -> None:
    d = decide(ready(deleting=True, trainers_exist=True))
    assert d.actions == [Act.DELETE_TRAINER] and d.status.phase == Phase.TERMINATING
    d = decide(observed(deleting=True))
    assert d.actions == [Act.REMOVE_FINALIZER]


def test_spec_problem_fails_the_run_with_its_reason() -> None:
    d = decide(observed(spec_error=("UnknownEnvironment", "no such environment")))
    assert d.status.phase == Phase.FAILED and d.status.message == "no such environment"


def test_reward_collapse_needs_the_whole_window() -> None:
    obs = ready(trainer=TrainerObserved(1, TrainerState.RUNNING), trainers_exist=True)
    status = obs.status
    raised = []
    for step, zero_var in enumerate([0.95, 0.5, 0.95, 0.95], start=1):
        d = decide(replace(obs, status=status,
                           progress=Progress(step=step, zero_variance_fraction=zero_var)))
        status = d.status
        raised.append(cond(status, "RewardCollapse"))
        events = [e.reason for e in d.events]
        assert ("RewardCollapse" in events) == (step == 4)
    assert raised == ["False", "False", "False", "True"]


def test_conditions_keep_their_transition_time_when_unchanged() -> None:
    d1 = decide(ready(trainer=TrainerObserved(1, TrainerState.RUNNING), trainers_exist=True))
    later = ready(trainer=TrainerObserved(1, TrainerState.RUNNING), trainers_exist=True,
                  now=NOW + dt.timedelta(minutes=5))
    d2 = decide(replace(later, status=d1.status))
    t1 = {c.type: c.last_transition_time for c in d1.status.conditions}
    t2 = {c.type: c.last_transition_time for c in d2.status.conditions}
    assert t1 == t2
    # The cost meter moved, and rides along with the next write, but causes none.
    assert d2.status.cost.gpu_hours > d1.status.cost.gpu_hours
    assert steady(d2.status) == steady(d1.status), "no change observed, no status write"


# --------------------------------------------------------------------------- vanished workloads


def hyperpod_spec(**trainer: object) -> MultiTurnRLRunSpec:
    spec = SPEC.model_copy(deep=True)
    spec.trainer.launcher = LauncherKind.HYPERPOD_PYTORCH_JOB
    for key, value in trainer.items():
        setattr(spec.trainer, key, value)
    return spec


def test_the_attempt_is_recorded_before_its_workload_is_created() -> None:
    d = decide(ready())
    assert d.actions == [Act.ENSURE_TRAINER] and d.status.launched_attempt == 1
    d = decide(ready(status=d.status, trainer=TrainerObserved(1, TrainerState.PENDING),
                     trainers_exist=True))
    assert d.status.observed_attempt == 1 and d.actions == []


def test_a_workload_deleted_after_success_was_reported_ends_the_run_succeeded() -> None:
    """HyperPod's ttlSecondsAfterFinished 0 deleted the job before its Completed was seen;
    the trainer's outcome in the progress ConfigMap says how it ended."""
    seen = started(launched_attempt=1, observed_attempt=1)
    spec = hyperpod_spec()
    d = decide(ready(spec=spec, status=seen, progress=Progress(step=100),
                     report=replace(proof(), step=spec.grpo.max_steps)))
    assert Act.ENSURE_TRAINER not in d.actions
    assert d.status.phase == Phase.SUCCEEDED and d.status.attempts == 1
    assert d.actions == [Act.DELETE_WORKERS]
    # Even a workload never observed: its trainer said it finished.
    d = decide(ready(status=started(launched_attempt=1), report=proof()))
    assert d.status.phase == Phase.SUCCEEDED and Act.ENSURE_TRAINER not in d.actions


def test_a_vanished_workload_without_success_is_a_failed_attempt_never_created_again() -> None:
    seen = started(launched_attempt=1, observed_attempt=1)
    d = decide(ready(status=seen))  # launcher Job: the operator owns retries
    assert Act.ENSURE_TRAINER not in d.actions
    assert d.status.attempts == 2 and d.actions == []
    [event] = [e for e in d.events if e.reason == "TrainerFailed"]
    assert "was deleted before the operator saw its outcome" in event.message
    d = decide(ready(status=d.status, now=d.status.next_attempt_time))  # after its backoff
    assert d.actions == [Act.ENSURE_TRAINER] and d.attempt == 2
    assert d.status.launched_attempt == 2
    # Reported from by its trainer, though never observed by a reconcile: it ran.
    d = decide(ready(status=started(launched_attempt=1), report=proof(outcome=None, step=3)))
    assert d.status.attempts == 2 and Act.ENSURE_TRAINER not in d.actions


def test_vanished_attempts_count_against_the_backoff_limit() -> None:
    last = started(launched_attempt=2, observed_attempt=2)
    last.attempts, last.failed_attempts = 2, 1  # backoffLimit 1: a second failure is too many
    d = decide(ready(status=last))
    assert d.status.phase == Phase.FAILED
    assert next(c for c in d.status.conditions if c.type == "Failed").reason == \
        "BackoffLimitExceeded"


def test_a_launch_interrupted_before_the_create_is_created_after_all() -> None:
    """The status said "launched" but the operator stopped before the create call: nothing
    was seen and no trainer reported, so no training ran; creating it is no repeat."""
    d = decide(ready(status=started(launched_attempt=1)))
    assert d.actions == [Act.ENSURE_TRAINER] and d.attempt == 1 and d.status.attempts == 1


def test_a_vanished_hyperpod_job_fails_the_run_since_hyperpod_owns_its_retries() -> None:
    seen = started(launched_attempt=1, observed_attempt=1)
    d = decide(ready(spec=hyperpod_spec(), status=seen))
    assert d.status.phase == Phase.FAILED and d.status.attempts == 1
    failed = next(c for c in d.status.conditions if c.type == "Failed")
    assert failed.reason == "TrainerFailed"
    assert "ttlSecondsAfterFinished" in failed.message and "does not retry" in failed.message


def test_suspension_lets_the_same_attempt_be_created_again_on_resume() -> None:
    spec = SPEC.model_copy(deep=True)
    spec.lifecycle.suspend = True
    seen = started(launched_attempt=1, observed_attempt=1)
    d = decide(ready(spec=spec, status=seen, workers_exist=False))
    assert d.status.phase == Phase.SUSPENDED
    assert d.status.launched_attempt == d.status.observed_attempt == 0
    d = decide(ready(status=d.status))
    assert d.actions == [Act.ENSURE_TRAINER] and d.attempt == 1


# --------------------------------------------------------------------------- who retries


def test_hyperpod_failed_is_final_the_operator_does_not_retry_on_top() -> None:
    failed = ready(spec=hyperpod_spec(), trainers_exist=True,
                   trainer=TrainerObserved(1, TrainerState.FAILED, "NCCL timeout"))
    d = decide(failed)
    assert d.status.phase == Phase.FAILED and d.status.attempts == 1
    message = next(c for c in d.status.conditions if c.type == "Failed").message
    assert "autoResumeMaxRetries=3" in message and "NCCL timeout" in message


def test_pytorchjob_retries_belong_to_auto_resume_only_where_it_applies() -> None:
    spec = SPEC.model_copy(deep=True)
    spec.trainer.launcher = LauncherKind.PYTORCH_JOB
    failed = ready(spec=spec, trainers_exist=True,
                   trainer=TrainerObserved(1, TrainerState.FAILED, "exit 1"))
    d = decide(replace(failed, namespace="hyperpod-ns-research"))
    assert d.status.phase == Phase.FAILED and d.status.attempts == 1
    d = decide(replace(failed, namespace="team-a"))
    assert d.status.attempts == 2 and d.actions == [Act.DELETE_TRAINER]


def test_a_restarting_pytorchjob_is_the_same_attempt() -> None:
    """Kubeflow says Restarting while it restarts a failed replica in place (restartPolicy
    OnFailure, under auto-resume): not a failed attempt; the workload is kept."""
    spec = SPEC.model_copy(deep=True)
    spec.trainer.launcher = LauncherKind.PYTORCH_JOB
    restarting = ready(spec=spec, trainers_exist=True, namespace="hyperpod-ns-research",
                       trainer=TrainerObserved(1, TrainerState.RESTARTING, ""))
    d = decide(restarting)
    assert d.status.attempts == 1 and d.status.phase != Phase.FAILED, d.status
    assert Act.DELETE_TRAINER not in d.actions and Act.ENSURE_TRAINER not in d.actions


def test_a_trainer_kueue_holds_waits_says_why_and_costs_nothing() -> None:
    hold = "waiting for Kueue admission in queue lq: insufficient quota for cpu"
    d = decide(ready(trainers_exist=True, trainer=TrainerObserved(
        1, TrainerState.PENDING, hold, held=True)))
    assert d.status.phase == Phase.PROVISIONING and d.status.attempts == 1
    assert d.status.message == f"waiting for the trainer (attempt 1): {hold}"
    ready_cond = next(c for c in d.status.conditions if c.type == "TrainerReady")
    assert (ready_cond.reason, ready_cond.message) == ("AwaitingAdmission", hold)
    assert d.status.cost.running_since is None and not d.actions
    assert [(e.type, e.reason, e.message) for e in d.events] == [
        ("Normal", "TrainerQueued", f"attempt 1: {hold}")]
    again = decide(ready(status=d.status, trainers_exist=True, trainer=TrainerObserved(
        1, TrainerState.PENDING, hold, held=True)))
    assert "TrainerQueued" not in [e.reason for e in again.events]  # said once
    # Evicted while it ran (Kueue preempted it): a warning, and the run stays Running.
    evicted = "waiting for Kueue admission in queue lq: evicted (Preempted): for a workload"
    running = started()
    running.phase = Phase.RUNNING
    d = decide(ready(status=running, trainers_exist=True,
                     trainer=TrainerObserved(1, TrainerState.PENDING, evicted, held=True)))
    assert [(e.type, e.reason) for e in d.events] == [("Warning", "TrainerQueued")]
    assert d.status.phase == Phase.RUNNING and d.status.attempts == 1


CAUSE = "NoCredentialsError: Unable to locate credentials"


def _stalled(status: MultiTurnRLRunStatus, deleting: bool, failures: int) -> MultiTurnRLRunStatus:
    return stalled(status, deleting=deleting, cause=CAUSE, failures=failures,
                   namespace="team-a", name="wordle", now=NOW, generation=3)


def test_a_run_whose_reconcile_fails_is_never_blank() -> None:
    new = _stalled(MultiTurnRLRunStatus(), deleting=False, failures=1)
    assert new.phase == Phase.PENDING
    assert new.message == f"{CAUSE}; retrying"
    progressing = next(c for c in new.conditions if c.type == "Progressing")
    assert (progressing.status, progressing.reason, progressing.message) == (
        "False", "ReconcileError", CAUSE)
    running = _stalled(started().model_copy(update={"phase": Phase.RUNNING}), deleting=False,
                       failures=5)
    assert running.phase == Phase.RUNNING and running.message == f"{CAUSE}; retrying"
    finished = started(message="trained 20 steps").model_copy(update={"phase": Phase.SUCCEEDED})
    assert _stalled(finished, deleting=False, failures=9) == finished


def test_a_stuck_deletion_says_how_to_let_go_after_repeated_failures() -> None:
    first = _stalled(started(), deleting=True, failures=2)
    assert first.phase == Phase.TERMINATING
    assert first.message == f"waiting to delete the run's resources: {CAUSE}; retrying"
    third = _stalled(started(), deleting=True, failures=3)
    assert third.message.endswith(
        "(failed 3 times in a row; to release the run without cleanup: kubectl annotate "
        "mtrlrun wordle -n team-a mtrl.dev/force-release=true, and the orphan sweeper deletes "
        "what is left in AWS)")


def test_the_reward_is_shown_to_three_decimals() -> None:
    d = decide(ready(progress=Progress(step=3, reward_mean=0.0104166666)))
    assert d.status.progress.reward_display == "0.010"
    assert decide(ready(progress=Progress(step=3))).status.progress.reward_display == ""


def test_an_unschedulable_trainer_is_said_on_the_run() -> None:
    told = "its pod cannot be scheduled: 0/2 nodes are available: 2 node(s) didn't match Pod's " \
           "node affinity/selector."
    d = decide(ready(trainer=TrainerObserved(1, TrainerState.PENDING, told, unschedulable=True)))
    assert d.status.message == f"waiting for the trainer (attempt 1): {told}"
    trainer_ready = next(c for c in d.status.conditions if c.type == "TrainerReady")
    assert (trainer_ready.status, trainer_ready.reason) == ("False", "Unschedulable")
    assert d.status.phase == Phase.PROVISIONING


def test_the_latest_evaluation_and_checkpoint_stay_in_status_between_reports() -> None:
    """A step without an evaluation reports none: the run keeps the latest one, its step and
    the history; a checkpoint, once reported, names the adapter to serve."""
    trainer = TrainerObserved(1, TrainerState.RUNNING)
    base = ready(trainer=trainer, trainers_exist=True)
    status = decide(base).status
    status.output_uri = "s3://bucket/out/ns/run/uid"
    reports = [Progress(step=5, total_steps=20, validation_success_rate=0.0),
               Progress(step=6, total_steps=20,
                        latest_checkpoint="s3://bucket/out/ns/run/uid/checkpoints/step-000005/"),
               Progress(step=10, total_steps=20, validation_success_rate=0.75,
                        validation_pass_at_k=[PassAtK(k=1, value=0.75), PassAtK(k=4, value=1.0)],
                        validation_greedy_success_rate=0.5),
               Progress(step=11, total_steps=20)]
    for report in reports:
        status = decide(replace(base, status=status, progress=report)).status
    assert (status.progress.validation_success_rate, status.progress.validation_step) == (0.75, 10)
    assert [(p.k, p.value) for p in status.progress.validation_pass_at_k] == [(1, 0.75), (4, 1.0)]
    assert status.progress.validation_greedy_success_rate == 0.5
    assert [(p.step, p.success_rate, len(p.pass_at_k), p.greedy_success_rate)
            for p in status.progress.validation_history] == [(5, 0.0, 0, None), (10, 0.75, 2, 0.5)]
    assert status.progress.latest_checkpoint.endswith("/checkpoints/step-000005/")
    assert status.adapter_uri == "s3://bucket/out/ns/run/uid/adapter/"
    # A retry that goes back to step 10 evaluates it again: one entry per step.
    status = decide(replace(base, status=status, progress=Progress(
        step=10, total_steps=20, validation_success_rate=0.5))).status
    assert [(p.step, p.success_rate) for p in status.progress.validation_history] == \
        [(5, 0.0), (10, 0.5)]


# --------------------------------------------------------------------------- half-failures


def _cond(status: MultiTurnRLRunStatus, type_: str):  # type: ignore[no-untyped-def]
    return next(c for c in status.conditions if c.type == type_)


def test_the_trainer_starts_at_min_replicas_and_the_rest_are_still_asked_for() -> None:
    """Two of four ECS tasks placed (minReplicas 2): the trainer starts, and EnsureWorkers
    goes on asking for the other two, without holding the trainer back."""
    d = decide(ready(workers_desired=2, workers_ready=2))
    assert d.actions == [Act.ENSURE_WORKERS, Act.ENSURE_TRAINER] and d.attempt == 1
    assert _cond(d.status, "WorkersReady").status == "True"


def test_a_finished_trainer_ends_the_run_whatever_the_workers_do() -> None:
    """Workers missing and past their ready timeout: the trainer's success still decides (it
    used to be that EnsureWorkers came first, for ever)."""
    short = started(launched_attempt=1)
    short.workers.short_since = NOW - dt.timedelta(hours=1)
    d = decide(ready(status=short, workers_desired=1, workers_ready=0, trainers_exist=True,
                     report=proof(), trainer=TrainerObserved(1, TrainerState.SUCCEEDED, "done")))
    assert d.status.phase == Phase.SUCCEEDED and d.actions == [Act.DELETE_TRAINER]


def test_a_shortfall_is_named_once_and_backed_off() -> None:
    from mtrl_operator.reconcile.draft import Placement

    capacity = "Capacity is unavailable at this time"
    short = Placement(asked=4, started=1, failures=(capacity,) * 3)
    d = decide(replace(ready(workers_desired=0, workers_ready=0), placement=short))
    ws = d.status.workers
    assert ws.problem is not None and ws.problem.reason == "CapacityUnavailable"
    assert ws.problem.message == f"ECS RunTask could not start every task: {capacity}"
    assert [e.reason for e in d.events].count("CapacityUnavailable") == 1
    assert ws.placement_failures == 1 and ws.next_placement_time == NOW + dt.timedelta(seconds=10)
    assert d.status.message == (f"waiting for workers: 0/4 ready (minimum 2): ECS RunTask could "
                                f"not start every task: {capacity}")
    # During the backoff: no RunTask, no second Event; requeued for its end.
    later = replace(ready(workers_desired=1, workers_ready=1), status=d.status,
                    now=NOW + dt.timedelta(seconds=4))
    d2 = decide(later)
    assert Act.ENSURE_WORKERS not in d2.actions and not d2.events
    assert d2.requeue_after is not None and d2.requeue_after <= 6
    # After it: asked again; a second shortfall doubles the wait.
    d3 = decide(replace(later, status=d2.status, now=NOW + dt.timedelta(seconds=11)))
    assert Act.ENSURE_WORKERS in d3.actions
    d4 = decide(replace(later, status=d2.status, now=NOW + dt.timedelta(seconds=11),
                        placement=short))
    assert d4.status.workers.next_placement_time == NOW + dt.timedelta(seconds=31)
    # Everything ready: the words are over.
    d5 = decide(replace(later, status=d4.status, workers_desired=4, workers_ready=4))
    assert d5.status.workers.problem is None and d5.status.workers.placement_failures == 0


def test_workers_short_of_min_replicas_for_the_ready_timeout_fail_the_run() -> None:
    from mtrl_operator.reconcile.draft import WorkerProblem

    crash = WorkerProblem("CrashLoopBackOff", "a worker container is crash-looping: exit code "
                                              "2: bad config")
    first = decide(ready(workers_desired=4, workers_ready=0, worker_problem=crash))
    assert first.status.workers.short_since == NOW and Act.ENSURE_TRAINER not in first.actions
    assert _cond(first.status, "WorkersReady").reason == "CrashLoopBackOff"
    d = decide(replace(ready(workers_desired=4, workers_ready=0), status=first.status,
                       now=NOW + dt.timedelta(seconds=600)))
    assert d.status.phase == Phase.FAILED and _cond(d.status, "Failed").reason == \
        "WorkersUnavailable"
    assert d.status.message == ("fewer than spec.workers.minReplicas (2) workers were ready for "
                                f"10m: {crash.words}")
    assert d.actions == [Act.DELETE_WORKERS]


def test_suspending_lasts_until_the_trainer_is_gone_and_resuming_counts_no_failure() -> None:
    running = ready(trainers_exist=True, trainer=TrainerObserved(1, TrainerState.RUNNING),
                    status=started(launched_attempt=1, observed_attempt=1))
    spec = SPEC.model_copy(deep=True)
    spec.lifecycle.suspend = True
    d = decide(replace(running, spec=spec))
    assert d.status.phase == Phase.SUSPENDING and d.actions == [Act.DELETE_TRAINER]
    # Resumed while the trainer is still going: still Suspending, still deleting it.
    d = decide(replace(running, status=d.status))
    assert d.status.phase == Phase.SUSPENDING and d.actions == [Act.DELETE_TRAINER]
    # Gone: the same attempt is created again, and nothing counts as failed.
    d = decide(replace(running, status=d.status, trainers_exist=False, trainer=None))
    assert d.status.phase == Phase.PROVISIONING and Act.ENSURE_TRAINER in d.actions
    assert d.attempt == 1 and d.status.failed_attempts == 0
    assert "TrainerFailed" not in [e.reason for e in d.events]


def test_a_trainer_without_a_step_for_the_progress_timeout_is_a_hung_attempt() -> None:
    since = NOW - dt.timedelta(seconds=1800)
    status = started(launched_attempt=1, observed_attempt=1,
                     progress=Progress(step=42, last_step_time=since))
    status.trainer_running_time = since - dt.timedelta(seconds=600)
    d = decide(ready(status=status, trainers_exist=True,
                     trainer=TrainerObserved(1, TrainerState.RUNNING)))
    assert d.status.attempts == 2 and d.status.failed_attempts == 1
    assert d.actions == [Act.DELETE_TRAINER]
    assert [e.message for e in d.events if e.reason == "TrainerHung"] == [
        "attempt 1 hung (no step for 30m since step 42); starting attempt 2 from the latest "
        "checkpoint"]
    # Not yet hung: requeued for the moment it would be.
    fresh = replace(ready(status=status, trainers_exist=True,
                          trainer=TrainerObserved(1, TrainerState.RUNNING)),
                    now=NOW - dt.timedelta(seconds=60))
    d = decide(fresh)
    assert d.status.phase == Phase.RUNNING and d.requeue_after == 60


def test_an_evicted_trainer_resumes_in_a_new_attempt_without_spending_the_backoff_limit() -> None:
    evicted = TrainerObserved(1, TrainerState.FAILED, disrupted="EvictionByEvictionAPI: drain")
    d = decide(ready(status=started(launched_attempt=1, observed_attempt=1),
                     trainers_exist=True, trainer=evicted))
    assert d.status.attempts == 2 and d.status.failed_attempts == 0
    assert d.status.phase != Phase.FAILED
    assert [e.reason for e in d.events] == ["TrainerDisrupted"]


def test_episodes_that_keep_failing_are_named_and_end_the_run_unretried() -> None:
    error = "ValueError: a target task sets exactly one of target_token_id and target"
    report = Progress(step=3, failed_episode_fraction=1.0, episode_error=error)
    d = decide(ready(progress=report, trainers_exist=True,
                     trainer=TrainerObserved(1, TrainerState.RUNNING)))
    failing = _cond(d.status, "EpisodesFailing")
    assert failing.status == "True" and failing.message.endswith(error)
    assert [e.reason for e in d.events].count("EpisodesFailing") == 1
    stopped = TrainerObserved(1, TrainerState.FAILED, f"episodes failed: ...; {error}",
                              episodes_failed=True)
    d = decide(ready(status=d.status, trainers_exist=True, trainer=stopped))
    assert d.status.phase == Phase.FAILED and _cond(d.status, "Failed").reason == "EpisodesFailed"
    assert d.status.attempts == 1


def test_a_trainer_that_diverged_ends_the_run_unretried_in_its_words() -> None:
    """A NaN gradient replays from the last checkpoint into the same numbers: another attempt
    would spend the GPUs on it again, so the run fails at once, saying why."""
    line = "training diverged: the gradient norm of step 3/10 is nan (exit code 1)"
    stopped = TrainerObserved(1, TrainerState.FAILED, line, diverged=True)
    d = decide(ready(status=started(launched_attempt=1, observed_attempt=1),
                     trainers_exist=True, trainer=stopped))
    failed = _cond(d.status, "Failed")
    assert d.status.phase == Phase.FAILED and failed.reason == "TrainingDiverged"
    assert failed.message.endswith(line) and "not retried" in failed.message
    assert d.status.attempts == 1 and d.status.failed_attempts == 0


def test_a_launch_cut_short_waits_again_for_workers_that_went_meanwhile() -> None:
    """Found by the lifecycle model (3,000 examples): attempt 2 was recorded, its create call
    failed, and a worker task stopped before the next reconcile. The recorded attempt let the
    trainer past the workers' gate: GPUs with one worker of a minimum of two."""
    retrying = started(launched_attempt=2, observed_attempt=1).model_copy(update={"attempts": 2})
    d = decide(ready(status=retrying, workers_ready=1))
    assert Act.ENSURE_TRAINER not in d.actions
    assert d.status.message.startswith("waiting for workers: 1/4 ready (minimum 2)")
    d = decide(ready(status=retrying, workers_ready=2))
    assert Act.ENSURE_TRAINER in d.actions and d.attempt == 2
