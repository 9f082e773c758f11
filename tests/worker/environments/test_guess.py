import asyncio
import itertools
import random
from pathlib import Path

import pytest

from mtrl_worker.environments.base import Completion, EpisodeLimits
from mtrl_worker.environments.guess import (
    TURN_CONSISTENT,
    TURN_VALID,
    GuessEnvironment,
    GuessGame,
    example_game,
    extract_guess,
    middle_credit,
)
from mtrl_worker.environments.registry import load_environment
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
    opening = len(policy.seen[0])  # the rules, the example game's turns, the new game
    assert "from 1 to 20" in policy.seen[0][0] and opening == 11
    assert [len(turn) - opening for turn in policy.seen[1:]] == [2, 4, 6]
    assert [turn[-1] for turn in policy.seen[1:]] == [
        "Higher. 5 guesses left.", "Lower. 4 guesses left.", "Lower. 3 guesses left."]
    score = episode.score()
    assert score.components == {"solved": 1.0, "speed": 0.5, "consistent": 1.0,
                                "invalid_or_repeated": 0.0}
    clean = TURN_VALID + TURN_CONSISTENT
    assert score.turn_rewards == pytest.approx([clean, clean, clean, clean + 1 + 3 / 6])


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
    # each reply its own credit: nothing for the invalid and repeated ones, less for the
    # guess that ignored "Lower."
    clean = TURN_VALID + TURN_CONSISTENT
    assert game.score().turn_rewards == pytest.approx([0, 0, clean, 0, TURN_VALID, clean])


def test_the_guess_is_the_first_number_in_range() -> None:
    assert extract_guess("Let's start with 72, then 80.", 70, 89) == 72
    assert extract_guess("Out of 100 I pick 75", 70, 89) == 75
    assert extract_guess("I pick 95 of 100", 70, 89) == 100  # none in range: told so
    assert extract_guess("no idea", 70, 89) is None
    # the range restated is no guess; a guess beside it is
    assert extract_guess("I'm thinking of a number from 70 to 89.", 70, 89) is None
    assert extract_guess("A number between 70 and 89: 75", 70, 89) == 75
    assert extract_guess("70-89? I say 80", 70, 89) == 80
    assert extract_guess("70 to 80", 70, 89) == 70  # not the range


@pytest.mark.parametrize("reply", [
    "79", "79.", "You: 79", "**79**", "My guess is 79.", "Guess: 79 (from 70 to 89)",
    "You: 79\nMe: Higher. 5 guesses left.\nYou: 84",  # a small model playing on, as the example
])
def test_replies_in_the_shape_of_the_prompt_and_its_example_are_read(reply: str) -> None:
    assert extract_guess(reply, 70, 89) == 79


def test_the_opening_states_the_rules_then_plays_an_example_game_as_chat_turns() -> None:
    episode = GuessEnvironment().episode({"secret": "50", "low": "37", "high": "56"},
                                         EpisodeLimits(16, 10_000))
    rules, *example, again = episode.opening
    assert rules.role == "user" and "from 37 to 56" in rules.content
    assert "at most 6 tries" in rules.content and '"Higher." (my number is bigger)' in rules.content
    # The example (secret 42, not this game's 50) as the assistant's guesses and the game's
    # answers, in turns: what the model copies its reply format from.
    assert [(m.role, m.content) for m in example] == [
        ("assistant", "46"), ("user", "Lower. 5 guesses left."), ("assistant", "41"),
        ("user", "Higher. 4 guesses left."), ("assistant", "43"),
        ("user", "Lower. 3 guesses left."), ("assistant", "42")]
    assert (again.role, again.content) == (
        "user", "Correct! Let's play again: a new number from 37 to 56. Your first guess?")


def test_docs_show_exactly_what_the_model_sees() -> None:
    docs = (Path(__file__).parents[3] / "docs" / "environments.md").read_text()
    shown = docs.split("### `guess`")[1].split("```text\n")[1].split("\n```")[0]
    episode = GuessEnvironment().episode({"secret": "12", "low": "1", "high": "20"},
                                         EpisodeLimits(16, 10_000))
    assert shown == "\n".join(f"{m.role}: {m.content}" for m in episode.opening)


@pytest.mark.parametrize("secret", range(1, 21))
def test_the_example_is_won_by_halving_and_never_gives_the_secret_away(secret: int) -> None:
    example_secret, moves = example_game(1, 20, secret, 6)
    assert example_secret != secret
    answers = [answer for _, answer in moves]
    assert answers[-1] == "Correct!" and len(moves) >= 3  # it shows more than one answer
    assert moves[-1][0] == example_secret
    assert any("Higher." in a for a in answers) and any("Lower." in a for a in answers)


def test_range_answers_state_what_is_left_in_the_game_and_its_example() -> None:
    game = GuessGame(secret=7, low=1, high=20, max_guesses=6, answers="range")
    assert game.play("10") == "Lower. It is from 1 to 9. 5 guesses left."
    assert game.play("15") == "Lower. It is from 1 to 9. 4 guesses left."  # ignored: no change
    assert game.play("ten") == "Reply with just one whole number from 1 to 20. 3 guesses left."
    assert game.play("6") == "Higher. It is from 7 to 9. 2 guesses left."
    assert game.play("8") == "Lower. It is 7. 1 guesses left."
    assert game.play("7") == "Correct!" and game.solved
    _, moves = example_game(1, 20, 12, 6, answers="range")
    assert moves[0][1] == "Higher. It is from 11 to 20. 5 guesses left."
    assert all(" It is " in answer for _, answer in moves[:-1]) and moves[-1][1] == "Correct!"
    opening = GuessEnvironment(answers="range").episode(
        {"secret": "12", "low": "1", "high": "20"}, EpisodeLimits(6, 1000)).opening
    assert opening[2].content == "Higher. It is from 11 to 20. 5 guesses left."


def test_the_consistency_reward_is_an_argument_bounded_by_the_speed_step() -> None:
    env = load_environment("guess", {"max_guesses": "6", "consistent_reward": "0.12"})
    episode = env.episode({"secret": "12", "low": "1", "high": "20"}, EpisodeLimits(6, 1000))
    episode.game.play("10")
    episode.game.play("5")  # below the range "Higher." left: valid, new, not consistent
    assert episode.game.turn_rewards == pytest.approx([TURN_VALID + 0.12, TURN_VALID])
    with pytest.raises(ValueError, match=r"^consistent_reward must be below 0.06 when "
                                         r"max_guesses is 10, not 0.12$"):
        load_environment("guess", {"max_guesses": "10", "consistent_reward": "0.12"})
    with pytest.raises(ValueError, match=r"below 0.126667 when max_guesses is 6, not 0.13"):
        load_environment("guess", {"consistent_reward": "0.13"})  # max_guesses by default
    with pytest.raises(ValueError, match="answers"):
        load_environment("guess", {"answers": "colour"})


def test_middle_credit_pays_halving_what_is_left() -> None:
    assert [middle_credit(g, 11, 20) for g in range(10, 22)] == \
        [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]  # even: both middles
    assert [middle_credit(g, 1, 5) for g in range(1, 6)] == [0.0, 0.5, 1.0, 0.5, 0.0]
    assert middle_credit(7, 7, 7) == middle_credit(7, 7, 8) == middle_credit(8, 7, 8) == 1.0
    env = load_environment("guess", {"consistent_reward": "0.12", "consistent_credit": "middle",
                                     "answers": "range"})
    game = env.episode({"secret": "12", "low": "1", "high": "20"}, EpisodeLimits(6, 1000)).game
    # 1-20: the middle; 11-20: its end; 11-19: halfway out; 11-16: outside, then a middle.
    for reply in ("10", "20", "17", "3", "13", "12"):
        game.play(reply)
    assert game.turn_rewards == pytest.approx([
        TURN_VALID + 0.12, TURN_VALID, TURN_VALID + 0.06, TURN_VALID, TURN_VALID + 0.12,
        TURN_VALID + 0.12 + 1 + 1 / 6])
    # the `halving` metric: the mean middle credit of the valid guesses, under either credit
    assert game.score().metrics["halving"] == pytest.approx((1 + 0 + 0.5 + 0 + 1 + 1) / 6)
    inside = GuessGame(12, 1, 20, answers="range")
    for reply in ("10", "x", "20", "20", "17", "13"):  # invalid and repeated: no guess
        inside.play(reply)
    assert inside.score().metrics["halving"] == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    assert GuessGame(12, 1, 20).score().metrics["halving"] == 0.0  # no guess yet
    with pytest.raises(ValueError, match="consistent_credit must be one of inside, middle"):
        load_environment("guess", {"consistent_credit": "edge"})


def _random_game(rng: random.Random, max_guesses: int, consistent_reward: float = TURN_CONSISTENT,
                 consistent_credit: str = "inside") -> GuessGame:
    low = rng.randint(1, 81)
    game = GuessGame(low + rng.randrange(20), low, low + 19, max_guesses,
                     consistent_reward=consistent_reward, consistent_credit=consistent_credit)
    while not game.over:
        allowed = range(game.allowed[0], game.allowed[1] + 1)
        game.play(rng.choice(["x", "0", str(rng.randint(low - 2, low + 21)),
                              str(rng.choice(allowed)), str(allowed[len(allowed) // 2])]))
    return game


@pytest.mark.parametrize("max_guesses", [1, 2, 6, 10])
def test_a_faster_win_beats_a_slower_one_and_any_win_beats_a_loss(max_guesses: int) -> None:
    rng = random.Random(max_guesses)
    wins: dict[int, list[float]] = {}
    losses: list[float] = []
    for _ in range(20_000):
        game = _random_game(rng, max_guesses)
        total, _ = compose(game.score(), GuessEnvironment.components, WEIGHTS, (0.0, 1.0))
        (wins.setdefault(game.turns, []) if game.solved else losses).append(total)
    lengths = sorted(wins)
    assert len(lengths) == max_guesses  # every win length was played
    for faster, slower in itertools.pairwise(lengths):
        assert min(wins[faster]) > max(wins[slower])
    assert min(wins[lengths[-1]]) > max(losses)


@pytest.mark.parametrize(("max_guesses", "consistent_reward", "consistent_credit"),
                         [(1, TURN_CONSISTENT, "inside"), (2, TURN_CONSISTENT, "inside"),
                          (6, TURN_CONSISTENT, "inside"), (10, TURN_CONSISTENT, "inside"),
                          (6, 0.12, "inside"), (10, 0.05, "inside"), (6, 0.12, "middle"),
                          (10, 0.05, "middle")])
def test_turn_rewards_summed_over_a_game_rank_any_win_over_any_loss(
        max_guesses: int, consistent_reward: float, consistent_credit: str) -> None:
    """What a game's first turn is credited with under return-to-go: a win beats a loss
    however it was played; and a win in fewer turns beats one in more where every guess earned
    the full turn reward, valid, new and consistent (and, with middle credit, at the middle of
    what was left). A slower game with better turns may earn more than a faster one with worse:
    that is the credit."""
    rng = random.Random(100 + max_guesses)
    wins: dict[int, list[float]] = {}
    clean_wins: dict[int, list[float]] = {}
    losses: list[float] = []
    for _ in range(20_000):
        game = _random_game(rng, max_guesses, consistent_reward, consistent_credit)
        turn_rewards = game.score().turn_rewards
        assert turn_rewards is not None and len(turn_rewards) == game.turns
        total = sum(turn_rewards)
        if not game.solved:
            losses.append(total)
            continue
        wins.setdefault(game.turns, []).append(total)
        win = 1 + (max_guesses - game.turns + 1) / max_guesses
        if total - win == pytest.approx(game.turns * (TURN_VALID + consistent_reward)):
            clean_wins.setdefault(game.turns, []).append(total)
    assert min(min(w) for w in wins.values()) > max(losses)
    lengths = sorted(clean_wins)
    # Long games without a slip are rare at random; halving finds one of 20 within 5 guesses.
    assert len(lengths) >= min(max_guesses, 7 if consistent_credit == "inside" else 5)
    for faster, slower in itertools.pairwise(lengths):
        assert min(clean_wins[faster]) > max(clean_wins[slower])


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
