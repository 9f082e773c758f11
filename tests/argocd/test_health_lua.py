"""The Argo CD health check for MultiTurnRLRun, run by a real Lua interpreter over statuses
built from the operator's own status models (the trigger's is in test_trigger_health_lua.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtrl_operator.api.run import Condition, MultiTurnRLRunStatus, Phase

lupa = pytest.importorskip("lupa")

REPO = Path(__file__).resolve().parents[2]
ARGOCD = REPO / "manifests" / "argocd"
SCRIPT = ARGOCD / "health-multiturnrlrun.lua"
CRD = REPO / "crds" / "mtrl.dev_multiturnrlruns.yaml"
NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def _runtime() -> Any:
    # Argo CD embeds gopher-lua, a Lua 5.1; lupa ships 5.1 beside its default runtime.
    try:
        from lupa import lua51
    except ImportError:
        return lupa.LuaRuntime()
    return lua51.LuaRuntime()


def _to_lua(lua: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def health(obj: dict[str, Any], script: Path = SCRIPT) -> tuple[str, str]:
    """What Argo CD would show: the script's hs.status and hs.message."""
    lua = _runtime()
    lua.globals().obj = _to_lua(lua, obj)
    hs = lua.execute(script.read_text())
    return hs["status"], hs["message"]


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
def test_phase_maps_to_health(phase: Phase) -> None:
    obj, status, message = EXPECTED[phase]
    assert health(obj) == (status, message)


def test_no_status_waits_for_the_operator() -> None:
    assert health(run(None)) == ("Progressing", "Waiting for the operator")


def test_status_without_phase_waits_for_the_operator() -> None:
    obj = run(None)
    obj["status"] = {"conditions": []}
    assert health(obj) == ("Progressing", "Waiting for the operator")


@pytest.mark.parametrize("phase", [Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED, Phase.SUSPENDED], ids=str)
def test_stale_observed_generation_is_progressing(phase: Phase) -> None:
    obj = run(phase, "whatever the older spec led to", (FAILED,), generation=3, observed=2)
    assert health(obj) == ("Progressing",
                           "Waiting for the operator to observe generation 3 (last observed 2)")


def test_current_observed_generation_reports_the_phase() -> None:
    obj = run(Phase.SUCCEEDED, "trained 100 steps", generation=3, observed=3)
    assert health(obj) == ("Healthy", "Succeeded: trained 100 steps")


@pytest.mark.parametrize("conditions", [(), (condition("Failed", False, "NotFailed"),)],
                         ids=["absent", "false"])
def test_failed_without_true_failed_condition_falls_back_to_the_phase(
        conditions: tuple[Condition, ...]) -> None:
    assert health(run(Phase.FAILED, "trainer gone", conditions)) == ("Degraded", "Failed: trainer gone")


def test_unknown_phase_is_unknown() -> None:
    obj = run(Phase.RUNNING)
    obj["status"]["phase"] = "Hibernating"
    assert health(obj) == ("Unknown", "Unknown phase Hibernating")


@pytest.mark.parametrize(("phase", "status", "prefix"), [
    (Phase.RUNNING, "Progressing", "Running: training: step 42/100"),
    (Phase.SUCCEEDED, "Healthy", "Succeeded: training: step 42/100"),
], ids=str)
def test_reward_collapse_is_a_warning_in_the_message(phase: Phase, status: str, prefix: str) -> None:
    obj = run(phase, "training: step 42/100", (condition("Progressing", True, "Training"), COLLAPSE))
    assert health(obj) == (status, f"{prefix}; RewardCollapse: ZeroVarianceGroups: "
                                    "95% of groups had equal rewards for 5 consecutive steps")


def test_reward_collapse_cleared_is_not_mentioned() -> None:
    obj = run(Phase.RUNNING, "training: step 43/100",
              (condition("RewardCollapse", False, "RewardsVary"),))
    assert health(obj) == ("Progressing", "Running: training: step 43/100")


CRDS = sorted((REPO / "crds").glob("*.yaml"))


@pytest.mark.parametrize("crd_path", CRDS, ids=lambda p: p.name)
def test_argocd_cm_patch_embeds_each_script_verbatim(crd_path: Path) -> None:
    patch = yaml.safe_load((ARGOCD / "argocd-cm-patch.yaml").read_text())
    crd = yaml.safe_load(crd_path.read_text())["spec"]
    key = f"resource.customizations.health.{crd['group']}_{crd['names']['kind']}"
    script = ARGOCD / f"health-{crd['names']['singular']}.lua"
    assert (patch["kind"], patch["metadata"]["name"]) == ("ConfigMap", "argocd-cm")
    assert patch["data"][key] == script.read_text(), (
        f"argocd-cm-patch.yaml drifted from {script.name}; re-embed it indented by four spaces "
        "under the data key")


def test_application_ignores_status_only() -> None:
    app = yaml.safe_load((ARGOCD / "application.yaml").read_text())
    kinds = [yaml.safe_load(p.read_text())["spec"] for p in CRDS]
    assert app["kind"] == "Application"
    assert app["spec"]["ignoreDifferences"] == [
        {"group": crd["group"], "kind": crd["names"]["kind"], "jsonPointers": ["/status"]}
        for crd in sorted(kinds, key=lambda c: c["names"]["kind"])]
