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
    assert registry.available() == ["coding", "guess", "target", "wordle"]


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


@pytest.mark.parametrize(("name", "args", "attribute", "value"), [
    ("wordle", {"max_guesses": "4"}, "max_guesses", 4),
    ("coding", {"test_timeout_s": "2.5", "memory_mb": "128"}, "test_timeout_s", 2.5),
    ("target", {"turns": "3"}, "turns", 3),
])
def test_environment_args_given_as_strings_are_converted(name: str, args: dict, attribute: str,
                                                         value: object) -> None:
    """spec.rollout.environmentArgs is a map of strings (the CRD's), and the operator passes it
    on as JSON: each built-in environment converts what it takes."""
    assert getattr(registry.load_environment(name, args), attribute) == value
