"""`mtrl env play <environment> ...`: a dry run of one episode with scripted replies.

Example: `mtrl env play wordle --secret crane --guess slate --guess crane` prints one JSON
object: the RolloutResult (aggregate_reward_score, metrics_list, stop_reason, ...). No queues,
no trainer: each environment turns its own arguments into a task row and a reply script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from mtrl_rollout.protocol import ChatMessage, RewardSpec, RolloutRequest, StopReason, TurnRecord
from mtrl_worker.environments.base import Completion, EpisodeLimitReached
from mtrl_worker.environments.registry import available, environment_class
from mtrl_worker.episode import run_episode
from mtrl_worker.rewards import resolve_weights


class ScriptedPolicy:
    """Replies from a script; running out of script ends the episode (policy_stopped)."""

    openai_base_url: str | None = None
    api_key = "dry-run"

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
        summary = (sys.modules[cls.__module__].__doc__ or name).strip().splitlines()[0]
        env_parser = sub.add_parser(name, help=summary)
        cls.add_play_arguments(env_parser)
        env_parser.add_argument("--max-turns", type=int, default=16)
        env_parser.add_argument("--env-args", type=json.loads, default={}, help="JSON environment arguments")
        env_parser.add_argument("--weights", type=json.loads, default={}, help="JSON reward weight overrides")
        env_parser.add_argument(
            "--reward-range", type=float, nargs=2, default=(0.0, 1.0), metavar=("MIN", "MAX")
        )
        env_parser.add_argument("--transcript", action="store_true", help="include the last prompt messages")
    return parser


def play_main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cls = environment_class(args.environment)
    env = cls(**args.env_args)
    task, replies = cls.play_script(args)
    policy = ScriptedPolicy(replies, args.max_turns)
    request = RolloutRequest(
        run_id="dry-run",
        step=0,
        group_id="dry-run",
        sample_id="dry-run-0",
        policy_version=0,
        data=task,
        max_length=1 << 20,
        rewards=RewardSpec(range=tuple(args.reward_range)),
    )
    result = asyncio.run(
        run_episode(
            env,
            resolve_weights(env.components, args.weights),
            request,
            policy,
            max_turns=args.max_turns,
            timeout_s=60,
        )
    )
    out = result.model_dump(mode="json", exclude={"trajectory"}, exclude_none=True)
    if args.transcript:
        out["transcript"] = policy.transcript
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 1 if result.stop_reason is StopReason.ERROR else 0


def env_main(argv: Sequence[str] | None = None) -> int:
    """`mtrl env <tool> ...`; `play` is the one tool so far."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["play"]:
        return play_main(argv[1:])
    print("usage: mtrl env play ENVIRONMENT [options]  (see `mtrl env play --help`)", file=sys.stderr)
    return 2
