"""Rollout results -> training rows, without ever re-tokenizing.

A row is one flat token sequence of an episode (prompt, completions and environment text, as
sampled) with its loss mask (1 on model-generated tokens only), the behaviour logprobs carried
in the result, its advantage (one per episode, or one per token when advantages are per turn)
and its per-token loss weights for the whole step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mtrl_trainer.grpo import LossType, token_weights

if TYPE_CHECKING:  # the protocol needs pydantic; the GPU check builds rows without it
    from mtrl_rollout.protocol import RolloutResult


@dataclass(frozen=True)
class Row:
    token_ids: list[int]
    mask: list[int]  # 1 where the token was sampled by the policy
    old_logprobs: list[float]  # behaviour logprob per token, 0 where mask is 0
    weights: list[float]  # loss weight per token (0 where mask is 0)
    advantage: float
    micro_batch: int
    token_advantages: list[float] | None = None  # per token (per-turn advantages), else None

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)


@dataclass(frozen=True)
class Padded:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float; trained tokens
    old_logprobs: torch.Tensor  # [B, T]
    weights: torch.Tensor  # [B, T]
    advantages: torch.Tensor  # [B], or [B, T] when some row has per-token advantages


@dataclass(frozen=True)
class EpisodeSequence:
    """One flat token sequence of an episode, as sampled."""

    episode: int
    token_ids: list[int]
    mask: list[int]
    logprobs: list[float]
    advantage: float
    token_advantages: list[float] | None = None


def build_rows(
    results: Sequence[RolloutResult],
    advantages: Sequence[float | Mapping[int, float]],
    *,
    loss_type: LossType,
    max_completion_length: int,
    max_sequence_length: int,
    micro_batches: int,
) -> list[Row]:
    """Rows of one optimizer step. An episode's advantage is one number, or one per turn
    (turn -> advantage) for the tokens of that turn. Episodes are dealt to micro-batches in
    order, in equal runs: `results` come group by group, so a micro-batch holds whole groups
    where the counts divide, and a group's games, which open with the same prompt, run it once
    (`logprobs.shared_prefixes`). Rows with nothing to train are left out."""
    from mtrl_rollout.trajectory import flatten

    sequences = []
    for episode, (result, advantage) in enumerate(zip(results, advantages, strict=True)):
        for seq in flatten(result.trajectory):
            if isinstance(advantage, Mapping):
                per_token = [advantage.get(turn, 0.0) for turn in seq.token_turns]
                sequences.append(EpisodeSequence(episode, seq.token_ids, seq.loss_mask,
                                                 seq.logprobs, 0.0, per_token))
            else:
                sequences.append(EpisodeSequence(episode, seq.token_ids, seq.loss_mask,
                                                 seq.logprobs, advantage))
    return rows_from_sequences(sequences, loss_type=loss_type,
                               max_completion_length=max_completion_length,
                               max_sequence_length=max_sequence_length, micro_batches=micro_batches)


def rows_from_sequences(
    sequences: Sequence[EpisodeSequence],
    *,
    loss_type: LossType,
    max_completion_length: int,
    max_sequence_length: int,
    micro_batches: int,
) -> list[Row]:
    flat: list[EpisodeSequence] = []
    for seq in sequences:
        ids = seq.token_ids[:max_sequence_length]
        mask = seq.mask[: len(ids)]
        if any(mask):
            per_token = seq.token_advantages[: len(ids)] if seq.token_advantages else None
            flat.append(EpisodeSequence(seq.episode, ids, mask, seq.logprobs[: len(ids)],
                                        seq.advantage, per_token))
    if not flat:
        return []
    width = max(len(s.token_ids) for s in flat)
    mask_t = torch.tensor([s.mask + [0] * (width - len(s.mask)) for s in flat])
    episodes = torch.tensor([s.episode for s in flat])
    micro = episodes * micro_batches // (max(s.episode for s in sequences) + 1)
    weights = token_weights(
        mask_t, episodes, micro, loss_type=loss_type, max_completion_length=max_completion_length
    )
    return [
        Row(s.token_ids, s.mask, s.logprobs, weights[i, : len(s.token_ids)].tolist(), s.advantage,
            int(micro[i]), s.token_advantages)
        for i, s in enumerate(flat)
    ]


def shard(rows: Sequence[Row], micro_batch: int, rank: int, world_size: int) -> list[Row]:
    """This rank's rows of one micro-batch."""
    return [r for r in rows if r.micro_batch == micro_batch][rank::world_size]


def pad(rows: Sequence[Row], pad_token_id: int, device: torch.device | str = "cpu") -> Padded:
    """Right-padded tensors. An empty shard becomes one all-padding row with zero weight, so
    every data-parallel rank still runs the same forward/backward collectives."""
    if not rows:
        rows = [Row([pad_token_id, pad_token_id], [0, 0], [0.0, 0.0], [0.0, 0.0], 0.0, 0)]
    width = max(len(r.token_ids) for r in rows)

    def padded(values: Sequence[Sequence[float]], fill: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([list(v) + [fill] * (width - len(v)) for v in values], dtype=dtype)

    return Padded(
        input_ids=padded([r.token_ids for r in rows], pad_token_id, torch.long).to(device),
        attention_mask=padded([[1] * len(r.token_ids) for r in rows], 0, torch.long).to(device),
        mask=padded([r.mask for r in rows], 0, torch.float32).to(device),
        old_logprobs=padded([r.old_logprobs for r in rows], 0.0, torch.float32).to(device),
        weights=padded([r.weights for r in rows], 0.0, torch.float32).to(device),
        advantages=(
            padded([r.token_advantages or [r.advantage] * len(r.token_ids) for r in rows], 0.0,
                   torch.float32).to(device)
            if any(r.token_advantages is not None for r in rows)
            else torch.tensor([r.advantage for r in rows], dtype=torch.float32, device=device)),
    )
