"""The test bed's files are named by absolute paths: kubeconfigs name certificate files, and
client-go reads a relative one relative to the kubeconfig's own folder (`make dev-up` passes
`.cluster`, which then became `.cluster/.cluster/pki/...`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtrl_testbed.cluster import LocalCluster


def test_a_relative_root_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cluster = LocalCluster(Path(".cluster"), bin_dir=tmp_path)
    assert cluster.root == tmp_path / ".cluster"
    assert cluster.kubeconfig.is_absolute()
