"""The controller's in-memory bookkeeping, without servers."""

from __future__ import annotations

from typing import Any

from mtrl_operator import metrics
from mtrl_operator.controller import Controller
from mtrl_operator.settings import Settings


def _body(phase: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "run", "uid": "u-1"},
            "status": {"phase": phase}}


def _gauge(phase: str) -> float:
    return metrics.RUNS_BY_PHASE.labels(phase=phase)._value.get()


def test_runs_by_phase_gauge_follows_watch_events_in_constant_time() -> None:
    controller = Controller(Settings(), kube=None, aws=None)  # type: ignore[arg-type]
    running, done = _gauge("Running"), _gauge("Succeeded")
    controller.on_run("ADDED", _body("Running"))
    controller.on_run("MODIFIED", _body("Running"))
    assert _gauge("Running") == running + 1
    controller.on_run("MODIFIED", _body("Succeeded"))
    assert (_gauge("Running"), _gauge("Succeeded")) == (running, done + 1)
    controller.on_run("DELETED", _body("Succeeded"))
    assert _gauge("Succeeded") == done
