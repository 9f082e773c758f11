"""Wordle rules and the reward-order promise, checked over the whole shipped word list."""

import itertools
from collections import defaultdict
from collections.abc import Sequence
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_worker.environments.base import EpisodeLimits
from mtrl_worker.environments.wordle import (
    WordleEnvironment,
    WordleGame,
    extract_guess,
    feedback,
    word_list,
)
from mtrl_worker.rewards import compose, resolve_weights

WORDS = word_list()
WEIGHTS = resolve_weights(WordleEnvironment.components, {})


def reward(secret: str, replies: Sequence[str]) -> tuple[float, WordleGame]:
    game = WordleGame(secret)
    for reply in replies:
        if game.over:
            break
        game.play(reply)
    aggregate, _ = compose(game.score(), WordleEnvironment.components, WEIGHTS, (0.0, 1.0))
    return aggregate, game


def rank(game: WordleGame) -> tuple[int, int]:
    """Outcome order: a win in fewer turns > a win in more > a loss > no valid guess."""
    if game.solved:
        return (3, -game.turns)
    return (2, 0) if game.guesses else (1, 0)


def test_word_list_is_a_few_thousand_distinct_five_letter_words() -> None:
    assert len(WORDS) >= 2000
    assert len(set(WORDS)) == len(WORDS)
    assert all(len(w) == 5 and w.isascii() and w.isalpha() and w.islower() for w in WORDS)
    assert {"crane", "slate"} <= set(WORDS)


@pytest.mark.parametrize(
    ("guess", "secret", "marks"),
    [
        ("crane", "crane", "GGGGG"),
        ("slate", "crane", "--G-G"),
        ("speed", "crepe", "-YGY-"),  # two e's guessed, two unclaimed in the secret
        ("eerie", "there", "Y-Y-G"),  # the green e claims one; only one yellow e is left
        ("geese", "those", "---GG"),  # three e's, one in the secret: the green claims it
        ("allay", "loyal", "-YYGY"),  # the green a leaves no a for the first one
        ("abbey", "babes", "YYGG-"),
        ("lolly", "hello", "-YGG-"),  # both l's of the secret are claimed by greens
    ],
)
def test_feedback_handles_duplicate_letters(guess: str, secret: str, marks: str) -> None:
    assert feedback(guess, secret) == marks


@pytest.mark.parametrize(
    ("reply", "guess"),
    [
        ("I think <guess>Crane</guess>", "crane"),
        ("<guess>slate</guess> no wait <guess>crane</guess>", "crane"),
        ("my guess is slate.", "slate"),
        ("", ""),
    ],
)
def test_extract_guess(reply: str, guess: str) -> None:
    assert extract_guess(reply) == guess


def test_invalid_and_repeated_guesses_consume_turns_and_are_penalised() -> None:
    game = WordleGame("crane")
    assert "not a valid guess" in game.play("xyzzy")
    assert "not a valid guess" in game.play("cranes")
    game.play("slate")
    assert "already guessed" in game.play("slate")
    assert (game.turns, game.invalid, game.repeated, game.guesses) == (4, 2, 1, ["slate"])
    components = game.score().components
    assert components["invalid_guesses"] == pytest.approx(-2 / 6)
    assert components["repeated_guesses"] == pytest.approx(-1 / 6)


def test_the_game_ends_after_six_turns() -> None:
    game = WordleGame("crane")
    for _ in range(6):
        game.play("slate")
    assert game.over and not game.solved
    with pytest.raises(RuntimeError):
        game.play("crane")


def test_turn_limit_of_the_run_caps_the_guesses() -> None:
    episode = WordleEnvironment().episode({"secret": "crane"}, EpisodeLimits(3, 1000))
    assert episode.game.max_guesses == 3


# -- adversarial episodes ---------------------------------------------------------------------


@cache
def _neighbours() -> dict[str, list[str]]:
    """Words sharing a letter pattern with one or two positions free."""
    index: dict[str, list[str]] = defaultdict(list)
    for word in WORDS:
        for free in itertools.chain(itertools.combinations(range(5), 1), itertools.combinations(range(5), 2)):
            index["".join("?" if i in free else c for i, c in enumerate(word))].append(word)
    return index


def closest(secret: str, n: int) -> list[str]:
    """Up to n words, not the secret, with the most greens against it (a near-win loss)."""
    index = _neighbours()
    found: dict[str, None] = {}
    for free in itertools.chain(itertools.combinations(range(5), 1), itertools.combinations(range(5), 2)):
        pattern = "".join("?" if i in free else c for i, c in enumerate(secret))
        for word in index[pattern]:
            if word != secret:
                found[word] = None
    fillers = [w for w in WORDS if w != secret and w not in found]
    return (list(found) + fillers)[:n]


def other_words(secret: str, n: int) -> list[str]:
    return [w for w in WORDS[: n + 1] if w != secret][:n]


INVALID = ["zzzzz", "crane!!", "abcd", "", "hello world", "qwxyz"]


def test_reward_order_holds_for_every_secret_in_the_word_list() -> None:
    """Deterministic sweep: the extreme episodes of each outcome class, for every secret."""
    for secret in WORDS:
        worst_wins = []
        for k in range(1, 7):
            # the most penalised win in k turns: k-1 invalid or repeated guesses first
            invalid = reward(secret, ["zzzzz"] * (k - 1) + [secret])[0]
            first = other_words(secret, 1)
            repeated = reward(secret, first * (k - 1) + [secret])[0]
            worst_wins.append(min(invalid, repeated))
        best_wins = [reward(secret, [*other_words(secret, k - 1), secret])[0] for k in range(1, 7)]
        best_loss = reward(secret, closest(secret, 6))[0]
        worst_loss = reward(secret, [closest(secret, 1)[0]] + ["zzzzz"] * 5)[0]
        best_no_valid = reward(secret, [])[0]
        worst_no_valid = reward(secret, ["zzzzz"] * 6)[0]
        for k in range(5):
            assert worst_wins[k] > best_wins[k + 1], (secret, k + 1)
        assert worst_wins[5] > best_loss, secret
        assert worst_loss > best_no_valid >= worst_no_valid, secret


@st.composite
def episodes(draw: st.DrawFn, secret: str) -> list[str]:
    near = closest(secret, 8)
    replies: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        move = draw(st.sampled_from(["word", "near", "invalid", "repeat", "secret", "text"]))
        if move == "word":
            replies.append(draw(st.sampled_from(WORDS)))
        elif move == "near":
            replies.append(f"<guess>{draw(st.sampled_from(near))}</guess>")
        elif move == "invalid":
            replies.append(draw(st.sampled_from(INVALID)))
        elif move == "repeat" and replies:
            replies.append(draw(st.sampled_from(replies)))
        elif move == "secret":
            replies.append(secret.upper())
        else:
            replies.append(draw(st.text(max_size=12)))
    return replies


@settings(max_examples=400, deadline=None)
@given(data=st.data(), secret=st.sampled_from(WORDS))
def test_reward_respects_outcome_order_for_any_two_episodes(data: st.DataObject, secret: str) -> None:
    a_reward, a = reward(secret, data.draw(episodes(secret)))
    b_reward, b = reward(secret, data.draw(episodes(secret)))
    if rank(a) > rank(b):
        assert a_reward > b_reward
    elif rank(b) > rank(a):
        assert b_reward > a_reward
    won = [r for r, g in ((a_reward, a), (b_reward, b)) if g.solved]
    lost = [r for r, g in ((a_reward, a), (b_reward, b)) if not g.solved]
    assert all(w > lo for w in won for lo in lost)  # shaping never pays a loss more than a win


def test_generated_secrets_are_words_fixed_and_never_shared_between_splits() -> None:
    train = WordleEnvironment.generate_tasks(2800, "train")
    validation = WordleEnvironment.generate_tasks(300, "validation")
    assert len(train) == 2800 and len(validation) == 300
    train_secrets = {t["secret"] for t in train}
    validation_secrets = {t["secret"] for t in validation}
    assert train_secrets.isdisjoint(validation_secrets)
    assert len(train_secrets) == 2700 and len(validation_secrets) == 300  # pools repeat beyond
    assert train_secrets | validation_secrets == set(word_list())
    assert WordleEnvironment.generate_tasks(5, "train") == train[:5]  # the same on every call
    for task in train[:50] + validation[:50]:
        WordleGame(task["secret"])  # a secret the game accepts
