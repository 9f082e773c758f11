"""Guess: find a secret whole number from "higher" / "lower" after each guess.

Why this game (issue 22: a multi-turn task a 135M-parameter model can learn on two CPU cores):
- A reply is a few tokens, so a small model plays thousands of turns in minutes.
- It cannot be won reliably without reading the environment's answers: six guesses that
  ignore them find a secret among 20 numbers at most 6 times in 20, while halving the range
  the answers leave wins every game in at most 5. So a policy starts above zero and far from the
  top, and what lifts it is the multi-turn skill of using feedback.
- Tasks vary the range as well as the secret ("between 37 and 56"), so held-out tasks are new
  games, not memorized answers.

Rules: a reply's guess is its first whole number in the range. Every reply takes a turn. A reply without a
number in the range is invalid, a number guessed before is repeated; both are told so and
penalised. Otherwise the answer is "Higher.", "Lower." or "Correct!" (which ends the game);
with the argument `answers: range`, "Higher." and "Lower." also say what is left ("It is from 7
to 12."), which turns using the answers into picking a number between two the model can read.

The opening states these rules, then plays one example game in the task's own range in the same
chat (its guesses as the assistant's turns, the game's answers as the user's; `opening`),
played by halving and answered in the game's own words (`example_game`), so a small model starts
from a reply format it can copy (a bare number). The example's secret is fixed by the range
alone (just below three quarters of the way up, or just above a quarter where that is the
task's secret), so the example never gives the answer away.

Episode reward (the components, for the metrics and `advantageLevel: episode`). Its order, for
every task and default weights, T <= 10 (tests/worker/environments/test_guess.py checks it over
random whole games): a win in fewer turns > a win in more turns > a loss. The speed step between
two win lengths (1/T) exceeds the most that shaping (`consistent`, 0.05) and the penalty of the
faster win (0.05 * (T-2)/T) can take back.

Turn rewards (`Score.turn_rewards`, what `grpo.advantageLevel: turn` trains on). One episode
reward gives every reply of a game the same advantage, so a valid reply and five invalid ones
in one game share the credit and validity counts only through 0.05-weighted terms. Per turn:
- TURN_VALID (0.04) for a valid new guess (a number in the range not guessed before), 0 for an
  invalid or repeated reply;
- TURN_CONSISTENT (0.04; the argument `consistent_reward`, bounded by `consistent_reward_bounds`)
  more when that guess lies in the range the answers so far leave (with `consistent_credit:
  middle`, times `middle_credit`: 1 at the range's middle, 0 at its ends);
- the win, on the turn it happens: 1 + (T - turn + 1) / T (the episode's `solved` + `speed`).
With return-to-go credit (the trainer sums a turn's reward and the later ones), the sum over a
whole game keeps the episode's order where it matters (checked by the same random games): any
win > any loss, since a clean turn earns at most 0.08 and T <= 10 of them stay below the win's
least, 1 + 1/T; and between two games whose every guess earned the full turn reward (valid, new
and consistent; with middle credit, at the middle too), a win in fewer turns > a win in more,
since one such turn more earns 0.08 < 1/T, the speed step. (A slower game with better turns may
earn more than a faster one with worse: that is the credit.)
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mtrl_api.environments import Parameter, TaskField
from mtrl_rollout.protocol import ChatMessage
from mtrl_worker.environments.base import Environment, EpisodeLimits, GameEpisode, GuessingGame
from mtrl_worker.rewards import RewardComponent, Score

MAX_GUESSES = 6
SPAN = 20  # numbers in a generated task's range
LOWEST, HIGHEST = 1, 100  # generated ranges lie inside these
GENERATED_SEED = 0  # fixed: a run's generated tasks must not change when it resumes

TURN_VALID = 0.04  # a turn's reward for a valid new guess
TURN_CONSISTENT = 0.04  # and for one inside the range the answers so far leave
MAX_GUESSES_PROVEN = 10  # the reward orders above hold for T up to this
ANSWERS = ("direction", "range")  # "Higher." / "Lower.", or with what is left: "It is from 7 to 12."
# consistent_reward for any guess inside the range left, or by how near its middle it is
CREDITS = ("inside", "middle")

RULES = (
    "Let's play a game. I'm thinking of a whole number from {low} to {high}. Guess it in at "
    "most {turns} tries. Reply with just your guess, a single number from {low} to {high}. "
    "After each guess I answer \"Higher.\" (my number is bigger), \"Lower.\" (my number is "
    "smaller) or \"Correct!\". Your first guess?"
)
AGAIN = "Correct! Let's play again: a new number from {low} to {high}. Your first guess?"
_NUMBER = re.compile(r"-?\d+")


def extract_guess(reply: str, low: int, high: int) -> int | None:
    """The reply's first whole number in [low, high], else its last number (told it is out of
    range), else None. Small models wrap their guess in words ("Let's start with 72."), and a
    range check on the first number would punish the wrapping, not the guess. The range itself
    restated ("a number from 70 to 89") is no guess: SmolLM2-135M-Instruct often opens with it,
    and reading `low` from it would pay a reply that copied the prompt."""
    restated = re.compile(rf"\b{low}\s*(?:to|-|and)\s*{high}\b")
    numbers = [int(n) for n in _NUMBER.findall(restated.sub(" ", reply))]
    in_range = [n for n in numbers if low <= n <= high]
    return in_range[0] if in_range else numbers[-1] if numbers else None


class GuessGame(GuessingGame[int | None]):
    """The game state and its score, without any I/O."""

    def __init__(self, secret: int, low: int, high: int, max_guesses: int = MAX_GUESSES, *,
                 answers: str = "direction", consistent_reward: float = TURN_CONSISTENT,
                 consistent_credit: str = "inside") -> None:
        if not low <= secret <= high:
            raise ValueError(f"secret {secret} is not in [{low}, {high}]")
        if answers not in ANSWERS:
            raise ValueError(f"answers {answers!r} is not one of {', '.join(ANSWERS)}")
        if consistent_credit not in CREDITS:
            raise ValueError(f"consistent_credit {consistent_credit!r} is not one of "
                             f"{', '.join(CREDITS)}")
        super().__init__(max_guesses)
        self.secret, self.low, self.high = secret, low, high
        self.answers, self.consistent_reward = answers, consistent_reward
        self.consistent_credit = consistent_credit
        self.allowed = (low, high)  # what the answers so far leave possible
        self.consistent = 0  # valid guesses inside `allowed` when made
        self.halving = 0.0  # their middle credit, summed (a metric under either credit)
        self.turn_rewards: list[float] = []

    def play(self, reply: str) -> str:
        new, (lo, hi) = len(self.guesses), self.allowed
        answer = super().play(reply)
        reward = 0.0
        if len(self.guesses) > new:  # a valid new guess, judged against the range it was made in
            guess = self.guesses[-1]
            assert guess is not None  # valid
            inside, middle = lo <= guess <= hi, middle_credit(guess, lo, hi)
            self.consistent += inside
            self.halving += middle
            credit = middle if self.consistent_credit == "middle" else float(inside)
            reward = TURN_VALID + self.consistent_reward * credit
        if self.solved:  # on this turn: the game is over once it is won
            reward += 1.0 + (self.max_guesses - self.turns + 1) / self.max_guesses
        self.turn_rewards.append(reward)
        return answer

    def read(self, reply: str) -> int | None:
        return extract_guess(reply, self.low, self.high)

    def valid(self, guess: int | None) -> bool:
        return guess is not None and self.low <= guess <= self.high

    def invalid_answer(self, guess: int | None) -> str:
        return f"Reply with just one whole number from {self.low} to {self.high}."

    def repeated_answer(self, guess: int | None) -> str:
        return f"You guessed {guess} before."

    def answer(self, guess: int | None, left: str) -> str:
        assert guess is not None  # valid
        lo, hi = self.allowed
        if guess == self.secret:
            self.solved = True
            return "Correct!"
        if guess < self.secret:
            self.allowed, word = (max(lo, guess + 1), hi), "Higher."
        else:
            self.allowed, word = (lo, min(hi, guess - 1)), "Lower."
        if self.answers == "range":
            low, high = self.allowed
            word += f" It is {low}." if low == high else f" It is from {low} to {high}."
        return f"{word} {left}"

    def score(self) -> Score:
        t = self.max_guesses
        return Score(
            components={
                "solved": float(self.solved),
                "speed": (t - self.turns + 1) / t if self.solved else 0.0,
                "consistent": self.consistent / len(self.guesses) if self.guesses else 0.0,
                "invalid_or_repeated": -(self.invalid + self.repeated) / t,
            },
            metrics=self.metrics() | {
                # how near the middle of the range left its valid guesses were, on average: 1
                # for a player that halves, about 0.5 for one that guesses anywhere inside
                "halving": self.halving / len(self.guesses) if self.guesses else 0.0},
            turn_rewards=list(self.turn_rewards),
        )


def middle_credit(guess: int, low: int, high: int) -> float:
    """How near the middle of [low, high] the guess is: 1 at the middle (either middle number
    of an even count, or the one number left), falling to 0 at the ends and outside. Halving
    what is left is how 6 guesses always find one of 20 numbers; a guess at the range's end
    is consistent and finds one of them at a time."""
    if not low <= guess <= high:
        return 0.0
    if high - low <= 1:
        return 1.0
    off = max(0, abs(2 * guess - low - high) - (high - low) % 2)  # 0 for the middle number(s)
    return 1.0 - off / (high - low - (high - low) % 2)


def example_game(low: int, high: int, secret: int, max_guesses: int,
                 answers: str = "direction") -> tuple[int, list[tuple[int, str]]]:
    """The opening's example: its secret and its moves (each guess and the game's answer), a
    game played by halving the numbers still possible and answered by the game itself. The
    secret is fixed by the range (just below three quarters of the way up, or just above a
    quarter where that is the task's `secret`): in a range of 20 halving then meets "Higher."
    and "Lower." before it wins."""
    example_secret = max(low, low + 3 * (high - low) // 4 - 1)
    if example_secret == secret:
        example_secret = min(high, low + (high - low) // 4 + 1)
    game = GuessGame(example_secret, low, high, max_guesses, answers=answers)
    moves = []
    while not game.over:
        guess = (game.allowed[0] + game.allowed[1]) // 2
        moves.append((guess, game.play(str(guess))))
    return example_secret, moves


def opening(game: GuessGame) -> list[ChatMessage]:
    """What the model sees before its first guess: the rules, one example game in the same
    chat (the example's guesses as the assistant's turns, the game's answers as the user's),
    and the new game. SmolLM2-135M-Instruct copies the reply format from turns it sees in the
    chat, not from a transcript inside one message: over 16 games its greedy first reply held a
    valid guess 16 times with the example as turns and 0 times with it as text (it answered "I'm
    not sure what to say."); sampled, 41 of 64 against 6 (docs/environments.md)."""
    _, moves = example_game(game.low, game.high, game.secret, game.max_guesses, game.answers)
    messages = [ChatMessage(role="user", content=RULES.format(
        low=game.low, high=game.high, turns=game.max_guesses))]
    for guess, answer in moves:
        messages += [ChatMessage(role="assistant", content=str(guess)),
                     ChatMessage(role="user", content=AGAIN.format(low=game.low, high=game.high)
                                 if answer == "Correct!" else answer)]
    return messages


def consistent_reward_bounds() -> dict[str, float]:
    """What keeps the turn rewards in the order the module's docstring proves, for each T the
    environment takes: a clean turn (a valid new guess inside the range left) earns less than
    the speed step 1/T, so `consistent_reward` < 1/T - TURN_VALID. Then T clean turns earn less
    than 1, below the least win, 1 + 1/T. (A shorter game, T below `max_guesses`, has more
    room.) The catalog carries it, so the operator refuses what the worker would."""
    return {str(t): 1 / t - TURN_VALID for t in range(1, MAX_GUESSES_PROVEN + 1)}


class GuessEnvironment(Environment):
    name = "guess"
    components = (
        RewardComponent("solved", 1.0, 0.0, 1.0, "outcome", "1 if the secret was found."),
        RewardComponent("speed", 1.0, 0.0, 1.0, "outcome", "(T - turns + 1) / T for a win, else 0."),
        RewardComponent("consistent", 0.05, 0.0, 1.0, "behaviour",
                        "Fraction of valid guesses inside the range the answers so far allow."),
        RewardComponent("invalid_or_repeated", 0.05, -1.0, 0.0, "penalty",
                        "-(invalid or repeated guesses) / T."),
    )

    parameters = (
        Parameter(name="max_guesses", type="int", default=MAX_GUESSES, minimum=1,
                  maximum=MAX_GUESSES_PROVEN,
                  doc="Guesses per game (T); the reward order above is proven for T <= 10."),
        Parameter(name="answers", type="str", default="direction", choices=list(ANSWERS),
                  doc='"direction": "Higher." or "Lower."; "range": the numbers still possible '
                      'too ("Lower. It is from 7 to 12."), in the example game as well.'),
        Parameter(name="consistent_reward", type="float", default=TURN_CONSISTENT, minimum=0.0,
                  maximum=1.0, below_when={"max_guesses": consistent_reward_bounds()},
                  doc="A turn's reward for a guess inside the range the answers left (turn "
                      "credit); below 1/T - 0.04, or a clean turn would outweigh the speed "
                      "step 1/T."),
        Parameter(name="consistent_credit", type="str", default="inside", choices=list(CREDITS),
                  doc='"inside": consistent_reward for any guess inside the range the answers '
                      'left; "middle": scaled by how near its middle (1 at the middle, 0 at '
                      "its ends), which pays halving what is left."),
    )
    task_fields = (
        TaskField(name="secret", type="int", required=True, doc="The secret number."),
        TaskField(name="low", type="int", doc="The smallest number in play (default 1)."),
        TaskField(name="high", type="int", doc=f"The largest number in play (default {SPAN})."),
    )

    def __init__(self, max_guesses: int | str = MAX_GUESSES, answers: str = "direction",
                 consistent_reward: float | str = TURN_CONSISTENT,
                 consistent_credit: str = "inside") -> None:
        given = self.arguments(max_guesses=max_guesses, answers=answers,
                               consistent_reward=consistent_reward,
                               consistent_credit=consistent_credit)
        self.max_guesses, self.answers = int(given["max_guesses"]), str(given["answers"])
        self.consistent_reward = float(given["consistent_reward"])
        self.consistent_credit = str(given["consistent_credit"])

    def game(self, task: Mapping[str, Any], max_guesses: int) -> GuessGame:
        """A new game of `task` under this environment's arguments."""
        return GuessGame(int(task["secret"]), int(task.get("low", 1)), int(task.get("high", SPAN)),
                         max_guesses, answers=self.answers,
                         consistent_reward=self.consistent_reward,
                         consistent_credit=self.consistent_credit)

    def episode(self, task: Mapping[str, Any], limits: EpisodeLimits) -> GameEpisode:
        game = self.game(task, min(self.max_guesses, limits.max_turns))
        # No system prompt: the model's chat template puts its own.
        return GameEpisode(game, opening(game))

    @classmethod
    def generate_tasks(cls, count: int, split: str) -> list[dict[str, Any]]:
        """Every range of SPAN numbers inside 1..100 with every secret in it, in a fixed
        shuffled order: the first tenth is the validation pool, the rest the training pool; a
        count above a pool's size repeats it."""
        games = [{"low": str(low), "high": str(low + SPAN - 1), "secret": str(low + offset)}
                 for low in range(LOWEST, HIGHEST - SPAN + 2) for offset in range(SPAN)]
        random.Random(GENERATED_SEED).shuffle(games)
        held_out = len(games) // 10
        pool = games[:held_out] if split == "validation" else games[held_out:]
        return [pool[i % len(pool)] for i in range(count)]

    @classmethod
    def add_play_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--secret", required=True, type=int, help="the secret number")
        parser.add_argument("--low", type=int, default=1, help="the smallest number in play")
        parser.add_argument("--high", type=int, default=SPAN, help="the largest number in play")
        parser.add_argument("--guess", action="append", default=[], help="one reply per turn")

    @classmethod
    def play_script(cls, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
        task = {"secret": str(args.secret), "low": str(args.low), "high": str(args.high)}
        return task, list(args.guess)

    def describe_turns(self, task: Mapping[str, Any], replies: Sequence[str]) -> list[str]:
        game = self.game(task, self.max_guesses)
        lines = []
        for reply in replies:
            if game.over:
                break
            lines.append(f"{extract_guess(reply, game.low, game.high)}  {game.play(reply)}")
        return lines
