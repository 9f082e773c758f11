"""A run's numbers in words: kubectl's ages, cut messages, step of total."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mtrl_cli.display import age, cut, step

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


def test_ages_read_as_kubectl_writes_them() -> None:
    ages = {timedelta(seconds=45): "45s", timedelta(seconds=119): "119s",
            timedelta(minutes=3, seconds=12): "3m12s", timedelta(minutes=5): "5m",
            timedelta(minutes=36): "36m", timedelta(hours=5, minutes=20): "5h20m",
            timedelta(hours=30): "30h", timedelta(days=2, hours=3): "2d3h",
            timedelta(days=20): "20d"}
    assert {d: age(NOW - d, NOW) for d in ages} == ages
    assert age(None, NOW) == "<unknown>"


def test_a_message_is_one_line_cut_with_an_ellipsis() -> None:
    assert cut("a  b\nc", 10) == "a b c"
    assert cut("x" * 30, 10) == "x" * 9 + "…"


def test_step_falls_back_to_the_spec_for_its_total() -> None:
    assert step({"status": {"progress": {"step": 4, "totalSteps": 10}}}) == "4/10"
    assert step({"spec": {"grpo": {"maxSteps": 3}}}) == "0/3"
    assert step({}) == "0"
