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

import itertools
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
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped policy-gradient loss per token, [B, T], and the clipped-token indicator.

    `advantages` is [B] (one per sequence) or [B, T]. The ratio is against `old_logprobs`: the
    behaviour logprobs the sampler reported, or with rollout correction the trainer's own before
    the update, the policy-gradient term then weighted by `is_weights` (the KL term is not: it
    is taken under the current policy). Clip-higher (epsilon_high > epsilon) leaves more room
    for raising unlikely tokens than for lowering likely ones.
    """
    adv = advantages.unsqueeze(1) if advantages.ndim == 1 else advantages
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high)
    loss = -torch.min(ratio * adv, clipped * adv)
    was_clipped = (ratio * adv) > (clipped * adv)
    if is_weights is not None:
        loss = loss * is_weights
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


CorrectionMode = Literal["none", "token", "sequence"]
LOG_RATIO_BOUND = 20.0  # exp(20) ~ 5e8: no overflow before truncation (verl's SAFETY_BOUND)


@dataclass(frozen=True)
class CorrectionWeights:
    weights: torch.Tensor  # [B, T] truncated importance weights, 0 off the mask, no gradient
    truncated: torch.Tensor  # [B, T] bool: the untruncated weight was above the threshold


def rollout_correction_weights(
    train_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: CorrectionMode,
    threshold: float,
) -> CorrectionWeights:
    """Truncated importance weights pi_train / pi_sampler for tokens sampled by an older or
    numerically different policy (verl's `compute_rollout_correction_weights`).

    `train_logprobs` are the trainer's logprobs before the update (the proximal policy of
    decoupled PPO), `sampler_logprobs` the ones the sampler reported, `mask` [B, T] 1 on trained
    tokens. token: w_t = min(exp(train_t - sampler_t), threshold). sequence: one weight per row,
    min(exp(sum over its trained tokens of train - sampler), threshold). The log ratio is bounded
    to +-20 before exp, so a wild token neither overflows nor underflows to a NaN.
    """
    if mode not in ("token", "sequence"):
        raise ValueError(f"unknown rollout correction mode {mode!r}")
    mask = mask.to(train_logprobs.dtype)
    log_ratio = (train_logprobs.detach() - sampler_logprobs) * mask
    if mode == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
    raw = torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    truncated = (raw > threshold) & mask.bool()
    return CorrectionWeights(raw.clamp(max=threshold) * mask, truncated)


def turn_advantages(
    turn_rewards: list[list[float]], scale_rewards: ScaleRewards = "group"
) -> list[list[float]]:
    """Per-turn advantages of one group from the rewards an environment gave each turn.

    `turn_rewards[i][t]` is episode i's reward for its turn t. The advantage of (i, t) is its
    return from turn t on (the sum of its rewards of turns t, t+1, ...) minus the mean of that
    return over the group's episodes that reached turn t, divided by their std (Bessel, plus
    `STD_EPSILON`) unless `scale_rewards` is "none" ("batch" scales per turn like "group").
    A turn only one episode reached, or where all returns are equal, gets advantage 0: GRPO's
    baseline with the group as the comparison, applied turn by turn (return-to-go credit, as in
    turn-level GRPO variants such as MT-GRPO).
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"unknown scale_rewards {scale_rewards!r}")
    returns = [list(itertools.accumulate(reversed(r)))[::-1] for r in turn_rewards]
    out = [[0.0] * len(r) for r in turn_rewards]
    for t in range(max((len(r) for r in returns), default=0)):
        reached = [i for i, r in enumerate(returns) if t < len(r)]
        if len(reached) < 2:
            continue
        values = torch.tensor([returns[i][t] for i in reached], dtype=torch.float64)
        std = values.std()
        if torch.isclose(std, torch.zeros_like(std)):
            continue
        centred = values - values.mean()
        if scale_rewards != "none":
            centred = centred / (std + STD_EPSILON)
        for i, value in zip(reached, centred.tolist(), strict=True):
            out[i][t] = value
    return out
