"""`mtrl env list`: every registered environment with its summary, parameters and components."""

from __future__ import annotations

import pytest

from mtrl_worker.catalog import list_main
from mtrl_worker.environments.registry import available


def blocks(capsys: pytest.CaptureFixture[str]) -> dict[str, list[str]]:
    assert list_main([]) == 0
    out = capsys.readouterr().out
    return {block.split(":", 1)[0]: block.splitlines() for block in out.split("\n\n")}


def test_every_environment_is_listed(capsys) -> None:
    assert sorted(blocks(capsys)) == available() == ["coding", "target", "wordle"]


def test_an_environment_shows_its_summary_parameters_and_components(capsys) -> None:
    wordle = blocks(capsys)["wordle"]
    assert wordle[0] == "wordle: Wordle: find a secret five-letter word in six guesses."
    assert wordle[1] == "  parameters: max_guesses=6"
    assert wordle[2] == "  generates tasks: yes"
    components = [line.split()[:4] for line in wordle[4:]]
    assert components[0] == ["solved", "outcome", "1", "[0,"]
    assert ["invalid_guesses", "penalty", "0.15", "[-1,"] in components
    assert len(components) == 6


def test_a_broken_plug_in_does_not_hide_the_others(capsys, monkeypatch) -> None:
    import mtrl_worker.catalog as catalog

    real = catalog.environment_class

    def broken(name: str) -> type:
        if name == "coding":
            raise ImportError("no module named sandbox")
        return real(name)

    monkeypatch.setattr(catalog, "environment_class", broken)
    listed = blocks(capsys)
    assert listed["coding"] == ["coding: unavailable: no module named sandbox"]
    assert listed["wordle"][1] == "  parameters: max_guesses=6"
