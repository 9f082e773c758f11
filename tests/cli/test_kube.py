"""Where the commands look for a kubeconfig (kubectl's order), and a watch that outlives the
API server's history."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import Status
from lightkube.types import OnErrorAction

from mtrl_cli import kube
from mtrl_cli.errors import CliError


def test_the_flag_then_the_first_existing_kubeconfig_file_then_the_home_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, listed, flagged = tmp_path / "home", tmp_path / "listed", tmp_path / "flagged"
    (home / ".kube").mkdir(parents=True)
    for path in (home / ".kube" / "config", listed, flagged):
        path.write_text("{}")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{listed}")
    assert kube._kubeconfig_file(flagged) == flagged
    assert kube._kubeconfig_file(None) == listed
    monkeypatch.delenv("KUBECONFIG")
    assert kube._kubeconfig_file(None) == home / ".kube" / "config"
    with pytest.raises(CliError, match=r"kubeconfig .*absent does not exist"):
        kube._kubeconfig_file(tmp_path / "absent")


def test_a_watch_starts_again_only_when_its_version_is_too_old() -> None:
    def error(code: int) -> ApiError:
        return ApiError(status=Status(code=code, message="x"))

    assert kube._resume_when_too_old(error(410), 1).action is OnErrorAction.RETRY
    assert kube._resume_when_too_old(error(410), 4).action is OnErrorAction.RAISE
    assert kube._resume_when_too_old(error(500), 1).action is OnErrorAction.RAISE
