import asyncio
import itertools
import random

import pytest

from mtrl_worker.environments.base import Completion, EpisodeLimits
from mtrl_worker.environments.guess import GuessEnvironment, GuessGame, extract_guess
from mtrl_worker.rewards import compose, resolve_weights

WEIGHTS = resolve_weights(GuessEnvironment.components, {})


class ScriptPolicy:
    openai_base_url = None
    api_key = "k"

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.seen: list[list[str]] = []

    async def chat(self, messages, **_: object) -> Completion:
        self.seen.append([m.content for m in messages])
        return Completion(self.replies.pop(0), "stop", [], [])


def test_binary_search_wins_and_the_answers_guide_it() -> None:
    policy = ScriptPolicy(["I guess 10.", "15", "My guess: 13", "12"])
    episode = GuessEnvironment().episode({"secret": "12", "low": "1", "high": "20"},
                                         EpisodeLimits(10, 10_000))
    asyncio.run(episode.play(policy))
    assert "from 1 to 20" in policy.seen[0][0] and len(policy.seen[0]) == 1
    assert [turn[-1] for turn in policy.seen[1:]] == [
        "Higher. 5 guesses left.", "Lower. 4 guesses left.", "Lower. 3 guesses left."]
    score = episode.score()
    assert score.components == {"solved": 1.0, "speed": 0.5, "consistent": 1.0,
                                "invalid_or_repeated": 0.0}


def test_invalid_repeated_and_inconsistent_guesses_are_told_and_scored() -> None:
    game = GuessGame(secret=7, low=1, high=20, max_guesses=6)
    assert game.play("ten") == "Reply with just one whole number from 1 to 20. 5 guesses left."
    assert game.play("25") == "Reply with just one whole number from 1 to 20. 4 guesses left."
    assert game.play("10") == "Lower. 3 guesses left."
    assert game.play("10") == "You guessed 10 before. 2 guesses left."
    assert game.play("15") == "Lower. 1 guesses left."  # ignores "lower": inconsistent
    assert game.play("3") == "Higher. 0 guesses left."
    assert game.over and not game.solved
    assert game.score().components == pytest.approx({
        "solved": 0.0, "speed": 0.0, "consistent": 2 / 3, "invalid_or_repeated": -3 / 6})


def test_the_guess_is_the_first_number_in_range() -> None:
    assert extract_guess("Let's start with 72, then 80.", 70, 89) == 72
    assert extract_guess("Out of 100 I pick 75", 70, 89) == 75
    assert extract_guess("I pick 95 of 100", 70, 89) == 100  # none in range: told so
    assert extract_guess("no idea", 70, 89) is None


def _random_game(rng: random.Random, max_guesses: int) -> tuple[int, bool, float]:
    low = rng.randint(1, 81)
    game = GuessGame(low + rng.randrange(20), low, low + 19, max_guesses)
    while not game.over:
        game.play(rng.choice(["x", "0", str(rng.randint(low - 2, low + 21)),
                              str(rng.choice(range(game.allowed[0], game.allowed[1] + 1)))]))
    total, _ = compose(game.score(), GuessEnvironment.components, WEIGHTS, (0.0, 1.0))
    return game.turns, game.solved, total


@pytest.mark.parametrize("max_guesses", [1, 2, 6, 10])
def test_a_faster_win_beats_a_slower_one_and_any_win_beats_a_loss(max_guesses: int) -> None:
    rng = random.Random(max_guesses)
    wins: dict[int, list[float]] = {}
    losses: list[float] = []
    for _ in range(20_000):
        turns, solved, total = _random_game(rng, max_guesses)
        (wins.setdefault(turns, []) if solved else losses).append(total)
    lengths = sorted(wins)
    assert len(lengths) == max_guesses  # every win length was played
    for faster, slower in itertools.pairwise(lengths):
        assert min(wins[faster]) > max(wins[slower])
    assert min(wins[lengths[-1]]) > max(losses)


def test_generated_tasks_hold_out_a_tenth_and_repeat_in_a_fixed_order() -> None:
    train = GuessEnvironment.generate_tasks(5000, "train")
    validation = GuessEnvironment.generate_tasks(200, "validation")
    key = lambda t: (t["low"], t["secret"])  # noqa: E731
    assert not {key(t) for t in train} & {key(t) for t in validation}
    assert len({key(t) for t in validation}) == 162  # a tenth of 81 ranges x 20 secrets
    assert train == GuessEnvironment.generate_tasks(5000, "train")
    for task in train[:50]:
        assert int(task["low"]) <= int(task["secret"]) <= int(task["high"]) == int(task["low"]) + 19


def test_a_secret_outside_its_range_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not in \[1, 20\]"):
        GuessEnvironment().episode({"secret": "30"}, EpisodeLimits(6, 1000))
