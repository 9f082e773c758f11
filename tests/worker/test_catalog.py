"""`mtrl env list`: every registered environment with its summary, parameters and components."""

from __future__ import annotations

import inspect

import pytest

from mtrl_api.environments import catalog
from mtrl_worker.catalog import CATALOG_PATH, catalog_main, list_main, render
from mtrl_worker.environments.registry import BUILTIN, available, environment_class


def blocks(capsys: pytest.CaptureFixture[str]) -> dict[str, list[str]]:
    assert list_main([]) == 0
    out = capsys.readouterr().out
    return {block.split(":", 1)[0]: block.splitlines() for block in out.split("\n\n")}


def test_every_environment_is_listed(capsys) -> None:
    assert sorted(blocks(capsys)) == available() == ["coding", "guess", "target", "wordle"]


def test_an_environment_shows_its_summary_parameters_and_components(capsys) -> None:
    wordle = blocks(capsys)["wordle"]
    assert wordle[0] == "wordle: Wordle: find a secret five-letter word in six guesses."
    assert wordle[1] == "  parameters: max_guesses=6 (an integer from 1 to 6)"
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
    assert listed["wordle"][1] == "  parameters: max_guesses=6 (an integer from 1 to 6)"


def test_the_catalog_the_operator_reads_is_fresh() -> None:
    """mtrl_api's environments.json is generated from the worker's declarations; the operator
    and the trainer trust it, so it must say what the worker does."""
    assert CATALOG_PATH.read_text() == render(), "stale: run `make crds`"
    assert catalog_main(["--check"]) == 0
    assert sorted(catalog()) == sorted(BUILTIN)


def test_the_stale_check_notices_a_changed_declaration(monkeypatch, tmp_path) -> None:
    import mtrl_worker.catalog as module

    stale = tmp_path / "environments.json"
    stale.write_text(render().replace('"maximum": 16.0', '"maximum": 17.0'))
    monkeypatch.setattr(module, "CATALOG_PATH", stale)
    assert catalog_main(["--check"]) == 1


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_declared_parameters_are_the_constructors(name: str) -> None:
    """Names and defaults of the declarations are those of the class's own arguments."""
    cls = environment_class(name)
    signature = {n: p.default for n, p in inspect.signature(cls).parameters.items()}
    assert cls.parameters is not None and cls.task_fields is not None
    assert {p.name: p.default for p in cls.parameters} == signature
