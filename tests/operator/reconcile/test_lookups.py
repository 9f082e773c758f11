"""What a reconcile looks up: each decision that sets what a reconcile costs, without servers."""

from __future__ import annotations

from typing import Any

import pytest

from mtrl_api.run import MultiTurnRLRunSpec, MultiTurnRLRunStatus, Phase, ResourceRefs, WorkerBackend
from mtrl_operator.naming import LABEL_ATTEMPT
from mtrl_operator.reconcile import lookups
from mtrl_operator.reconcile.draft import TrainerObserved, TrainerState
from tests.operator.runs import run_manifest


def _spec(**workers: Any) -> MultiTurnRLRunSpec:
    return MultiTurnRLRunSpec.model_validate(run_manifest("run", workers=workers)["spec"])


def _status(phase: Phase = Phase.RUNNING, **fields: Any) -> MultiTurnRLRunStatus:
    return MultiTurnRLRunStatus(phase=phase, **fields)


def test_a_finished_run_with_nothing_recorded_in_aws_costs_no_aws_call() -> None:
    assert not lookups.needs_aws(_status(Phase.SUCCEEDED), deleting=False)
    assert lookups.needs_aws(_status(Phase.SUCCEEDED), deleting=True)  # teardown looks again
    assert lookups.needs_aws(_status(Phase.RUNNING), deleting=False)
    for left in ({"task_arns": ["arn:t"]}, {"task_definition_arn": "arn:d"}):
        assert lookups.needs_aws(_status(Phase.FAILED, resources=ResourceRefs(**left)), False)


def test_without_a_readable_spec_workers_are_looked_for_on_both_backends() -> None:
    assert set(lookups.worker_backends(None)) == set(WorkerBackend)
    assert lookups.worker_backends(_spec(backend="kubernetes")) == (WorkerBackend.KUBERNETES,)


@pytest.mark.parametrize(("live", "running", "wanted"), [
    (True, 1, True), (True, 2, False), (False, 0, False)])
def test_stopped_tasks_are_listed_only_when_a_live_run_misses_workers(
        live: bool, running: int, wanted: bool) -> None:
    spec = _spec(backend="ecs-fargate", minReplicas=1, maxReplicas=2)
    assert lookups.needs_stopped_tasks(live, spec, running) is wanted


def test_a_task_definition_is_looked_up_once_one_may_have_been_registered() -> None:
    fresh = _status(Phase.PENDING)
    assert not lookups.task_definition_may_exist(3, False, fresh)  # queues come first
    assert lookups.task_definition_may_exist(4, False, fresh)
    assert lookups.task_definition_may_exist(0, True, fresh)
    assert lookups.task_definition_may_exist(0, False, _status(Phase.FAILED))
    recorded = _status(Phase.PENDING, resources=ResourceRefs(task_definition_arn="arn:d"))
    assert lookups.task_definition_may_exist(0, False, recorded)


def test_tasks_are_listed_once_queues_or_the_status_say_workers_may_exist() -> None:
    fresh = _status(Phase.PENDING)
    assert not lookups.tasks_may_exist(0, False, fresh)  # a new run, before its queues
    assert lookups.tasks_may_exist(1, False, fresh)
    assert lookups.tasks_may_exist(0, True, fresh)
    assert lookups.tasks_may_exist(0, False, _status(Phase.SUCCEEDED))
    # Its queues deleted behind the operator's back while its workers run:
    assert lookups.tasks_may_exist(0, False, _status(resources=ResourceRefs(task_arns=["arn:t"])))


@pytest.mark.parametrize(("live", "roles", "age", "again"), [
    (True, 4, 1.0, False),   # every queue, seen a moment ago: trusted
    (True, 4, 30.0, True),   # a resync period ago: looked at again
    (True, 3, 1.0, True),    # provisioning: until every queue is there
    (False, 4, 1.0, True),   # finished or being deleted: teardown reads the truth
])
def test_a_live_runs_queues_are_listed_once_per_resync_period(
        live: bool, roles: int, age: float, again: bool) -> None:
    seen = {f"role-{i}" for i in range(roles)}
    assert lookups.queues_listed_again(live, seen, age, resync_s=30.0) is again


def _workload(attempt: int) -> dict[str, Any]:
    return {"metadata": {"labels": {LABEL_ATTEMPT: str(attempt)}}}


def test_the_current_workload_is_the_current_attempts() -> None:
    workloads = {("Job", "run-t1"): _workload(1), ("Job", "run-t2"): _workload(2)}
    assert lookups.current_workload(workloads, 2) == (("Job", "run-t2"), _workload(2))
    assert lookups.current_workload(workloads, 3) is None


def test_a_launched_attempt_missing_from_the_cache_is_read_live_only_while_the_run_lives() -> None:
    spec = _spec()
    launched = _status(Phase.RUNNING, attempts=2, launched_attempt=2)
    assert lookups.needs_live_trainer_read(False, spec, launched, deleting=False)
    assert not lookups.needs_live_trainer_read(True, spec, launched, deleting=False)
    assert not lookups.needs_live_trainer_read(False, spec, launched, deleting=True)
    assert not lookups.needs_live_trainer_read(False, None, launched, deleting=False)
    unlaunched = _status(Phase.PROVISIONING, attempts=2, launched_attempt=1)
    assert not lookups.needs_live_trainer_read(False, spec, unlaunched, deleting=False)


@pytest.mark.parametrize(("state", "wanted"), [
    (TrainerState.FAILED, True), (TrainerState.PENDING, True), (TrainerState.RUNNING, False),
    (TrainerState.SUCCEEDED, False)])
def test_trainer_pods_are_read_for_a_failed_or_pending_trainer(
        state: TrainerState, wanted: bool) -> None:
    trainer = TrainerObserved(attempt=1, state=state)
    assert lookups.needs_trainer_pods(trainer, live=True) is wanted
    assert not lookups.needs_trainer_pods(trainer, live=False)
    assert not lookups.needs_trainer_pods(None, live=True)


def test_only_a_failed_trainers_pods_are_read_live() -> None:
    assert lookups.trainer_pods_live(TrainerObserved(attempt=1, state=TrainerState.FAILED))
    assert not lookups.trainer_pods_live(TrainerObserved(attempt=1, state=TrainerState.PENDING))


def test_worker_pods_are_read_only_when_workers_are_short_of_ready() -> None:
    assert lookups.needs_worker_pods(True, desired=2, ready=1)
    assert not lookups.needs_worker_pods(True, desired=2, ready=2)
    assert not lookups.needs_worker_pods(False, desired=2, ready=0)
