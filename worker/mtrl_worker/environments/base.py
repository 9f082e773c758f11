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
from typing import Any, ClassVar, Literal, Protocol

from mtrl_api.environments import Parameter, TaskField
from mtrl_rollout.protocol import ChatMessage, StopReason
from mtrl_worker.rewards import RewardComponent, Score


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


def guess_metrics(turns: int, valid: int, invalid: int, repeated: int) -> dict[str, float]:
    """The metrics of a guessing game (Wordle, guess): turns taken and how the guesses went."""
    return {"turns": float(turns), "valid_guesses": float(valid),
            "invalid_guess_count": float(invalid), "repeated_guess_count": float(repeated)}


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
        parameters; ValueError names the argument and what it takes."""
        declared = {p.name: p for p in cls.parameters or ()}
        return {k: declared[k].convert(v) if k in declared else v for k, v in given.items()}

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
