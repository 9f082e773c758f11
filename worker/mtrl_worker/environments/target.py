"""Target: a trivially learnable environment for "does the trainer learn at all" tests.

The prompt names a target; the reward is the fraction of the completion that is the target:
- token mode (`{"target_token_id": 7}`): fraction of completion token ids equal to 7. This is
  dense from random init: a policy over a vocabulary of V tokens starts near 1/V and every
  sampled target token raises its group's advantage, so a tiny random model learns it in a few
  dozen steps;
- character mode (`{"target": "a"}`): fraction of completion characters equal to "a".
With `turns=N` (environment argument, 1-16) the user asks again N-1 times and the reward is the
mean. `latency_ms` stands in for an environment that thinks (a tool call, a code run, a
simulated user): each turn's reply waits that long, which the asynchronous-GRPO benchmark uses.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from typing import Any

from mtrl_api.environments import Parameter, TaskField
from mtrl_rollout.protocol import ChatMessage
from mtrl_worker.environments.base import Completion, Environment, Episode, EpisodeLimits, Policy
from mtrl_worker.rewards import RewardComponent, Score


class TargetEpisode(Episode):
    def __init__(self, target_token_id: int | None, target: str | None, turns: int,
                 latency_s: float = 0.0) -> None:
        if (target_token_id is None) == (target is None):
            raise ValueError("a target task sets exactly one of target_token_id and target")
        if target is not None and len(target) != 1:
            raise ValueError(f"target must be one character, got {target!r}")
        self.target_token_id = target_token_id
        self.target = target
        self.turns = turns
        self.latency_s = latency_s
        self.fractions: list[float] = []
        self.completion_tokens = 0

    def _fraction(self, completion: Completion) -> float:
        if self.target_token_id is not None:
            ids = completion.token_ids
            return sum(t == self.target_token_id for t in ids) / len(ids) if ids else 0.0
        text = completion.text
        return sum(c == self.target for c in text) / len(text) if text else 0.0

    async def play(self, policy: Policy) -> None:
        shown = self.target if self.target is not None else f"<token {self.target_token_id}>"
        messages = [ChatMessage(role="user", content=f"Repeat {shown} as often as you can.")]
        for _ in range(self.turns):
            completion = await policy.chat(messages)
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            self.fractions.append(self._fraction(completion))
            self.completion_tokens += len(completion.token_ids)
            messages += [
                ChatMessage(role="assistant", content=completion.text),
                ChatMessage(role="user", content=f"Again: {shown}."),
            ]

    def score(self) -> Score:
        mean = sum(self.fractions) / len(self.fractions) if self.fractions else 0.0
        return Score(
            components={"target_fraction": mean},
            metrics={"completion_tokens": float(self.completion_tokens)},
            turn_rewards=list(self.fractions),
        )


class TargetEnvironment(Environment):
    name = "target"
    components = (
        RewardComponent(
            "target_fraction",
            1.0,
            0.0,
            1.0,
            "outcome",
            "Fraction of completion tokens (or characters) equal to the target.",
        ),
    )

    parameters = (
        Parameter(name="turns", type="int", default=1, minimum=1, maximum=16,
                  doc="Model turns per episode; the user asks again after each."),
        Parameter(name="latency_ms", type="float", default=0.0, minimum=0, maximum=60000,
                  doc="Simulated environment time per turn, in milliseconds."),
    )
    task_fields = (
        TaskField(name="target_token_id", type="int", minimum=0,
                  doc="Token mode: the token id the completion should repeat."),
        TaskField(name="target", pattern=r"(?s).", doc="Character mode: one character."),
    )
    exactly_one_of = (("target_token_id", "target"),)

    def __init__(self, turns: int | str = 1, latency_ms: float | str = 0.0) -> None:
        args = self.arguments(turns=turns, latency_ms=latency_ms)
        self.turns = int(args["turns"])
        self.latency_s = float(args["latency_ms"]) / 1000

    def episode(self, task: Mapping[str, Any], limits: EpisodeLimits) -> TargetEpisode:
        token_id = task.get("target_token_id")
        target = task.get("target")
        return TargetEpisode(
            int(token_id) if token_id is not None else None,
            str(target) if target is not None else None,
            min(self.turns, limits.max_turns),
            self.latency_s,
        )

    @classmethod
    def add_play_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--target", required=True, help="the target character")
        parser.add_argument("--reply", action="append", default=[], help="one reply per turn")

    @classmethod
    def play_script(cls, args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
        return {"target": args.target}, list(args.reply)
