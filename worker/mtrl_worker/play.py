"""`mtrl env play <environment> ...`: a dry run of one episode with scripted replies.

Example: `mtrl env play wordle --secret crane --guess slate --guess crane` prints each turn as
the environment describes it (for Wordle each guess with its marks), then the reward, its
components and why the episode stopped; `--json` prints the RolloutResult instead
(aggregate_reward_score, metrics_list, stop_reason, ...). No queues, no trainer: each
environment turns its own arguments into a task row and a reply script. Arguments it refuses
(a secret not in the word list, an unknown reward weight) are one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from mtrl_rollout.protocol import (
    ChatMessage,
    RewardSpec,
    RolloutRequest,
    RolloutResult,
    StopReason,
    TurnRecord,
)
from mtrl_worker import catalog
from mtrl_worker.environments.base import Completion, Environment, EpisodeLimitReached, EpisodeLimits
from mtrl_worker.environments.registry import available, environment_class
from mtrl_worker.episode import run_episode
from mtrl_worker.rewards import resolve_weights

MAX_LENGTH = 1 << 20  # a dry run's token budget: never the limit


class ScriptedPolicy:
    """Replies from a script; running out of script ends the episode (policy_stopped)."""

    openai_base_url: str | None = None
    api_key = "dry-run"
    generate_seconds = 0.0  # nothing is generated

    def __init__(self, replies: Sequence[str], max_turns: int) -> None:
        self._replies = list(replies)
        self.max_turns = max_turns
        self.turns: list[TurnRecord] = []
        self.stop_reason: StopReason | None = None
        self.transcript: list[dict[str, str]] = []
        self._used = 0

    @property
    def completion_tokens(self) -> int:
        return 0

    @property
    def played(self) -> list[str]:
        """The replies the episode took."""
        return self._replies[:self._used]

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> Completion:
        self.transcript = [m.model_dump(exclude_none=True) for m in messages]
        if self._used >= self.max_turns:
            self.stop_reason = StopReason.MAX_TURNS
            raise EpisodeLimitReached(StopReason.MAX_TURNS)
        if self._used >= len(self._replies):
            self.stop_reason = StopReason.POLICY_STOPPED
            raise EpisodeLimitReached(StopReason.POLICY_STOPPED)
        reply = self._replies[self._used]
        self._used += 1
        return Completion(reply, "stop", [], [])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mtrl env play", description="Play one scripted episode and print its result."
    )
    sub = parser.add_subparsers(dest="environment", required=True, metavar="ENVIRONMENT")
    for name in available():
        try:
            cls = environment_class(name)
        except Exception as exc:  # a broken plug-in must not hide the others
            sub.add_parser(name, help=f"unavailable: {exc}")
            continue
        env_parser = sub.add_parser(name, help=catalog.summary(cls))
        cls.add_play_arguments(env_parser)
        env_parser.add_argument("--max-turns", type=int, default=16)
        env_parser.add_argument("--env-args", type=json.loads, default={}, help="JSON environment arguments")
        env_parser.add_argument("--weights", type=json.loads, default={}, help="JSON reward weight overrides")
        env_parser.add_argument(
            "--reward-range", type=float, nargs=2, default=(0.0, 1.0), metavar=("MIN", "MAX")
        )
        env_parser.add_argument("--transcript", action="store_true", help="include the last prompt messages")
        env_parser.add_argument("--json", action="store_true",
                                help="print the RolloutResult as JSON instead of a summary")
    return parser


class Refused(Exception):
    """Arguments the environment refuses: a usage error, not an episode's failure."""


def _prepare(args: argparse.Namespace) -> tuple[Environment, dict[str, Any], list[str], dict[str, float]]:
    """The environment, task row, replies and weights, each checked before the episode runs:
    the worker would turn a refusal into an `episode_error` result, which hides a typo here."""
    cls = environment_class(args.environment)
    try:
        env = cls(**args.env_args)
    except TypeError as exc:
        raise Refused(f"--env-args: {exc}") from None
    try:
        task, replies = cls.play_script(args)
        env.episode(task, EpisodeLimits(args.max_turns, MAX_LENGTH))
        return env, task, replies, resolve_weights(env.components, args.weights)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise Refused(str(exc)) from None


def summary(env: Environment, task: dict[str, Any], played: list[str], result: RolloutResult,
            reward_range: tuple[float, float]) -> str:
    lines = [f"{env.name} {json.dumps(task)}"]
    lines += [f"  {line}" for line in env.describe_turns(task, played)] or ["  (no turns)"]
    low, high = reward_range
    lines.append(f"reward   {result.aggregate_reward_score:.3f}  (range {low:g} to {high:g})")
    parts = [f"{m.name} {m.value:.3g}" for m in result.metrics_list if m.type == "Reward"]
    if parts:
        lines.append(f"parts    {', '.join(parts)}")
    lines.append(f"stop     {result.stop_reason.value}")
    if result.error:
        lines.append(f"error    {result.error}")
    return "\n".join(lines)


def play_main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        env, task, replies, weights = _prepare(args)
    except Refused as exc:
        print(f"mtrl env play {args.environment}: {exc}", file=sys.stderr)
        return 2
    policy = ScriptedPolicy(replies, args.max_turns)
    reward_range = (args.reward_range[0], args.reward_range[1])
    request = RolloutRequest(
        run_id="dry-run",
        step=0,
        group_id="dry-run",
        sample_id="dry-run-0",
        policy_version=0,
        data=task,
        max_length=MAX_LENGTH,
        rewards=RewardSpec(range=reward_range),
    )
    result = asyncio.run(
        run_episode(env, weights, request, policy, max_turns=args.max_turns, timeout_s=60)
    )
    if args.json:
        out = result.model_dump(mode="json", exclude={"trajectory"}, exclude_none=True)
        if args.transcript:
            out["transcript"] = policy.transcript
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(summary(env, task, policy.played, result, reward_range))
        for message in policy.transcript if args.transcript else []:
            print(f"{message['role']:>9}: {message.get('content', '')}")
    return 1 if result.stop_reason is StopReason.ERROR else 0


def env_main(argv: Sequence[str] | None = None) -> int:
    """`mtrl env <tool> ...`: `play` one scripted episode, `list` the environments, or write
    (`catalog`, `--check`) the catalog the operator reads."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["play"]:
        return play_main(argv[1:])
    if argv[:1] == ["list"]:
        return catalog.list_main(argv[1:])
    if argv[:1] == ["catalog"]:
        return catalog.catalog_main(argv[1:])
    print("usage: mtrl env {list,play,catalog} ...  (see `mtrl env play --help`)",
          file=sys.stderr)
    return 2
