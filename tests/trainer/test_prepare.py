"""What a step trains on: informative groups up to promptsPerStep, with advantages per episode
or per turn laid out on exactly the tokens of each turn."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_rollout.protocol import RolloutResult, TurnRecord
from mtrl_trainer.batch import build_rows, pad
from mtrl_trainer.config import TrainerConfig
from mtrl_trainer.loop import prepare
from mtrl_trainer.orchestration import Rollouts

from .conftest import run_spec


def config(**grpo: Any) -> TrainerConfig:
    spec = MultiTurnRLRunSpec.model_validate(run_spec("b", **grpo))
    return TrainerConfig(spec, "r", "n", "q", "q", "q", "q", None, None, None, None, None, 1.0, "a")


def result(group: int, index: int, reward: float) -> RolloutResult:
    turn = TurnRecord(turn=0, policy_version=0, prompt_token_ids=[1, 2], completion_token_ids=[3],
                      completion_logprobs=[-1.0], finish_reason="stop")
    return RolloutResult(run_id="r", step=0, group_id=f"g{group}", sample_id=f"g{group}-{index}",
                         policy_version=0, aggregate_reward_score=reward, metrics_list=[],
                         stop_reason="done", trajectory=[turn])


def test_a_step_trains_on_at_most_prompts_per_step_informative_groups() -> None:
    rewards = [(0.0, 0.0), (1.0, 0.0), (0.5, 0.5), (0.0, 1.0), (1.0, 0.5)]  # 3 informative
    groups = [[result(g, i, r) for i, r in enumerate(pair)] for g, pair in enumerate(rewards)]
    prepared = prepare(Rollouts(groups, [r for g in groups for r in g]),
                       config(groupSize=2, promptsPerStep=2), 1)
    assert (prepared.groups, prepared.zero_variance_groups, prepared.trained_groups) == (5, 2, 2)
    # the first two informative groups, in the order played: g1 and g3
    assert sorted(row.advantage for row in prepared.rows) == pytest.approx(
        sorted([0.7070, -0.7070, -0.7070, 0.7070]), abs=1e-3)


def two_turns(group: int, index: int, rewards: tuple[float, float] | None,
              total: float) -> RolloutResult:
    """Turn 0: prompt [1, 2], completion [3, 4]; turn 1: environment text [5], completion [6]."""
    turns = [
        TurnRecord(turn=0, policy_version=0, prompt_token_ids=[1, 2], completion_token_ids=[3, 4],
                   completion_logprobs=[-1.0, -1.0], finish_reason="stop",
                   reward=rewards[0] if rewards else None),
        TurnRecord(turn=1, policy_version=0, prompt_token_ids=[1, 2, 3, 4, 5],
                   completion_token_ids=[6], completion_logprobs=[-1.0], finish_reason="stop",
                   reward=rewards[1] if rewards else None),
    ]
    return RolloutResult(run_id="r", step=0, group_id=f"g{group}", sample_id=f"g{group}-{index}",
                         policy_version=0, aggregate_reward_score=total, metrics_list=[],
                         stop_reason="done", trajectory=turns)


def test_per_turn_advantages_reach_exactly_the_tokens_of_their_turn() -> None:
    """Same episode reward (no signal per episode), different turns: turn-level credit still
    trains; a group without turn rewards falls back to its episode advantage."""
    judged = [two_turns(0, 0, (1.0, 0.0), 0.5), two_turns(0, 1, (0.0, 1.0), 0.5)]
    unjudged = [two_turns(1, 0, None, 1.0), two_turns(1, 1, None, 0.0)]
    groups = [judged, unjudged]
    prepared = prepare(Rollouts(groups, judged + unjudged),
                       config(groupSize=2, promptsPerStep=2, advantageLevel="turn"), 1)
    assert (prepared.zero_variance_groups, prepared.trained_groups) == (0, 2)
    padded = pad(prepared.rows, 0)
    a = 0.5 / (0.7071068 + 1e-4)  # returns 0 and 1 around their mean, over their std
    # Tokens [1, 2, 3, 4, 5, 6]: turn 0's completion [3, 4] (returns 1.0 vs 1.0: 0), turn 1's
    # environment text [5] (masked) and completion [6] (0 vs 1: -a for row 0).
    expected = [[0, 0, 0, 0, -a, -a], [0, 0, 0, 0, a, a]]
    assert padded.advantages[:2].tolist() == [pytest.approx(row, abs=1e-4) for row in expected]
    assert padded.mask[0].tolist() == [0, 0, 1, 1, 0, 1]
    assert padded.advantages[2].tolist() == pytest.approx([a] * 6, abs=1e-4)  # episode level
    # Per episode, the judged group has equal rewards: no signal, left out.
    episode_level = prepare(Rollouts(groups, judged + unjudged),
                            config(groupSize=2, promptsPerStep=2), 1)
    assert (episode_level.zero_variance_groups, episode_level.trained_groups) == (1, 1)


def test_rows_with_one_advantage_stay_one_number_per_row() -> None:
    rows = build_rows([two_turns(0, 0, None, 1.0)], [0.5], loss_type="dapo",
                      max_completion_length=8, max_sequence_length=64, micro_batches=1)
    assert rows[0].token_advantages is None and pad(rows, 0).advantages.tolist() == [0.5]


def test_a_micro_batch_holds_whole_groups_so_their_shared_prompt_runs_once() -> None:
    """Episodes are dealt in order, in equal runs: with 3 groups of 2 and 3 micro-batches, each
    micro-batch is one group (logprobs.shared_prefixes then runs its prompt once)."""
    rewards = [(1.0, 0.0), (0.0, 1.0), (1.0, 0.5)]
    groups = [[result(g, i, r) for i, r in enumerate(pair)] for g, pair in enumerate(rewards)]
    prepared = prepare(Rollouts(groups, [r for g in groups for r in g]),
                       config(groupSize=2, promptsPerStep=3, gradientAccumulationSteps=3), 3)
    assert [row.micro_batch for row in prepared.rows] == [0, 0, 1, 1, 2, 2]
    one = prepare(Rollouts(groups, [r for g in groups for r in g]),
                  config(groupSize=2, promptsPerStep=3), 1)
    assert {row.micro_batch for row in one.rows} == {0}
