"""Held-out evaluation: what one evaluation of the validation split reports, and its plays.

At each evaluation (dataset.evalOnStart, evalIntervalSteps and the last step) every validation
task is played max(evalPassAtK) times at grpo.temperature, as training plays ("sampled":
validationSuccessRate and pass@k), and with dataset.evalGreedy once more greedily ("greedy":
validationGreedySuccessRate). Every play is also one line of eval.jsonl (`plays`), so that two
evaluations can be compared game by game: the same held-out tasks before and after training
make a paired sample, whose interval is far narrower than one from two independent rates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mtrl_rollout.protocol import RolloutResult
from mtrl_trainer.stats import succeeded, success_rate, validation_pass_at_k

Mode = Literal["sampled", "greedy"]


@dataclass(frozen=True)
class Evaluation:
    success_rate: float | None = None
    pass_at_k: dict[int, float] = field(default_factory=dict)
    greedy_success_rate: float | None = None


def task_index(result: RolloutResult) -> int:
    """The validation task a play is of: its group's number (`orchestration.sample_id`)."""
    return int(result.group_id.rsplit("-g", 1)[1])


def play_index(result: RolloutResult) -> int:
    """Which play of its task a result is (0, 1, ...)."""
    return int(result.sample_id.rsplit("-", 1)[1])


def plays(step: int, mode: Mode, results: Sequence[RolloutResult]) -> list[dict[str, Any]]:
    """eval.jsonl's lines for one evaluation's plays in one mode: the step it followed (0: the
    base policy), the mode, the task (its index in the validation split) and the play of it,
    whether it succeeded (`stats.succeeded`), its aggregate reward, its reward components and
    the environment's other metrics.
    A play whose episode failed or never came back has no line, as it has no part in the rates."""
    return [{"step": step, "mode": mode, "task": task_index(r), "play": play_index(r),
             "success": succeeded(r), "reward": r.aggregate_reward_score,
             "components": {m.name: m.value for m in r.metrics_list if m.type == "Reward"},
             "metrics": {m.name: m.value for m in r.metrics_list if m.type == "Metric"}}
            for r in sorted(results, key=lambda r: (task_index(r), play_index(r)))]


def evaluation(sampled: Sequence[RolloutResult], ks: Sequence[int],
               greedy: Sequence[RolloutResult] | None) -> Evaluation:
    return Evaluation(success_rate(sampled), validation_pass_at_k(sampled, ks),
                      success_rate(greedy) if greedy is not None else None)
