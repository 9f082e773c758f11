"""bench/learning_bench.py's statistics, as pure functions: the random-valid baseline, the
bootstrap intervals, a seed's summary from metrics.jsonl and eval.jsonl, and learning.json."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))  # the benches import as scripts

import learning_bench as bench


@pytest.mark.parametrize(("guesses", "span", "expected"), [(6, 20, 0.3), (5, 20, 0.25),
                                                           (1, 20, 0.05), (25, 20, 1.0)])
def test_the_random_valid_baseline_is_guesses_over_the_range(guesses: int, span: int,
                                                             expected: float) -> None:
    assert bench.random_valid_baseline(guesses, span) == pytest.approx(expected)


def test_the_baseline_is_what_random_distinct_guesses_win_in_the_game_itself() -> None:
    rng = random.Random(0)
    games = 20_000
    simulated = bench.simulate_random_valid(6, 20, games, rng)
    # 3.5 binomial standard deviations: sqrt(0.3 * 0.7 / 20000) = 0.0032
    assert abs(simulated - bench.random_valid_baseline(6, 20)) < 0.012, simulated


def test_bootstrap_intervals_hold_the_mean_and_shrink_with_more_games() -> None:
    rng = random.Random(1)
    few = [1.0, 0.0] * 10
    many = [1.0, 0.0] * 200
    lo, hi = bench.bootstrap_interval(few, rng, 2000)
    lo_many, hi_many = bench.bootstrap_interval(many, rng, 2000)
    assert lo < 0.5 < hi and lo_many < 0.5 < hi_many
    assert hi_many - lo_many < (hi - lo) / 2
    assert bench.bootstrap_interval([0.4] * 7, rng, 100) == pytest.approx((0.4, 0.4))


def test_the_paired_gain_interval_is_narrower_than_the_unpaired_one() -> None:
    """Games hard before stay hard after: pairing removes the game-to-game spread."""
    rng = random.Random(2)
    before = {g: (g % 10) / 10 for g in range(40)}
    after = {g: min(1.0, v + 0.1 + (0.05 if g % 2 else -0.05)) for g, v in before.items()}
    lo, hi = bench.paired_gain_interval(before, after, rng, 4000)
    assert 0.0 < lo < 0.1 < hi < 0.2
    b_lo, b_hi = bench.bootstrap_interval(list(before.values()), rng, 4000)
    assert hi - lo < (b_hi - b_lo) / 2
    # only the games both evaluations played count
    assert bench.paired_gain_interval({0: 0.0, 1: 0.0}, {1: 1.0, 2: 1.0}, rng, 100) == (1.0, 1.0)


def _lines(step: int, mode: str, wins: list[list[bool]], consistent: float,
           halving: float | None = None) -> list[dict[str, Any]]:
    """eval.jsonl's lines; without `halving`, as the trainer wrote them before plays carried
    their metrics."""
    return [{"step": step, "mode": mode, "task": task, "play": play, "success": won,
             "reward": float(won), "components": {"solved": float(won), "consistent": consistent},
             **({"metrics": {"turns": 6.0, "halving": halving}} if halving is not None else {})}
            for task, plays in enumerate(wins) for play, won in enumerate(plays)]


def test_per_game_means_over_plays_of_one_evaluation() -> None:
    lines = _lines(0, "sampled", [[True, False], [False, False]], 0.5) + _lines(
        0, "greedy", [[True], [True]], 1.0)
    assert bench.per_game(lines, 0, "sampled") == {0: 0.5, 1: 0.0}
    assert bench.per_game(lines, 0, "greedy") == {0: 1.0, 1: 1.0}
    assert bench.per_game(lines, 0, "greedy", "consistent") == {0: 1.0, 1: 1.0}
    assert bench.per_game(lines, 3, "greedy") == {}
    measured = _lines(0, "greedy", [[True], [False]], 1.0, halving=0.75)
    assert bench.per_game(measured, 0, "greedy", "halving") == {0: 0.75, 1: 0.75}


def test_the_halving_metric_is_summed_up_where_the_plays_report_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`consistent` cannot tell a player that halves from one that counts up inside the range;
    the `halving` metric can. Runs from before it was recorded still summarise, without it."""
    args = _args()
    lines = [*_lines(0, "greedy", [[False], [True]], 0.5, halving=0.4),
             *_lines(2, "greedy", [[True], [True]], 1.0, halving=0.9)]
    greedy = bench.mode_summary(lines, 0, 2, "greedy", random.Random(0), 100)
    assert (greedy["halving_before"], greedy["halving_after"]) == pytest.approx((0.4, 0.9))
    older = _seed(args, 0)
    assert "halving_before" not in older["greedy"]
    bench.table(args, [older, {**older, "seed": 1, "greedy": greedy}])
    rows = [line for line in capsys.readouterr().out.splitlines() if "| greedy |" in line]
    assert "| 0.250 -> 1.000 | - |" in rows[0] and "| 0.400 -> 0.900 |" in rows[1], rows


def _args(**changes: Any) -> Any:
    return bench.parser().parse_args(
        ["--steps", "2", "--validation", "4", "--resamples", "200",
         *[a for k, v in changes.items() for a in (f"--{k}", str(v))]])


def _seed(args: Any, seed: int) -> dict[str, Any]:
    """A seed's summary from the metrics and evaluation lines of a 2-step run."""
    metrics = [
        {"step": 0, "validationPassAtK": [{"k": 1, "value": 0.25}, {"k": 4, "value": 0.5}]},
        {"step": 1, "rewardMean": 0.1, "decodeSeconds": 2.0, "tokensPerSecond": 100.0},
        {"step": 2, "rewardMean": 0.3, "decodeSeconds": 2.0, "tokensPerSecond": 300.0,
         "validationPassAtK": [{"k": 1, "value": 0.75}, {"k": 4, "value": 1.0}]},
    ]
    lines = (_lines(0, "sampled", [[False] * 4, [True, False, False, False], [False] * 4,
                                   [False] * 4], 0.2)
             + _lines(0, "greedy", [[False], [False], [False], [True]], 0.25)
             + _lines(2, "sampled", [[True] * 4, [True, True, False, False], [False] * 4,
                                     [True] * 4], 0.8)
             + _lines(2, "greedy", [[True], [True], [True], [True]], 1.0))
    return bench.summary(args, seed, metrics, lines, seconds=90.0)


def test_a_seeds_summary_and_learning_json_have_the_shape_runs_are_compared_by() -> None:
    args = _args()
    seed = _seed(args, 5)
    greedy, sampled = seed["greedy"], seed["sampled"]
    assert (seed["seed"], seed["minutes"]) == (5, 1.5)
    assert (greedy["before"], greedy["after"]) == (0.25, 1.0)
    assert (sampled["before"], sampled["after"]) == (1 / 16, 10 / 16)
    assert greedy["after_interval"] == [1.0, 1.0]
    assert 0.0 < greedy["gain_interval"][0] <= 0.75 <= greedy["gain_interval"][1] <= 1.0
    assert (sampled["consistent_before"], sampled["consistent_after"]) == pytest.approx((0.2, 0.8))
    assert (sampled["games"], sampled["plays"], greedy["plays"]) == (4, 16, 4)
    assert seed["rewards"] == [[1, 0.1], [2, 0.3]] and seed["tokens_per_s"] == 200.0
    assert seed["pass_at_k"]["after"] == {1: 0.75, 4: 1.0}

    document = json.loads(json.dumps(bench.learning_json(args, [seed])))
    assert document["random_valid_baseline"] == 0.3
    (record,) = document["seeds"]
    for mode in ("greedy", "sampled"):
        assert {"before", "after", "after_interval", "gain_interval"} <= set(record[mode])
        assert len(record[mode]["after_interval"]) == len(record[mode]["gain_interval"]) == 2
    assert {"seed", "minutes"} <= set(record)


def test_the_bench_trains_with_turn_credit_and_evaluates_greedy_too() -> None:
    spec = bench.spec(_args(), seed=1)
    assert spec["grpo"]["advantageLevel"] == "turn" and spec["grpo"]["seed"] == 1
    assert spec["dataset"]["evalGreedy"] and spec["dataset"]["evalOnStart"]
    assert bench.parser().parse_args([]).seeds == [0, 1, 2]
    from mtrl_api.run import MultiTurnRLRunSpec

    MultiTurnRLRunSpec.model_validate(spec)  # a run the operator would accept
    trl = bench.spec(_args(engine="trl"), seed=1)  # TRL's credit, within TRL's limits
    assert (trl["trainer"]["engine"], trl["grpo"]["advantageLevel"]) == ("trl", "episode")
    MultiTurnRLRunSpec.model_validate(trl)
    # The settings that learned best are the defaults; a later --env-arg of a name wins.
    assert spec["rollout"]["environmentArgs"] == {
        "max_guesses": "6", "answers": "range", "consistent_reward": "0.12",
        "consistent_credit": "middle"}
    flat = bench.parser().parse_args(["--env-arg", "consistent_credit=inside"])
    assert bench.spec(flat, seed=0)["rollout"]["environmentArgs"]["consistent_credit"] == "inside"
    MultiTurnRLRunSpec.model_validate(bench.spec(flat, seed=0))
    setups = [bench.learning_json(a, [])["setup"] for a in (_args(), flat)]
    assert setups[0]["environment_args"]["consistent_credit"] == "middle"
    assert setups[1]["environment_args"] == {"answers": "range", "consistent_reward": "0.12",
                                             "consistent_credit": "inside"}
    with pytest.raises(SystemExit):
        bench.parser().parse_args(["--env-arg", "answers"])
    assert bench.outputs(_args()) == (Path("bench/results/learning.json"),
                                      Path("bench/learning.png"))
    assert bench.outputs(_args(engine="trl")) == (Path("bench/results/learning-trl.json"),
                                                  Path("bench/learning-trl.png"))


def test_seeds_run_one_at_a_time_add_up_in_learning_json(tmp_path: Path) -> None:
    """A seed run alone keeps the file's other seeds of the same setup; another setup's are
    not mixed in."""
    args = _args()
    path = tmp_path / "learning.json"
    assert bench.earlier_seeds(path, {}) == ([], 0.0)
    document = bench.learning_json(args, [{"seed": 0, "minutes": 40.0}])
    path.write_text(json.dumps({**document, "trainer_peak_rss_gib": 6.5}))
    assert bench.earlier_seeds(path, document["setup"]) == ([{"seed": 0, "minutes": 40.0}], 6.5)
    other = bench.learning_json(_args(**{"learning-rate": 1e-3}), [])["setup"]
    assert bench.earlier_seeds(path, other) == ([], 0.0)


def test_a_seed_read_back_from_learning_json_prints_in_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON turns pass@k's k into a string; the seeds read back are tabled like new ones."""
    args = _args()
    path = tmp_path / "learning.json"
    path.write_text(json.dumps(bench.learning_json(args, [_seed(args, 0)])))
    earlier, _ = bench.earlier_seeds(path, bench.learning_json(args, [])["setup"])
    bench.table(args, [*earlier, _seed(args, 1)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0 |")]
    assert len(rows) == 2 and "| 0.500 -> 1.000 |" in rows[1], rows  # pass@4 before -> after
