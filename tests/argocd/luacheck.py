"""What Argo CD shows for an object, from hack/luacheck: the health checks of an argocd-cm
ConfigMap run in gopher-lua v1.1.2 with the libraries Argo CD opens for them (no `string`,
`math` or `io` unless the ConfigMap sets `useOpenLibs`). hack/luacheck/argocd.go cites the Argo CD
code each step mirrors."""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ARGOCD = REPO / "manifests" / "argocd"
PATCH = ARGOCD / "argocd-cm-patch.yaml"
BUILD_SCRIPT = REPO / "hack" / "build-luacheck.sh"


def build() -> Path:
    """The harness binary, built once per machine (hack/build-luacheck.sh caches it)."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT.name} exited {out.returncode}: {out.stderr}")
    return Path(out.stdout.strip().splitlines()[-1])


def patch_data() -> dict[str, str]:
    """The `data` our argocd-cm patch merges into Argo CD's ConfigMap."""
    data: dict[str, str] = yaml.safe_load(PATCH.read_text())["data"]
    return data


@dataclass(frozen=True)
class Shown:
    """What Argo CD records for a resource: its health, and what it logs when the check failed
    (the health is then Unknown with the Lua error as its message)."""

    status: str
    message: str
    error: str | None = None


@dataclass(frozen=True)
class ArgoCD:
    """Argo CD's health assessment under a given argocd-cm (`data`, our patch by default)."""

    binary: Path
    workdir: Path

    def shown(self, obj: dict[str, Any], data: dict[str, str] | None = None) -> Shown | None:
        """The health Argo CD records for `obj`; None when no health check applies to its kind."""
        out = subprocess.run([str(self.binary), "-argocd-cm", str(self._configmap(data))],
                             input=json.dumps(obj), capture_output=True, text=True, check=False,
                             timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"luacheck exited {out.returncode}: {out.stderr}")
        result = json.loads(out.stdout)
        if result["health"] is None:
            return None
        return Shown(result["health"].get("status", ""), result["health"].get("message", ""),
                     result.get("error"))

    def health(self, obj: dict[str, Any], data: dict[str, str] | None = None) -> tuple[str, str]:
        """(status, message) as the Application's resource tree shows them."""
        shown = self.shown(obj, data)
        assert shown is not None, f"no health check for {obj['apiVersion']} {obj['kind']}"
        return shown.status, shown.message

    def _configmap(self, data: dict[str, str] | None) -> Path:
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "data": patch_data() if data is None else data}, sort_keys=True)
        path = self.workdir / f"argocd-cm-{hashlib.sha256(body.encode()).hexdigest()[:16]}.json"
        if not path.exists():
            path.write_text(body)
        return path
