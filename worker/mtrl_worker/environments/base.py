"""The environment plug-in interface.

An Environment makes Episodes from task rows. An Episode drives its own turns against a
`Policy` (built-in environments call `policy.chat`; agents written for an OpenAI-compatible API
use `policy.openai_base_url` and `policy.api_key` instead) and can be scored at any time, so a
partial episode cut short by a turn or token limit still earns its due.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

from mtrl_api.environments import Parameter, TaskField, bound_problems
from mtrl_rollout.protocol import ChatMessage, StopReason
from mtrl_worker.rewards import RewardComponent, Score

G = TypeVar("G")  # a guess


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: Literal["stop", "length"]
    token_ids: list[int]
    logprobs: list[float]


class EpisodeLimitReached(Exception):
    """Raised by `Policy.chat` when the episode may not take another turn."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(f"episode stopped: {reason.value}")
        self.reason = reason


class Policy(Protocol):
    openai_base_url: str | None
    api_key: str

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> Completion: ...


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_length: int


class Episode(ABC):
    @abstractmethod
    async def play(self, policy: Policy) -> None:
        """Take turns until the episode is over; EpisodeLimitReached may end it early."""

    @abstractmethod
    def score(self) -> Score:
        """The score so far: one value per component the environment declares."""


class Game(Protocol):
    """A turn-based game without I/O: each reply is played and answered until it is over."""

    @property
    def over(self) -> bool: ...

    def play(self, reply: str) -> str:
        """Apply one reply; return the message the player sees next."""
        ...

    def score(self) -> Score: ...


class GameEpisode(Episode):
    """An episode of a `Game`: the opening messages, then each reply and the game's answer."""

    def __init__(self, game: Game, opening: Sequence[ChatMessage]) -> None:
        self.game = game
        self.opening = list(opening)

    async def play(self, policy: Policy) -> None:
        messages = list(self.opening)
        while not self.game.over:
            completion = await policy.chat(messages)
            messages += [
                ChatMessage(role="assistant", content=completion.text),
                ChatMessage(role="user", content=self.game.play(completion.text)),
            ]

    def score(self) -> Score:
        return self.game.score()


class GuessingGame(ABC, Generic[G]):
    """A game of guesses at a secret (Wordle, guess): every reply takes a turn; a guess that is
    not valid, or was made before, is counted and told so without a hint; a new valid one gets
    the game's own answer. Subclasses read, check and answer guesses and keep their score."""

    def __init__(self, max_guesses: int) -> None:
        self.max_guesses = max_guesses
        self.guesses: list[G] = []  # valid, distinct guesses in order
        self.turns = 0
        self.invalid = 0
        self.repeated = 0
        self.solved = False

    @property
    def over(self) -> bool:
        return self.solved or self.turns >= self.max_guesses

    def play(self, reply: str) -> str:
        """Apply one reply; return the message the player sees next."""
        if self.over:
            raise RuntimeError("the game is over")
        self.turns += 1
        guess = self.read(reply)
        left = f"{self.max_guesses - self.turns} guesses left."
        if not self.valid(guess):
            self.invalid += 1
            return f"{self.invalid_answer(guess)} {left}"
        if guess in self.guesses:
            self.repeated += 1
            return f"{self.repeated_answer(guess)} {left}"
        self.guesses.append(guess)
        return self.answer(guess, left)

    def metrics(self) -> dict[str, float]:
        """Turns taken and how the guesses went."""
        return {"turns": float(self.turns), "valid_guesses": float(len(self.guesses)),
                "invalid_guess_count": float(self.invalid),
                "repeated_guess_count": float(self.repeated)}

    @abstractmethod
    def read(self, reply: str) -> G:
        """The guess in a reply."""

    @abstractmethod
    def valid(self, guess: G) -> bool: ...

    @abstractmethod
    def invalid_answer(self, guess: G) -> str: ...

    @abstractmethod
    def repeated_answer(self, guess: G) -> str: ...

    @abstractmethod
    def answer(self, guess: G, left: str) -> str:
        """A new valid guess: mark it (and `solved` when it is the secret); `left` says how many
        guesses remain."""


class Environment(ABC):
    name: ClassVar[str]
    components: ClassVar[tuple[RewardComponent, ...]]
    # What the environment takes, declared so that the operator can refuse a run the workers
    # would refuse before anything starts (`mtrl crds` publishes it as mtrl_api's catalog).
    # None: undeclared, and nothing is checked. Arguments arrive as the strings of
    # spec.rollout.environmentArgs; `Parameter.convert` is how they become values.
    parameters: ClassVar[tuple[Parameter, ...] | None] = None
    task_fields: ClassVar[tuple[TaskField, ...] | None] = None
    exactly_one_of: ClassVar[tuple[tuple[str, ...], ...]] = ()  # task fields: one per group

    @abstractmethod
    def episode(self, task: Mapping[str, Any], limits: EpisodeLimits) -> Episode: ...

    @classmethod
    def arguments(cls, **given: Any) -> dict[str, Any]:
        """The constructor's arguments (strings or values) converted by the declared
        parameters; ValueError names the argument and what it takes, alone or beside another
        (`Parameter.below_when`)."""
        declared = {p.name: p for p in cls.parameters or ()}
        values = {k: declared[k].convert(v) if k in declared else v for k, v in given.items()}
        if problems := bound_problems(cls.parameters or (), values):
            raise ValueError("; ".join(problems))
        return values

    @classmethod
    def generate_tasks(cls, count: int, split: str) -> list[dict[str, Any]] | None:
        """`count` task rows of `split` ("train" or "validation", never sharing a task), the
        same on every call: spec.dataset.generated. None: this environment cannot make its own
        tasks, and a run asking it to fails before its trainer starts."""
        return None

    # `mtrl env play <name> ...`: a scripted policy replays the given replies.
    @classmethod
    @abstractmethod
    def add_play_arguments(cls, parser: argparse.ArgumentParser) -> None: ...

    @classmethod
    @abstractmethod
    def play_script(cls, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
        """The task row and the scripted replies for a dry run."""

    def describe_turns(self, task: Mapping[str, Any], replies: Sequence[str]) -> list[str]:
        """One line per reply the dry run played, for people; an environment whose replies
        mean more than their text (a Wordle guess and its marks) says so in its own way."""
        return [f"{i}. {' '.join(reply.split())[:100]}" for i, reply in enumerate(replies, 1)]
