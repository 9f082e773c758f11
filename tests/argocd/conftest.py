"""The Argo CD health-check runtime (hack/luacheck), built once per machine."""

from __future__ import annotations

import pytest

from tests.argocd.luacheck import ArgoCD, build


@pytest.fixture(scope="session")
def argocd(tmp_path_factory: pytest.TempPathFactory) -> ArgoCD:
    return ArgoCD(build(), tmp_path_factory.mktemp("argocd"))
