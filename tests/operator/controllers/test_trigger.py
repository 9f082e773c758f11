"""The trigger controller's in-memory bookkeeping, without servers."""

from __future__ import annotations

from typing import Any

from mtrl_operator.controllers.trigger import TriggerController
from mtrl_operator.settings import Settings


def _trigger(uid: str = "t-1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "wordle", "uid": uid},
            "spec": {"source": {"s3": {"bucket": "b"}}}}


def _run(name: str, trigger_uid: str = "t-1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": f"r-{name}",
                         "ownerReferences": [{"apiVersion": "mtrl.dev/v1alpha1",
                                              "kind": "MultiTurnRLTrigger", "name": "wordle",
                                              "uid": trigger_uid, "controller": True}]}}


def test_a_deleted_trigger_leaves_nothing_behind_even_when_run_events_come_late() -> None:
    controller = TriggerController(Settings(), kube=None, aws=None)  # type: ignore[arg-type]
    controller.on_trigger("ADDED", _trigger())
    controller.on_run("ADDED", _run("day-1"))
    controller.on_trigger("DELETED", _trigger())
    # The garbage collector removes the trigger's runs after the trigger is gone.
    controller.on_run("MODIFIED", _run("day-1"))
    controller.on_run("DELETED", _run("day-1"))
    assert (controller.triggers, controller.keys_by_uid, controller.runs, controller.statuses,
            controller.queue_states, controller.aws_checked, dict(controller.changed),
            dict(controller.locks), controller.consumers) == ({}, {}, {}, {}, {}, {}, {}, {}, {})


def test_runs_seen_before_their_trigger_are_kept_for_it() -> None:
    controller = TriggerController(Settings(), kube=None, aws=None)  # type: ignore[arg-type]
    controller.on_run("ADDED", _run("day-1"))  # kopf's watches deliver in no set order
    controller.on_trigger("ADDED", _trigger())
    assert [view.name for view in controller._run_views("t-1")] == ["day-1"]
