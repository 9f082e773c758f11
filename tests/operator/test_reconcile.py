"""The state machine as a pure function: observation in, actions and status out."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from mtrl_operator.api.run import MultiTurnRLRunSpec, MultiTurnRLRunStatus, Phase, Progress
from mtrl_operator.reconcile import Act, Observed, TrainerObserved, TrainerState, decide

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
    return MultiTurnRLRunStatus(phase=Phase.PROVISIONING, start_time=NOW, attempts=1, **kw)


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
    running = ready(trainer=TrainerObserved(1, TrainerState.RUNNING), trainers_exist=True)
    d = decide(running)
    assert d.status.phase == Phase.RUNNING and d.actions == []
    done = replace(running, status=d.status,
                   trainer=TrainerObserved(1, TrainerState.SUCCEEDED))
    d = decide(done)
    assert d.status.phase == Phase.SUCCEEDED and d.status.completion_time == NOW
    assert d.actions == [Act.DELETE_TRAINER]
    d = decide(replace(done, status=d.status, trainer=None, trainers_exist=False))
    assert d.actions == [Act.DELETE_WORKERS]
    d = decide(replace(done, status=d.status, trainer=None, trainers_exist=False,
                       workers_exist=False))
    assert d.actions == [Act.DELETE_QUEUES]


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
    d = decide(replace(failed, status=d.status, trainer=None, trainers_exist=False))
    assert d.actions == [Act.ENSURE_TRAINER] and d.attempt == 2
    d = decide(replace(failed, status=d.status,
                       trainer=TrainerObserved(2, TrainerState.FAILED, "OOM again")))
    assert d.status.phase == Phase.FAILED
    assert next(c for c in d.status.conditions if c.type == "Failed").reason == \
        "BackoffLimitExceeded"


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
    assert d2.status == d1.status, "no change observed, no status write"
