"""Wordle: find a secret five-letter word in six guesses.

Rules as played here (docs/environments.md):
- A reply's guess is the text inside its last `<guess>...</guess>`, else its last word.
- Every reply consumes a turn. A guess that is not a five-letter word from the list is invalid;
  a valid word guessed before is repeated; both are penalised and get no letter feedback.
- Feedback per letter: G (right place), Y (in the word elsewhere), - (not in the word, or all
  its occurrences already accounted for), computed in two passes so duplicates are exact.

Reward order, for every secret and default weights (tests/worker/environments/test_wordle.py
proves it over the whole word list): a win in fewer turns > a win in more turns > a loss > an
episode without a valid guess. The speed step between two win lengths (1/T) exceeds the largest
possible penalty of the faster win (0.15 * (T-1)/T for T <= 6), and shaping is capped below the
smallest win bonus.
"""

from __future__ import annotations

import argparse
import functools
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from mtrl_api.environments import Parameter, TaskField
from mtrl_rollout.protocol import ChatMessage
from mtrl_worker.environments.base import Environment, EpisodeLimits, GameEpisode, GuessingGame
from mtrl_worker.rewards import RewardComponent, Score

WORD_LENGTH = 5
MAX_GUESSES = 6
GENERATED_SEED = 0  # fixed: a run's generated tasks must not change when it resumes

GREEN, YELLOW, GREY = "G", "Y", "-"
TILES = {GREEN: "🟩", YELLOW: "🟨", GREY: "⬛"}

SYSTEM_PROMPT = (
    "You are playing Wordle. Find the secret five-letter English word in at most {turns} "
    "guesses. After each guess you get one mark per letter: G = right letter, right place; "
    "Y = in the word, elsewhere; - = not in the word (or no further occurrences). "
    "Think briefly, then answer with your guess as <guess>xxxxx</guess>."
)


@functools.cache
def word_list() -> tuple[str, ...]:
    text = resources.files(__package__).joinpath("data/wordle_words.txt").read_text()
    return tuple(w for w in text.split() if w)


def feedback(guess: str, secret: str) -> str:
    """One mark per letter. Greens first; then, left to right, a letter is yellow only while the
    secret still has occurrences of it not claimed by a green or an earlier yellow."""
    marks = [GREY] * WORD_LENGTH
    unmatched: Counter[str] = Counter()
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            marks[i] = GREEN
        else:
            unmatched[s] += 1
    for i, g in enumerate(guess):
        if marks[i] != GREEN and unmatched[g] > 0:
            marks[i] = YELLOW
            unmatched[g] -= 1
    return "".join(marks)


_TAGGED = re.compile(r"<guess>\s*([^<]*?)\s*</guess>", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z]+")


def extract_guess(reply: str) -> str:
    tagged = _TAGGED.findall(reply)
    if tagged:
        return tagged[-1].strip().lower()
    words = _WORD.findall(reply)
    return words[-1].lower() if words else ""


class WordleGame(GuessingGame[str]):
    """The game state and its score, without any I/O."""

    def __init__(self, secret: str, max_guesses: int = MAX_GUESSES) -> None:
        self.words = frozenset(word_list())
        if secret not in self.words:
            raise ValueError(f"secret {secret!r} is not in the word list")
        super().__init__(max_guesses)
        self.secret = secret
        self.best_progress = 0.0

    def read(self, reply: str) -> str:
        return extract_guess(reply)

    def valid(self, guess: str) -> bool:
        return len(guess) == WORD_LENGTH and guess in self.words

    def invalid_answer(self, guess: str) -> str:
        return f"{guess!r} is not a valid guess (a five-letter word from the list)."

    def repeated_answer(self, guess: str) -> str:
        return f"You already guessed {guess}."

    def answer(self, guess: str, left: str) -> str:
        marks = feedback(guess, self.secret)
        self.best_progress = max(
            self.best_progress, (2 * marks.count(GREEN) + marks.count(YELLOW)) / (2 * WORD_LENGTH)
        )
        if guess == self.secret:
            self.solved = True
            return f"{guess} {marks} - solved in {self.turns}!"
        return f"{guess} {marks}. {left}"

    def score(self) -> Score:
        t = self.max_guesses
        return Score(
            components={
                "solved": float(self.solved),
                "speed": (t - self.turns + 1) / t if self.solved else 0.0,
                "made_valid_guess": float(bool(self.guesses)),
                "letter_progress": self.best_progress,
                "invalid_guesses": -self.invalid / t,
                "repeated_guesses": -self.repeated / t,
            },
            metrics=self.metrics(),
        )


class WordleEnvironment(Environment):
    name = "wordle"
    components = (
        RewardComponent("solved", 1.0, 0.0, 1.0, "outcome", "1 if the secret was found."),
        RewardComponent("speed", 1.0, 0.0, 1.0, "outcome", "(T - turns + 1) / T for a win, else 0."),
        RewardComponent("made_valid_guess", 0.25, 0.0, 1.0, "behaviour", "1 if any guess was a valid word."),
        RewardComponent(
            "letter_progress",
            0.2,
            0.0,
            1.0,
            "behaviour",
            "Best (2*greens + yellows) / 10 over valid guesses (1 for a win).",
        ),
        RewardComponent("invalid_guesses", 0.15, -1.0, 0.0, "penalty", "-(invalid guesses) / T."),
        RewardComponent("repeated_guesses", 0.15, -1.0, 0.0, "penalty", "-(repeated guesses) / T."),
    )

    parameters = (
        Parameter(name="max_guesses", type="int", default=MAX_GUESSES, minimum=1,
                  maximum=MAX_GUESSES,
                  doc="Guesses per game (T); the reward order above is proven for T <= 6."),
    )
    task_fields = (
        TaskField(name="secret", required=True, pattern=r"\s*[A-Za-z]{5}\s*",
                  doc="The secret five-letter word, from the word list."),
    )

    def __init__(self, max_guesses: int | str = MAX_GUESSES) -> None:
        self.max_guesses = int(self.arguments(max_guesses=max_guesses)["max_guesses"])

    def episode(self, task: Mapping[str, Any], limits: EpisodeLimits) -> GameEpisode:
        secret = str(task["secret"]).strip().lower()
        game = WordleGame(secret, min(self.max_guesses, limits.max_turns))
        return GameEpisode(game, [
            ChatMessage(role="system", content=SYSTEM_PROMPT.format(turns=game.max_guesses)),
            ChatMessage(role="user", content="Make your first guess."),
        ])

    @classmethod
    def generate_tasks(cls, count: int, split: str) -> list[dict[str, Any]]:
        """Secrets from the word list in a fixed shuffled order: the first tenth is the
        validation pool, the rest the training pool; a count above a pool's size repeats it."""
        words = list(word_list())
        random.Random(GENERATED_SEED).shuffle(words)
        held_out = len(words) // 10
        pool = words[:held_out] if split == "validation" else words[held_out:]
        return [{"secret": pool[i % len(pool)]} for i in range(count)]

    @classmethod
    def add_play_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--secret", required=True, help="the secret word")
        parser.add_argument("--guess", action="append", default=[], help="one reply per turn, in order")

    @classmethod
    def play_script(cls, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
        return {"secret": args.secret}, list(args.guess)

    def describe_turns(self, task: Mapping[str, Any], replies: Sequence[str]) -> list[str]:
        """Each guess with its marks as tiles and as letters (`slate  ⬛🟨⬛⬛🟩  -Y--G`), or
        why it earned none; the game is replayed, so the marks are the game's own."""
        secret = str(task["secret"]).strip().lower()
        game, lines = WordleGame(secret, self.max_guesses), []
        for reply in replies:
            if game.over:
                break
            invalid, repeated = game.invalid, game.repeated
            game.play(reply)
            guess = extract_guess(reply) or "(none)"
            if game.invalid > invalid:
                lines.append(f"{guess:<{WORD_LENGTH}}  not a five-letter word from the list")
            elif game.repeated > repeated:
                lines.append(f"{guess:<{WORD_LENGTH}}  guessed before")
            else:
                marks = feedback(guess, secret)
                lines.append(f"{guess}  {''.join(TILES[m] for m in marks)}  {marks}")
        return lines
