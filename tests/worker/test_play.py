import json

import pytest

from mtrl_worker.play import play_main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = play_main([*argv, "--json"])
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


@pytest.mark.parametrize("argv, says", [
    (["wordle", "--secret", "qqqqq", "--guess", "crane"], "secret 'qqqqq' is not in the word list"),
    (["wordle", "--secret", "crane", "--weights", '{"nope": 1}'], "unknown reward components ['nope']"),
    (["wordle", "--secret", "crane", "--env-args", '{"colour": 1}'], "--env-args: "),
    (["coding", "--task", "median", "--code-file", "/nonexistent/x.py"], "/nonexistent/x.py"),
], ids=["secret", "weights", "env-args", "code-file"])
def test_refused_arguments_are_one_line_and_exit_2(capsys, argv: list[str], says: str) -> None:
    for extra in ([], ["--json"]):
        assert play_main([*argv, *extra]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"mtrl env play {argv[0]}: ") and says in err


def test_the_summary_shows_each_guess_with_its_marks(capsys) -> None:
    code = play_main(["wordle", "--secret", "crane", "--guess", "slate", "--guess", "xx",
                      "--guess", "slate", "--guess", "crane"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[:5] == ['wordle {"secret": "crane"}',
                         "  slate  ⬛⬛🟩⬛🟩  --G-G",
                         "  xx     not a five-letter word from the list",
                         "  slate  guessed before",
                         "  crane  🟩🟩🟩🟩🟩  GGGGG"]
    assert lines[5].startswith("reward   0.8") and lines[-1] == "stop     done"
    assert "solved 1, speed 0.5," in lines[6]


def test_the_summary_of_other_environments_lists_the_replies(capsys) -> None:
    assert play_main(["target", "--target", "a", "--reply", "aab", "--reply", "unused"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # One turn: the target environment's episode takes one reply and ends.
    assert lines[:2] == ['target {"target": "a"}', "  1. aab"]
    assert lines[2].startswith("reward   0.667") and "target_fraction 0.667" in lines[3]


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


def test_env_command_dispatches_to_play_and_list(capsys) -> None:
    from mtrl_worker.play import env_main

    assert env_main(["play", "wordle", "--secret", "crane", "--guess", "crane", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stop_reason"] == "done"
    assert env_main(["list"]) == 0
    assert capsys.readouterr().out.startswith("coding: ")
    assert env_main(["nothing"]) == 2
