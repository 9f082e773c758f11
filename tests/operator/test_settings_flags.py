"""`mtrl operator` flags stand for the variables named after them: read and checked alike."""

from __future__ import annotations

import pytest

from mtrl_operator.settings import Settings

# A value of each field's type that is not its default, as a variable or a flag spells it.
SAMPLES = {str: "other", list: "a, b", bool: "false", float: "1.5", int: "3"}
PRICES = "ml.g5.xlarge=1.408"


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_a_flag_and_its_variable_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(variable, raising=False)
    raw = PRICES if name == "instance_prices" else SAMPLES[type(getattr(Settings(), name))]
    from_env = Settings.from_env({Settings.variable(name): raw})
    from_flag = Settings.parse([f"--{name.replace('_', '-')}", raw])
    assert getattr(from_flag, name) == getattr(from_env, name) != getattr(Settings(), name)


def test_a_bad_value_stops_the_operator_with_one_line_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        Settings.parse(["--workers", "many"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "mtrl operator: error: MTRL_WORKERS: Input should be a valid integer, unable to parse "
        "string as an integer")
    monkeypatch.setenv("MTRL_LEADER_ELECT", "maybe")
    with pytest.raises(SystemExit):
        Settings.parse([])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "mtrl operator: error: MTRL_LEADER_ELECT: expected true or false, not 'maybe'")


def test_help_shows_each_description_and_the_variable_it_overrides(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTRL_WORKERS", "4")
    with pytest.raises(SystemExit):
        Settings.parse(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--workers MTRL_WORKERS runs reconciled at once (default: 4)" in text
    assert "--region AWS_REGION region of queues and ECS tasks" in text
    for name, field in Settings.model_fields.items():
        assert (field.description in text) == (name not in Settings.unadvertised)
