"""The harness runs health checks as Argo CD does: only the safe libraries unless argocd-cm sets
useOpenLibs, and Argo CD's reading of what a script returns or raises (hack/luacheck/argocd.go
cites the Argo CD code for each)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.argocd.luacheck import ArgoCD, Shown, patch_data

RUN_KEY = "mtrl.dev_MultiTurnRLRun"
# The stale-generation branch as it was when it broke under Argo CD.
STRING_FORMAT = '''local generation, observed = obj.metadata.generation, obj.status.observedGeneration
return { status = "Progressing", message = string.format(
  "Waiting for the operator to observe generation %d (last observed %d)", generation, observed) }
'''
STALE_RUN: dict[str, Any] = {
    "apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun",
    "metadata": {"name": "wordle", "namespace": "team-a", "generation": 3},
    "status": {"phase": "Running", "observedGeneration": 2}}


def configmap(script: str, open_libs: bool | None = None) -> dict[str, str]:
    """Our argocd-cm patch with the run's health check replaced by `script`."""
    data = {**patch_data(), f"resource.customizations.health.{RUN_KEY}": script}
    if open_libs is not None:
        data[f"resource.customizations.useOpenLibs.{RUN_KEY}"] = str(open_libs).lower()
    return data


@pytest.mark.parametrize("open_libs", [None, False], ids=["default", "false"])
def test_string_format_fails_without_open_libs(argocd: ArgoCD, open_libs: bool | None) -> None:
    error = "<string>:2: attempt to index a non-table object(nil) with key 'format'"
    assert argocd.shown(STALE_RUN, configmap(STRING_FORMAT, open_libs)) == Shown(
        "Unknown", error, f"failed to get resource health for team-a/wordle: {error}")


def test_use_open_libs_opens_string(argocd: ArgoCD) -> None:
    assert argocd.health(STALE_RUN, configmap(STRING_FORMAT, open_libs=True)) == (
        "Progressing", "Waiting for the operator to observe generation 3 (last observed 2)")


@pytest.mark.parametrize(("open_libs", "seen"), [
    (False, "string=nil math=nil io=nil os.execute=nil os.time=function table.concat=function "
            "ipairs=function tostring=function require=function"),
    (True, "string=table math=table io=table os.execute=function os.time=function "
           "table.concat=function ipairs=function tostring=function require=function"),
])
def test_the_libraries_argocd_opens(argocd: ArgoCD, open_libs: bool, seen: str) -> None:
    script = '''local seen = {}
for _, name in ipairs({"string", "math", "io"}) do
  table.insert(seen, name .. "=" .. type(_G[name]))
end
table.insert(seen, "os.execute=" .. type(os.execute))
table.insert(seen, "os.time=" .. type(os.time))
table.insert(seen, "table.concat=" .. type(table.concat))
table.insert(seen, "ipairs=" .. type(ipairs))
table.insert(seen, "tostring=" .. type(tostring))
table.insert(seen, "require=" .. type(require))
return { status = "Healthy", message = table.concat(seen, " ") }
'''
    assert argocd.health(STALE_RUN, configmap(script, open_libs)) == ("Healthy", seen)


def test_string_methods_are_missing_too(argocd: ArgoCD) -> None:
    shown = argocd.shown(STALE_RUN, configmap('return { status = ("%d"):format(1) }'))
    assert shown == Shown("Unknown", "<string>:1: attempt to index a non-table object(string) with "
                                     "key 'format'", shown and shown.error)


@pytest.mark.parametrize(("script", "expected"), [
    ('return { status = "Fine", message = "x" }', ("Unknown", "Lua returned an invalid health status")),
    ('return "Healthy"', ("Unknown", "expect table output from Lua script, not string")),
    ("return {}", ("", "")),
    ('return { status = "Healthy", message = 42 }', ("", "")),
    ("return nil", ("", "")),
])
def test_what_argocd_makes_of_the_returned_value(argocd: ArgoCD, script: str,
                                                 expected: tuple[str, str]) -> None:
    assert argocd.health(STALE_RUN, configmap(script)) == expected


def test_kinds_without_a_check_have_no_lua_health(argocd: ArgoCD) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}}
    assert argocd.shown(pod) is None
