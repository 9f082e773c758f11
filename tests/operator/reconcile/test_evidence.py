"""Verdicts by evidence (issue 40): a run is Succeeded, Failed or costing only on what the
operator observed of the current launch, never on an exit code, a stale report or a default.

Each test is one hole that `decide` had, replayed with the observation that showed it."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from mtrl_api.run import LauncherKind, MultiTurnRLRunSpec, MultiTurnRLRunStatus, Phase, Progress
from mtrl_operator.reconcile.draft import TrainerReport
from mtrl_operator.reconcile.run import Act, Observed, TrainerObserved, TrainerState, decide

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
PRICE = 98.32  # USD per node-hour


def spec(launcher: LauncherKind = LauncherKind.JOB, **lifecycle: object) -> MultiTurnRLRunSpec:
    return MultiTurnRLRunSpec.model_validate({
        "model": {"name": "m"}, "rollout": {"environment": "target"},
        "dataset": {"inline": {"train": [{"target": "a"}]}},
        "output": {"s3Uri": "s3://bucket/out"}, "grpo": {"maxSteps": 20},
        "trainer": {"launcher": launcher.value},
        "workers": {"minReplicas": 1, "maxReplicas": 1},
        "lifecycle": {"backoffLimit": 2, **lifecycle}})


def launched(launch: int = 1, attempt: int = 1, **kw: object) -> MultiTurnRLRunStatus:
    """A run whose `attempt` was launched (its `launch`-th workload) and seen to exist."""
    return MultiTurnRLRunStatus(phase=Phase.RUNNING, start_time=NOW - dt.timedelta(hours=1),
                                attempts=attempt, launched_attempt=attempt,
                                observed_attempt=attempt, trainer_launch=launch, **kw)


def observe(status: MultiTurnRLRunStatus, run: MultiTurnRLRunSpec | None = None,
            **kw: object) -> Observed:
    base = Observed(now=NOW, generation=1, deleting=False, spec=run or spec(), spec_error=None,
                    status=status, queues_ready=True, queues_exist=True, workers_exist=True,
                    workers_desired=1, workers_ready=1, price=PRICE)
    return replace(base, **kw)


def report(launch: int = 1, step: int = 20, trained: int | None = 12,
           outcome: str | None = "Succeeded") -> TrainerReport:
    return TrainerReport(launch=launch, attempt=1, outcome=outcome, step=step, total_steps=20,
                         trained_steps=trained)


def completed(attempt: int = 1) -> dict[str, object]:
    """The workload says it completed (Job Complete, exit code 0)."""
    return {"trainer": TrainerObserved(attempt, TrainerState.SUCCEEDED, "the trainer Job completed"),
            "trainers_exist": True}


def failed_reason(status: MultiTurnRLRunStatus) -> str:
    return next(c.reason for c in status.conditions if c.type == "Failed")


# ------------------------------------------------------------------ 1. Succeeded on evidence


def test_a_workload_that_completes_without_reporting_an_outcome_is_a_failed_attempt() -> None:
    """It used to end the run Succeeded: "trained 0 steps in 1 attempt(s)"."""
    d = decide(observe(launched(), **completed()))
    assert d.status.phase != Phase.SUCCEEDED
    assert d.status.failed_attempts == 1 and d.status.attempts == 2
    assert d.actions == [Act.DELETE_TRAINER]
    [event] = [e for e in d.events if e.reason == "TrainerFailed"]
    assert "the trainer exited 0 without a progress report of its launch (1, MTRL_LAUNCH)" \
        in event.message
    # With a report that never said it finished: how far it got.
    d = decide(observe(launched(), report=report(step=7, outcome=None), **completed()))
    [event] = [e for e in d.events if e.reason == "TrainerFailed"]
    assert "the trainer exited 0 after 7 of 20 steps without reporting an outcome" in event.message
    # Under HyperPod's retries the run fails, naming what was missing.
    hyperpod = spec(LauncherKind.HYPERPOD_PYTORCH_JOB)
    d = decide(observe(launched(), hyperpod, report=report(step=0, outcome=None),
                       **completed()))
    assert d.status.phase == Phase.FAILED
    assert "the trainer exited 0 after 0 of 20 steps without reporting an outcome" in \
        d.status.message


def test_success_needs_every_step_and_a_trained_one() -> None:
    d = decide(observe(launched(), report=report(), **completed()))
    assert d.status.phase == Phase.SUCCEEDED
    assert d.status.message == "trained 20 steps (12 updated the adapter) in 1 attempt(s)"
    # An outcome short of maxSteps, or without trainedSteps, proves nothing.
    for short in (report(step=19), report(trained=None)):
        d = decide(observe(launched(), report=short, **completed()))
        assert d.status.phase != Phase.SUCCEEDED and d.status.failed_attempts == 1


def test_a_run_whose_groups_all_scored_alike_ends_failed_not_succeeded() -> None:
    """Every step played, no optimizer update: NothingTrained, not retried."""
    d = decide(observe(launched(), report=report(trained=0), **completed()))
    assert d.status.phase == Phase.FAILED and failed_reason(d.status) == "NothingTrained"
    assert d.status.failed_attempts == 0 and d.actions == [Act.DELETE_TRAINER]
    # The reference trainer says so itself, exiting with its words: not retried either.
    told = TrainerObserved(1, TrainerState.FAILED, "nothing trained: ...", nothing_trained=True)
    d = decide(observe(launched(), trainer=told, trainers_exist=True))
    assert d.status.phase == Phase.FAILED and failed_reason(d.status) == "NothingTrained"


def test_evidence_of_success_wins_over_a_workload_that_failed_afterwards() -> None:
    """HyperPod owns retries; the trainer reported its outcome, then its pod exited non-zero
    on the way out: the run trained, and says so (it used to fail the run)."""
    hyperpod = spec(LauncherKind.HYPERPOD_PYTORCH_JOB)
    failed = TrainerObserved(1, TrainerState.FAILED, "exit code 1")
    d = decide(observe(launched(), hyperpod, report=report(), trainer=failed,
                       trainers_exist=True))
    assert d.status.phase == Phase.SUCCEEDED


# ------------------------------------------------------------------ 2. stale reports


def resumed(launch: int) -> MultiTurnRLRunStatus:
    """After suspend and resume: the same attempt launched again (`launch`), not yet seen."""
    return launched(launch=launch).model_copy(update={"observed_attempt": 0,
                                                      "phase": Phase.PROVISIONING})


def test_a_report_of_the_launch_before_a_suspension_is_no_proof_the_new_one_ran() -> None:
    """The create of the resumed trainer failed (or the leader died before it): the report
    the stopped trainer left, of the same attempt, used to count a failed attempt and delete
    the new trainer (Job), or fail the run for good (HyperPodPyTorchJob)."""
    stale = report(launch=1, step=5, outcome=None)
    for run in (spec(), spec(LauncherKind.HYPERPOD_PYTORCH_JOB)):
        d = decide(observe(resumed(launch=2), run, report=stale))
        assert d.actions == [Act.ENSURE_TRAINER], (run.trainer.launcher, d.status.message)
        assert d.status.failed_attempts == 0 and d.status.phase != Phase.FAILED
        assert d.status.trainer_launch == 2, "the same launch: its create is retried"
    # And a stale outcome is not a success of the new launch.
    d = decide(observe(resumed(launch=2), report=report(launch=1), **completed()))
    assert d.status.phase != Phase.SUCCEEDED


def test_each_launch_gets_a_new_number_recorded_before_its_create() -> None:
    first = MultiTurnRLRunStatus(phase=Phase.PROVISIONING, start_time=NOW, attempts=1)
    d = decide(observe(first))
    assert d.actions == [Act.ENSURE_TRAINER] and d.status.trainer_launch == 1
    # Asked again before it is seen (a crash after the status write): the same launch.
    again = decide(observe(d.status))
    assert again.actions == [Act.ENSURE_TRAINER] and again.status.trainer_launch == 1
    # The attempt fails; the next one is a new launch.
    failed = TrainerObserved(1, TrainerState.FAILED, "exit code 1")
    d = decide(observe(launched(), trainer=failed, trainers_exist=True))
    d = decide(observe(d.status, now=d.status.next_attempt_time))
    assert d.actions == [Act.ENSURE_TRAINER] and d.attempt == 2
    assert d.status.trainer_launch == 2


# ------------------------------------------------------------------ 3. a trainer that never starts


def stuck(attempt: int = 1) -> TrainerObserved:
    words = ("pod run-t1-0-abcde cannot start its container (ImagePullBackOff): Back-off "
             "pulling image \"registry.example/mtrl-trainer:0.1.0\"")
    return TrainerObserved(attempt, TrainerState.PENDING, words, bound=True, waiting=words)


def test_a_trainer_pod_stuck_on_a_node_costs_and_fails_its_attempt_at_the_startup_bound() -> None:
    """It used to say "waiting for trainer pods" at $0.00 for ever: no hang clock (it never
    ran), no meter (it never ran), so maxCostUSD never acted."""
    run = spec(startupTimeoutSeconds=600)
    start = launched().model_copy(update={"phase": Phase.PROVISIONING})
    d = decide(observe(start, run, trainer=stuck(), trainers_exist=True))
    assert d.status.cost.running_since == NOW, "billed from the moment it holds a node"
    assert d.status.trainer_bound_time == NOW
    assert "cannot start its container (ImagePullBackOff)" in d.status.message
    assert d.requeue_after == 600, "looked at again when the bound is reached"
    later = NOW + dt.timedelta(seconds=600)
    d = decide(observe(d.status, run, now=later, trainer=stuck(), trainers_exist=True))
    assert d.status.failed_attempts == 1 and d.status.attempts == 2
    assert d.actions == [Act.DELETE_TRAINER]
    [event] = [e for e in d.events if e.reason == "TrainerStartTimeout"]
    assert "bound to a node 10m ago and never started (spec.lifecycle.startupTimeoutSeconds):" \
           " pod run-t1-0-abcde cannot start its container (ImagePullBackOff)" in event.message
    assert d.status.cost.usd == round(600 / 3600 * PRICE, 2)


def test_max_cost_ends_a_run_whose_trainer_never_started() -> None:
    run = spec(startupTimeoutSeconds=0, maxCostUSD=50.0)  # no startup bound: the budget acts
    start = launched().model_copy(update={"phase": Phase.PROVISIONING})
    d = decide(observe(start, run, trainer=stuck(), trainers_exist=True))
    assert d.requeue_after is not None and d.requeue_after < 1900  # $50 at $98.32/h
    d = decide(observe(d.status, run, now=NOW + dt.timedelta(days=10), trainer=stuck(),
                       trainers_exist=True))
    assert d.status.phase == Phase.FAILED and failed_reason(d.status) == "BudgetExceeded"
    assert d.actions == [Act.DELETE_TRAINER]


def test_a_pod_waiting_for_the_scheduler_or_for_kueue_holds_no_node_and_is_not_timed() -> None:
    run = spec(startupTimeoutSeconds=60)
    start = launched().model_copy(update={"phase": Phase.PROVISIONING})
    waiting = TrainerObserved(1, TrainerState.PENDING, "its pod cannot be scheduled: 0/3 nodes",
                              unschedulable=True)
    d = decide(observe(start, run, trainer=waiting, trainers_exist=True,
                       now=NOW + dt.timedelta(days=1)))
    assert d.status.cost.running_since is None and d.status.failed_attempts == 0
    assert d.status.trainer_bound_time is None


# ------------------------------------------------------------------ 4. settings under a run


def test_a_run_is_metered_at_the_price_it_started_with() -> None:
    """A helm upgrade that changes `pricing` applies to new runs only."""
    run = spec(maxCostUSD=100.0)
    first = decide(observe(MultiTurnRLRunStatus(), run))
    assert first.status.cost.price == PRICE
    running = first.status.model_copy(update={"attempts": 1, "launched_attempt": 1,
                                              "observed_attempt": 1, "trainer_launch": 1})
    on = TrainerObserved(1, TrainerState.RUNNING)
    d = decide(observe(running, run, trainer=on, trainers_exist=True, price=None))
    assert d.status.phase == Phase.RUNNING and d.status.cost.price == PRICE
    d = decide(observe(d.status, run, trainer=on, trainers_exist=True, price=1000.0,
                       now=NOW + dt.timedelta(minutes=30)))
    assert d.status.cost.usd == round(0.5 * PRICE, 2) and d.status.phase == Phase.RUNNING


# ------------------------------------------------------------------ 6. smaller


def test_while_an_older_attempts_workload_goes_the_run_says_so() -> None:
    status = launched(attempt=2, launch=2).model_copy(update={"launched_attempt": 1,
                                                              "observed_attempt": 1,
                                                              "message": ""})
    d = decide(observe(status, trainers_exist=True, progress=Progress(step=3)))
    assert d.actions == [Act.DELETE_TRAINER]
    assert d.status.message == "removing the trainer of an earlier attempt before attempt 2"


def test_namespace_kubeflow_on_nodes_that_are_not_hyperpods_gets_the_operators_retries() -> None:
    """HyperPod auto-resume acts in namespace kubeflow only on HyperPod's own nodes (instance
    types ml.*): on plain Kubeflow a failed PyTorchJob there used to fail the run at once, with
    nobody retrying it."""
    failed = TrainerObserved(1, TrainerState.FAILED, "exit code 1")
    for instance_type, retried in (("p5.48xlarge", True), ("ml.p5.48xlarge", False)):
        run = spec(LauncherKind.PYTORCH_JOB)
        run.trainer.instance_type = instance_type
        d = decide(observe(launched(), run, trainer=failed, trainers_exist=True,
                           namespace="kubeflow"))
        assert (d.status.phase != Phase.FAILED) == retried, (instance_type, d.status.message)
        assert d.status.failed_attempts == (1 if retried else 0)
