"""GRPO math as pure tensor functions: advantages, per-token loss, KL, loss normalisation.

Conventions follow TRL's GRPOTrainer so results are comparable:
- advantages: reward minus its group's mean, divided by a std (Bessel-corrected, like
  `torch.std`) plus `STD_EPSILON` unless `scale_rewards` is "none";
- per-token loss: -min(r * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A), plus beta * k3 KL;
- normalisation (`token_weights`): grpo averages each sequence's tokens, then sequences; bnpo
  averages the tokens of a micro-batch; dr_grpo divides by sequences x a constant maximum
  length; dapo divides by the tokens of the whole optimizer step.

Every normalisation is expressed as a weight per token, so the loss of an optimizer step is
`sum(per_token_loss * weight)` over all its micro-batches and ranks: gradient accumulation and
data-parallel sharding then give the same update as one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
ScaleRewards = Literal["group", "batch", "none"]
STD_EPSILON = 1e-4  # TRL's; keeps near-constant groups from exploding the advantage


@dataclass(frozen=True)
class Advantages:
    values: torch.Tensor  # [groups * group_size]
    zero_variance: torch.Tensor  # [groups] bool: all rewards in the group equal


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale_rewards: ScaleRewards = "group"
) -> Advantages:
    """`rewards` is [groups * group_size], group-major. Zero-variance groups get advantage 0."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} is not groups x {group_size}")
    grouped = rewards.view(-1, group_size).to(torch.float64)
    mean = grouped.mean(dim=1, keepdim=True)
    group_std = grouped.std(dim=1, keepdim=True)
    zero_variance = torch.isclose(group_std, torch.zeros_like(group_std)).squeeze(1)
    centred = grouped - mean
    if scale_rewards == "group":
        centred = centred / (group_std + STD_EPSILON)
    elif scale_rewards == "batch":
        centred = centred / (rewards.to(torch.float64).std() + STD_EPSILON)
    elif scale_rewards != "none":
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}")
    # Equal rewards give an exact 0, not rounding noise divided by epsilon.
    centred = torch.where(zero_variance.unsqueeze(1), torch.zeros_like(centred), centred)
    return Advantages(centred.reshape(-1).to(rewards.dtype), zero_variance)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(d) - d - 1 with d = ref - policy.
    Non-negative, unbiased, and exactly 0 where the two agree."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def per_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon: float,
    epsilon_high: float,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped policy-gradient loss per token, [B, T], and the clipped-token indicator.

    `advantages` is [B] (one per sequence) or [B, T]. The ratio is against the behaviour
    logprobs the sampler reported; clip-higher (epsilon_high > epsilon) leaves more room for
    raising unlikely tokens than for lowering likely ones.
    """
    adv = advantages.unsqueeze(1) if advantages.ndim == 1 else advantages
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    loss = -torch.min(ratio * adv, clipped * adv)
    was_clipped = (ratio * adv) > (clipped * adv)
    if beta:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs reference logprobs")
        loss = loss + beta * k3_kl(logprobs, ref_logprobs)
    return loss, was_clipped


def token_weights(
    mask: torch.Tensor,
    sequence_ids: torch.Tensor,
    micro_batch_ids: torch.Tensor,
    *,
    loss_type: LossType,
    max_completion_length: int,
) -> torch.Tensor:
    """Per-token weights [B, T] over a whole optimizer step so that the step loss is
    `sum(per_token_loss * weights)`.

    `mask` [B, T] is 1 on trained (model-generated) tokens. `sequence_ids` [B] names the
    sequence (episode) a row belongs to: an episode split into several rows (its template broke
    the prefix) still counts as one sequence. `micro_batch_ids` [B] assigns rows to the step's
    gradient-accumulation micro-batches.
    """
    mask = mask.to(torch.float64)
    n_micro = int(micro_batch_ids.max().item()) + 1 if micro_batch_ids.numel() else 1
    if loss_type == "dapo":
        return (mask / mask.sum().clamp(min=1.0)).float()
    weights = torch.zeros_like(mask)
    for micro in range(n_micro):
        rows = micro_batch_ids == micro
        if not rows.any():
            continue
        m = mask[rows]
        seqs = sequence_ids[rows]
        n_seqs = len(torch.unique(seqs))
        if loss_type == "bnpo":
            w = m / m.sum().clamp(min=1.0)
        elif loss_type == "dr_grpo":
            w = m / (n_seqs * max_completion_length)
        elif loss_type == "grpo":
            # Tokens of each sequence, summed over its rows.
            _, inverse = torch.unique(seqs, return_inverse=True)
            per_seq = torch.zeros(n_seqs, dtype=m.dtype).index_add_(0, inverse, m.sum(dim=1))
            w = m / per_seq[inverse].clamp(min=1.0).unsqueeze(1) / n_seqs
        else:
            raise ValueError(f"unknown loss_type {loss_type!r}")
        weights[rows] = w / n_micro
    return weights.float()
