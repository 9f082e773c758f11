"""The `mtrl` command's dispatcher: each subcommand loads only its own module, and one whose
libraries this installation lacks says which extra installs them (an image holds only what it
runs: docs/images.md)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from mtrl_cli.main import DELEGATES, MISSING, main


def _drop(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make `modules` unimportable, and forget what imported them, as in an image without them."""
    for name in list(sys.modules):
        if name.split(".")[0] in (*modules, "mtrl_worker") or \
                (name.startswith("mtrl_cli.") and name != "mtrl_cli.main"):
            monkeypatch.delitem(sys.modules, name)
            parent, _, child = name.rpartition(".")
            if parent in sys.modules:  # `from package import child` reads the attribute first
                monkeypatch.delattr(sys.modules[parent], child, raising=False)
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ModuleNotFoundError


def test_a_subcommand_without_its_libraries_names_the_extra(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _drop(monkeypatch, "lightkube")
    assert main(["runs"]) == MISSING
    err = capsys.readouterr().err
    assert err.startswith("mtrl runs: needs lightkube, which is not installed")
    assert "'cli' extra" in err


def test_a_subcommand_of_another_image_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _drop(monkeypatch, "mtrl_worker")
    assert main(["worker", "--help"]) == MISSING
    assert "does not include mtrl_worker" in capsys.readouterr().err


def test_every_subcommand_names_an_extra_of_the_distribution() -> None:
    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    assert {extra for _, extra, _ in DELEGATES.values()} <= set(extras)


def test_the_dispatcher_loads_no_subcommand_it_is_not_asked_for() -> None:
    code = ("import sys; from mtrl_cli import main; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('lightkube', 'kopf', 'aiohttp', 'mtrl_operator', 'mtrl_worker', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"
