import json

import pytest

from mtrl_worker import play_main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = play_main(list(argv))
    return code, json.loads(capsys.readouterr().out)


def test_wordle_dry_run_prints_one_result(capsys) -> None:
    code, out = run(capsys, "wordle", "--secret", "crane", "--guess", "slate", "--guess", "crane")
    assert code == 0 and out["stop_reason"] == "done"
    metrics = {m["name"]: m for m in out["metrics_list"]}
    assert metrics["solved"] == {"name": "solved", "value": 1.0, "type": "Reward"}
    assert 0.9 < out["aggregate_reward_score"] <= 1.0


def test_invalid_guesses_are_penalised_not_a_crash(capsys) -> None:
    _, won = run(capsys, "wordle", "--secret", "crane", "--guess", "crane")
    code, out = run(capsys, "wordle", "--secret", "crane", "--guess", "xx", "--guess", "crane")
    metrics = {m["name"]: m["value"] for m in out["metrics_list"]}
    assert code == 0 and metrics["invalid_guess_count"] == 1 and metrics["episode_error"] == 0
    assert out["aggregate_reward_score"] < won["aggregate_reward_score"]


def test_running_out_of_script_ends_the_episode(capsys) -> None:
    code, out = run(capsys, "wordle", "--secret", "crane", "--guess", "slate")
    assert code == 0 and out["stop_reason"] == "policy_stopped"


def test_an_environment_error_is_a_result_with_a_failure_metric(capsys) -> None:
    code, out = run(capsys, "wordle", "--secret", "qqqqq", "--guess", "crane")
    metrics = {m["name"]: m["value"] for m in out["metrics_list"]}
    assert code == 1 and out["stop_reason"] == "error" and metrics["episode_error"] == 1
    assert out["aggregate_reward_score"] == 0.0


def test_other_environments_take_their_own_arguments(capsys) -> None:
    code, out = run(
        capsys,
        "coding",
        "--task",
        "median",
        "--ask",
        "what if it is empty?",
        "--reference",
        "--reward-range",
        "-1",
        "1",
    )
    assert code == 0 and out["aggregate_reward_score"] == pytest.approx(1.0)
    code, out = run(capsys, "target", "--target", "a", "--reply", "aab")
    assert code == 0 and out["aggregate_reward_score"] == pytest.approx(2 / 3)


def test_env_command_dispatches_to_play(capsys) -> None:
    from mtrl_worker.play import env_main

    assert env_main(["play", "wordle", "--secret", "crane", "--guess", "crane"]) == 0
    assert json.loads(capsys.readouterr().out)["stop_reason"] == "done"
