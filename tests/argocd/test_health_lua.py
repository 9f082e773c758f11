"""The Argo CD health check for MultiTurnRLRun, run as Argo CD runs it (gopher-lua v1.1.2, the
argocd-cm library set: tests/argocd/luacheck.py) over statuses built from the operator's own status
models (the trigger's is in test_trigger_health_lua.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtrl_api.run import Condition, MultiTurnRLRunStatus, Phase
from mtrl_operator.naming import FINALIZER
from tests.argocd.luacheck import ARGOCD, PATCH, REPO, ArgoCD

NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def condition(type_: str, status: bool, reason: str, message: str = "") -> Condition:
    return Condition(type=type_, status="True" if status else "False", reason=reason,
                     message=message, last_transition_time=NOW)


def run(phase: Phase | None, message: str = "", conditions: tuple[Condition, ...] = (),
        generation: int = 1, observed: int | None = 1) -> dict[str, Any]:
    """A MultiTurnRLRun as Argo CD reads it from the API server; phase None: no status yet."""
    obj: dict[str, Any] = {
        "apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun",
        "metadata": {"name": "wordle", "namespace": "team-a", "generation": generation},
        "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "rollout": {"environment": "wordle"}},
    }
    if phase is not None:
        obj["status"] = MultiTurnRLRunStatus(phase=phase, message=message, observed_generation=observed,
                                             conditions=list(conditions)).wire()
    return obj


COLLAPSE = condition("RewardCollapse", True, "ZeroVarianceGroups",
                     "95% of groups had equal rewards for 5 consecutive steps")
FAILED = condition("Failed", True, "BackoffLimitExceeded", "trainer failed 4 times")

# Every phase, what Argo CD must show for it. A phase added to the API without a row here fails
# test_every_phase_has_an_expected_health.
EXPECTED = {
    Phase.PENDING: (run(Phase.PENDING, "accepted"), "Progressing", "Pending: accepted"),
    Phase.PROVISIONING: (run(Phase.PROVISIONING, "creating queues, workers and trainer"),
                         "Progressing", "Provisioning: creating queues, workers and trainer"),
    Phase.RUNNING: (run(Phase.RUNNING, "training: step 42/100"),
                    "Progressing", "Running: training: step 42/100"),
    Phase.SUSPENDING: (run(Phase.SUSPENDING, "suspending: stopping the trainer"),
                       "Progressing", "Suspending: suspending: stopping the trainer"),
    Phase.TERMINATING: (run(Phase.TERMINATING, "deleting the run's resources"),
                        "Progressing", "Terminating: deleting the run's resources"),
    Phase.SUCCEEDED: (run(Phase.SUCCEEDED, "trained 100 steps"), "Healthy",
                      "Succeeded: trained 100 steps"),
    Phase.SUSPENDED: (run(Phase.SUSPENDED, "suspended; set spec.lifecycle.suspend=false to resume"),
                      "Suspended", "Suspended: suspended; set spec.lifecycle.suspend=false to resume"),
    Phase.FAILED: (run(Phase.FAILED, "trainer failed 4 times",
                       (condition("Complete", False, "NotCompleted"), FAILED)),
                   "Degraded", "BackoffLimitExceeded: trainer failed 4 times"),
}


def test_every_phase_has_an_expected_health() -> None:
    assert set(EXPECTED) == set(Phase)


@pytest.mark.parametrize("phase", list(EXPECTED), ids=str)
def test_phase_maps_to_health(argocd: ArgoCD, phase: Phase) -> None:
    obj, status, message = EXPECTED[phase]
    assert argocd.health(obj) == (status, message)


def test_no_status_waits_for_the_operator(argocd: ArgoCD) -> None:
    assert argocd.health(run(None)) == ("Progressing", "Waiting for the operator")


def test_status_without_phase_waits_for_the_operator(argocd: ArgoCD) -> None:
    obj = run(None)
    obj["status"] = {"conditions": []}
    assert argocd.health(obj) == ("Progressing", "Waiting for the operator")


@pytest.mark.parametrize("phase", list(Phase), ids=str)
def test_stale_observed_generation_is_progressing(argocd: ArgoCD, phase: Phase) -> None:
    # The path every spec edit takes until the operator catches up; with string.format it was
    # Unknown with a Lua error under Argo CD's library set.
    obj = run(phase, "whatever the older spec led to", (FAILED,), generation=3, observed=2)
    assert argocd.health(obj) == ("Progressing",
                                  "Waiting for the operator to observe generation 3 (last observed 2)")


def test_stale_message_prints_large_generations_as_integers(argocd: ArgoCD) -> None:
    # Argo CD hands every number to Lua as a float64 (Go prints 16777217.0 as 1.6777217e+07);
    # gopher-lua's tostring prints an integral one as an integer.
    obj = run(Phase.RUNNING, generation=16777217, observed=16777216)
    assert argocd.health(obj) == ("Progressing", "Waiting for the operator to observe generation "
                                                 "16777217 (last observed 16777216)")


def test_current_observed_generation_reports_the_phase(argocd: ArgoCD) -> None:
    obj = run(Phase.SUCCEEDED, "trained 100 steps", generation=3, observed=3)
    assert argocd.health(obj) == ("Healthy", "Succeeded: trained 100 steps")


@pytest.mark.parametrize("conditions", [(), (condition("Failed", False, "NotFailed"),)],
                         ids=["absent", "false"])
def test_failed_without_true_failed_condition_falls_back_to_the_phase(
        argocd: ArgoCD, conditions: tuple[Condition, ...]) -> None:
    assert argocd.health(run(Phase.FAILED, "trainer gone", conditions)) == ("Degraded",
                                                                            "Failed: trainer gone")


def test_unknown_phase_is_unknown(argocd: ArgoCD) -> None:
    obj = run(Phase.RUNNING)
    obj["status"]["phase"] = "Hibernating"
    assert argocd.health(obj) == ("Unknown", "Unknown phase Hibernating")


@pytest.mark.parametrize(("phase", "status", "prefix"), [
    (Phase.RUNNING, "Progressing", "Running: training: step 42/100"),
    (Phase.SUCCEEDED, "Healthy", "Succeeded: training: step 42/100"),
], ids=str)
def test_reward_collapse_is_a_warning_in_the_message(argocd: ArgoCD, phase: Phase, status: str,
                                                     prefix: str) -> None:
    obj = run(phase, "training: step 42/100", (condition("Progressing", True, "Training"), COLLAPSE))
    assert argocd.health(obj) == (status, f"{prefix}; RewardCollapse: ZeroVarianceGroups: "
                                           "95% of groups had equal rewards for 5 consecutive steps")


def test_reward_collapse_cleared_is_not_mentioned(argocd: ArgoCD) -> None:
    obj = run(Phase.RUNNING, "training: step 43/100",
              (condition("RewardCollapse", False, "RewardsVary"),))
    assert argocd.health(obj) == ("Progressing", "Running: training: step 43/100")


def test_a_run_being_deleted_shows_argo_cds_own_pending_deletion(argocd: ArgoCD) -> None:
    # gitops-engine answers for an object with a deletionTimestamp before any Lua runs, so the
    # operator's Terminating message is never shown for a deleted run.
    obj = run(Phase.TERMINATING, "deleting the run's resources")
    obj["metadata"] |= {"deletionTimestamp": "2025-01-01T00:00:00Z", "finalizers": [FINALIZER]}
    assert argocd.health(obj) == ("Progressing", "Pending deletion")


CRDS = sorted((REPO / "crds").glob("*.yaml"))


@pytest.mark.parametrize("crd_path", CRDS, ids=lambda p: p.name)
def test_argocd_cm_patch_embeds_each_script_verbatim(crd_path: Path) -> None:
    patch = yaml.safe_load(PATCH.read_text())
    crd = yaml.safe_load(crd_path.read_text())["spec"]
    key = f"resource.customizations.health.{crd['group']}_{crd['names']['kind']}"
    script = ARGOCD / f"health-{crd['names']['singular']}.lua"
    assert (patch["kind"], patch["metadata"]["name"]) == ("ConfigMap", "argocd-cm")
    assert patch["data"][key] == script.read_text(), (
        f"argocd-cm-patch.yaml drifted from {script.name}; re-embed it indented by four spaces "
        "under the data key")


def test_argocd_cm_patch_keeps_the_safe_libraries() -> None:
    # The Helm form in docs/gitops.md installs only the scripts, so they must work without
    # useOpenLibs; the patch does not set it either, and the tests above run what it installs.
    patch = yaml.safe_load(PATCH.read_text())
    assert [k for k in patch["data"] if k.startswith("resource.customizations.useOpenLibs.")] == []


def test_application_ignores_status_only() -> None:
    app = yaml.safe_load((ARGOCD / "application.yaml").read_text())
    kinds = [yaml.safe_load(p.read_text())["spec"] for p in CRDS]
    assert app["kind"] == "Application"
    assert app["spec"]["ignoreDifferences"] == [
        {"group": crd["group"], "kind": crd["names"]["kind"], "jsonPointers": ["/status"]}
        for crd in sorted(kinds, key=lambda c: c["names"]["kind"])]
