from importlib.metadata import EntryPoint

import pytest

from mtrl_worker.environments import registry
from mtrl_worker.environments.target import TargetEnvironment
from mtrl_worker.environments.wordle import WordleEnvironment


class RenamedTarget(TargetEnvironment):
    name = "renamed"


def test_builtins_load_without_installed_entry_points(monkeypatch) -> None:
    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    assert isinstance(registry.load_environment("wordle"), WordleEnvironment)
    assert registry.available() == ["coding", "target", "wordle"]


def test_entry_points_are_discovered_and_take_precedence(monkeypatch) -> None:
    here = f"{__name__}:RenamedTarget"
    points = [EntryPoint("renamed", here, registry.GROUP), EntryPoint("wordle", here, registry.GROUP)]
    monkeypatch.setattr(registry, "entry_points", lambda group: points)
    assert "renamed" in registry.available()
    assert registry.environment_class("wordle") is RenamedTarget
    assert registry.load_environment("renamed", {"turns": 2}).turns == 2


def test_unknown_and_wrong_types_fail_clearly(monkeypatch) -> None:
    with pytest.raises(registry.UnknownEnvironment, match="available"):
        registry.environment_class("nope")
    points = [EntryPoint("bad", "json:dumps", registry.GROUP)]
    monkeypatch.setattr(registry, "entry_points", lambda group: points)
    with pytest.raises(TypeError, match="not an Environment"):
        registry.environment_class("bad")
