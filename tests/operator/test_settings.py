"""Operator settings: environment, flags on top, help for every flag but the failpoint."""

from __future__ import annotations

import pytest

from mtrl_operator.settings import Settings


def test_environment_then_flags() -> None:
    env = {"MTRL_OPERATOR_ID": "blue", "MTRL_ECS_SUBNETS": "subnet-1, subnet-2",
           "AWS_DEFAULT_REGION": "eu-west-1", "MTRL_LEADER_ELECT": "false",
           "MTRL_RENEW_DEADLINE_SECONDS": "7"}
    settings = Settings.from_env(env)
    assert (settings.operator_id, settings.ecs_subnets, settings.region) == (
        "blue", ["subnet-1", "subnet-2"], "eu-west-1")
    assert settings.leader_elect is False and settings.renew_deadline_seconds == 7.0
    assert settings.lease == ("default", "mtrl-operator-blue")


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTRL_WORKERS", "4")
    settings = Settings.parse(["--workers", "16", "--leader-elect", "true",
                               "--lease-namespace", "mtrl-system"])
    assert settings.workers == 16 and settings.leader_elect is True
    assert settings.lease == ("mtrl-system", "mtrl-operator-default")


def test_a_bad_boolean_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match="'maybe'"):
        Settings.from_env({"MTRL_LEADER_ELECT": "maybe"})


def test_every_flag_has_help_and_the_failpoint_is_not_advertised(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        Settings.parse(["--help"])
    text = capsys.readouterr().out
    assert "--crash-after-step" not in text
    for flag in ("--operator-id", "--lease-duration-seconds", "--retry-period-seconds"):
        assert flag in text
    assert "(default: 15.0)" in text


def test_identities_are_unique_per_process() -> None:
    settings = Settings(pod_name="mtrl-operator-7d9f")
    first, second = settings.new_identity(), settings.new_identity()
    assert first != second and first.startswith("mtrl-operator-7d9f_")


@pytest.mark.parametrize(("namespaces", "scope", "ours", "not_ours"), [
    ("", (True, []), ["team-a", "default"], []),
    ("team-a,team-b", (False, ["team-a", "team-b"]), ["team-a", "team-b"], ["team-c"]),
    # A glob is matched here, with kopf cluster-wide (docs/operator.md, "kopf").
    ("t-*,ml", (True, []), ["t-1", "t-", "ml"], ["team", "mlx", "xt-1"]),
])
def test_kopf_watches_exact_namespaces_and_the_operator_matches_globs(
        namespaces: str, scope: tuple[bool, list[str]], ours: list[str],
        not_ours: list[str]) -> None:
    settings = Settings.from_env({"MTRL_NAMESPACES": namespaces})
    assert settings.kopf_scope == scope
    assert [ns for ns in ours + not_ours if settings.watches(ns)] == ours
