"""The workers in their own words: ECS's answers, stopped tasks and pods, as one sentence that
stays the same while the cause does."""

from __future__ import annotations

import datetime as dt
from typing import Any

from mtrl_operator.reconcile.draft import OPERATOR_STOP_REASON, EcsTask, Placement
from mtrl_operator.reconcile.workers import (
    newest_stopped,
    placement_backoff,
    placement_problem,
    pod_problem,
    stopped_task_problem,
)

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
CAPACITY = ("Capacity is unavailable at this time. Please try again later or in a different "
            "availability zone")


def test_a_shortfall_is_told_by_its_most_frequent_reason() -> None:
    assert placement_problem(Placement(3, 3)) is None
    told = placement_problem(Placement(3, 1, (CAPACITY, CAPACITY)))
    assert told is not None and told.reason == "CapacityUnavailable"
    assert told.words == f"ECS RunTask could not start every task: {CAPACITY}"
    other = placement_problem(Placement(2, 0, ("RESOURCE:ENI", "RESOURCE:ENI", "AGENT")))
    assert other is not None and other.reason == "PlacementFailed"
    assert other.words.endswith(": RESOURCE:ENI")


def test_the_backoff_doubles_from_ten_seconds_to_five_minutes() -> None:
    assert [placement_backoff(n) for n in (1, 2, 3, 6, 20)] == [10, 20, 40, 300, 300]


def test_the_newest_task_that_stopped_on_its_own_tells() -> None:
    ours = EcsTask("arn:task/c/1", "STOPPED", "STOPPED", stopped_reason=OPERATOR_STOP_REASON,
                   stopped_at=T0 + dt.timedelta(hours=1))
    old = EcsTask("arn:task/c/2", "STOPPED", "STOPPED", stopped_reason="Task failed ELB checks",
                  stopped_at=T0)
    new = EcsTask("arn:task/c/3", "STOPPED", "STOPPED",
                  stopped_reason="Essential container in task exited", exit_code=137,
                  container_reason="OutOfMemoryError: Container killed due to memory usage",
                  stopped_at=T0 + dt.timedelta(minutes=5))
    live = EcsTask("arn:task/c/4", "RUNNING", "RUNNING")
    assert newest_stopped([ours, old, new, live]) == new
    assert newest_stopped([ours, live]) is None
    told = stopped_task_problem(new, "Killed")
    assert told.reason == "TaskStopped"
    assert told.words == ("ECS task 3 stopped: Essential container in task exited (exit code "
                          "137; OutOfMemoryError: Container killed due to memory usage): Killed")


def _pod(name: str, container: dict[str, Any] | None = None,
         conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {
        "containerStatuses": [container] if container else [],
        "conditions": conditions or []}}


def test_a_crash_loop_is_told_by_its_exit_code_and_last_words_not_its_restart_count() -> None:
    crashed = {"name": "worker", "restartCount": 3,
               "state": {"waiting": {"reason": "CrashLoopBackOff"}},
               "lastState": {"terminated": {"exitCode": 2, "message": "Traceback ...\n"
                                            "mtrl worker: invalid worker configuration\n"}}}
    running_again = {**crashed, "restartCount": 4, "state": {"running": {}}}
    first = pod_problem([_pod("w-b", crashed), _pod("w-a")])
    again = pod_problem([_pod("w-b", running_again)])
    assert first is not None and again is not None
    assert first.words == ("a worker container is crash-looping: exit code 2: mtrl worker: "
                           "invalid worker configuration")
    assert again == first  # between back-offs too: one cause, one Event


def test_pods_that_cannot_start_or_be_placed_are_told() -> None:
    pulling = {"name": "worker", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "w:9"'}}}
    told = pod_problem([_pod("w", pulling)])
    assert told is not None and told.words == ('a worker container cannot start '
                                               '(ImagePullBackOff): Back-off pulling image "w:9"')
    unplaced = _pod("w", conditions=[{"type": "PodScheduled", "status": "False",
                                      "reason": "Unschedulable",
                                      "message": "0/3 nodes are available: 3 Insufficient cpu."}])
    told = pod_problem([unplaced])
    assert told is not None and told.reason == "Unschedulable"
    assert pod_problem([_pod("w", {"name": "worker", "state": {"running": {}}})]) is None
