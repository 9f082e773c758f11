"""One GRPO optimizer step over this rank's share of the step's rows.

Logprobs are recomputed with the current policy on exactly the sampled token ids, and only where
a token is trained (`logprobs.SequenceLogprobs`). Without rollout correction the ratio is against
the behaviour logprobs the generation service reported. With it (decoupled PPO, as in AReaL and
verl) the ratio is against the trainer's own policy before the update, and each token's loss is
weighted by the truncated importance weight pi_train / pi_sampler (`grpo.rollout_correction_
weights`): a rollout played by an older policy, or by the same weights in other kernels, then
moves the policy as if the current one had played it, up to the truncation. The reference for
the KL term is the same model with the LoRA adapter disabled (no second copy of the weights in
memory).

`model` here is a `SequenceLogprobs` around the peft model, or DistributedDataParallel around
one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import astuple, dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from mtrl_api import DIVERGED_PREFIX
from mtrl_trainer.batch import Row, pad, shard
from mtrl_trainer.decoder import causal_lm
from mtrl_trainer.grpo import CorrectionMode, per_token_loss, rollout_correction_weights

MAX_GRAD_NORM = 1.0  # TRL's default
# Attention kernels a training forward may use: all but cuDNN's (see training_attention).
TRAINING_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def training_attention() -> contextlib.AbstractContextManager[None]:
    """Forward passes that will be differentiated run without cuDNN's attention (flash or
    memory-efficient attention take its place; the decoder keeps it). cuDNN's is the default
    on H100/H200 from torch 2.11, and its backward returns NaN query gradients for a batch
    given an explicit attention mask whose length is 64 past a multiple of 128 and a query row
    whose logsumexp is very low, as a fully masked row of left padding has
    (pytorch/pytorch#196678, found through TRL's DPO: huggingface/trl#7181). TRL left-pads its
    prompts; its step 1 on an H200 had a finite loss and a NaN gradient norm (BENCHMARKS.md).
    The backend chosen in the forward is the one its backward runs. The flags are
    process-wide: nothing may decode meanwhile (both engines pause the policy server)."""
    return sdpa_kernel(TRAINING_ATTENTION)


@dataclass(frozen=True)
class UpdateConfig:
    epsilon: float
    epsilon_high: float
    beta: float
    temperature: float
    micro_batches: int
    correction: CorrectionMode = "none"
    correction_threshold: float = 2.0


@dataclass(frozen=True)
class UpdateStats:
    loss: float  # the step's loss, summed over micro-batches and ranks
    trained_tokens: int
    clip_fraction: float
    kl: float  # mean k3 KL per trained token (0 when beta is 0)
    grad_norm: float
    # Mean |recomputed - behaviour logprob| per trained token: how far trainer and sampler
    # disagree before the update (0 in exact arithmetic; bf16 kernels differ).
    logprob_gap: float = 0.0
    # Rollout correction: mean truncated importance weight per trained token, and the fraction
    # of trained tokens whose weight was truncated (both None without correction).
    is_weight_mean: float | None = None
    is_truncated_fraction: float | None = None


@dataclass
class StepSums:
    """Sums over this rank's micro-batches (all-reduced across ranks by `train_step`)."""

    loss: float = 0.0
    clipped: float = 0.0  # trained tokens whose ratio was clipped
    tokens: float = 0.0  # trained tokens
    gap: float = 0.0  # |recomputed - behaviour logprob|
    kl: float = 0.0
    is_weight: float = 0.0  # truncated importance weights
    truncated: float = 0.0  # trained tokens whose weight was truncated


def step_loss(
    model: nn.Module,
    rows: Sequence[Row],
    config: UpdateConfig,
    *,
    pad_token_id: int,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    backward: bool = True,
) -> StepSums:
    """Forward (and backward) every micro-batch of this rank."""
    sums = StepSums()
    for micro in range(config.micro_batches):
        part = pad(shard(rows, micro, rank, world_size), pad_token_id, device)
        sync = micro == config.micro_batches - 1 or not hasattr(model, "no_sync")
        with contextlib.nullcontext() if sync else model.no_sync():
            logprobs = model(part.input_ids, part.attention_mask, part.mask, config.temperature)
            ref = None
            if config.beta:
                with torch.no_grad(), peft_model(model).disable_adapter():
                    ref = model(part.input_ids, part.attention_mask, part.mask, config.temperature)
            # Zero every untrained position in all inputs: exp() of a masked difference can
            # overflow, and inf * 0 weight would still be NaN.
            m = part.mask
            old, is_weights = part.old_logprobs * m, None
            if config.correction != "none":
                correction = rollout_correction_weights(
                    logprobs, part.old_logprobs, m, mode=config.correction,
                    threshold=config.correction_threshold)
                old, is_weights = logprobs.detach() * m, correction.weights
                sums.is_weight += float(correction.weights.sum())
                sums.truncated += float(correction.truncated.sum())
            loss, clipped = per_token_loss(
                logprobs * m, old, part.advantages,
                epsilon=config.epsilon, epsilon_high=config.epsilon_high, beta=config.beta,
                ref_logprobs=ref * m if ref is not None else None, is_weights=is_weights,
            )
            weighted = (loss * part.weights).sum()
            if backward:
                # DDP averages gradients over ranks; the weights already normalise globally.
                (weighted * world_size).backward()
        sums.loss += float(weighted.detach())
        sums.clipped += float((clipped.float() * m).sum())
        sums.tokens += float(m.sum())
        sums.gap += float(((logprobs.detach() - part.old_logprobs).abs() * m).sum())
        if ref is not None:
            delta = (ref - logprobs.detach()) * m
            sums.kl += float(((torch.exp(delta) - delta - 1) * m).sum())
    return sums


def peft_model(model: nn.Module) -> nn.Module:
    """The peft model inside the DDP and SequenceLogprobs wrappers (for `disable_adapter`)."""
    return getattr(model, "module", model).policy


class Diverged(Exception):
    """The step's gradient norm is not finite: its update was not applied."""

    def __init__(self, grad_norm: float, step: int, total: int) -> None:
        self.grad_norm = grad_norm
        super().__init__(f"{DIVERGED_PREFIX} the gradient norm of step {step}/{total} is "
                         f"{grad_norm}; its update was not applied, so the weights and the last "
                         "checkpoint hold the last good policy")


def check_finite(grad_norm: float, step: int, total: int) -> None:
    """Stop before an update with a NaN or infinite gradient norm (one NaN in a LoRA weight
    turns every later sample into noise or a sampling error); both engines call it."""
    if not math.isfinite(grad_norm):
        raise Diverged(grad_norm, step, total)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[Row],
    config: UpdateConfig,
    *,
    pad_token_id: int,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    step: int = 0,
    total: int = 0,
) -> UpdateStats:
    """One optimizer step; `Diverged` (before stepping) when the gradient norm is not finite.
    DDP has averaged the gradients, so every rank sees the same norm and stops alike."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with training_attention():
        local = step_loss(model, rows, config, pad_token_id=pad_token_id, device=device,
                          rank=rank, world_size=world_size)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM))
    check_finite(grad_norm, step, total)
    optimizer.step()
    totals = torch.tensor(astuple(local), dtype=torch.float64)
    if world_size > 1:
        dist.all_reduce(totals)
    sums = StepSums(*totals.tolist())
    per_token = max(sums.tokens, 1.0)
    corrected = config.correction != "none"
    return UpdateStats(
        sums.loss, int(sums.tokens), sums.clipped / per_token, sums.kl / per_token, grad_norm,
        sums.gap / per_token,
        is_weight_mean=sums.is_weight / per_token if corrected else None,
        is_truncated_fraction=sums.truncated / per_token if corrected else None,
    )


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The only trainable parameters: peft freezes the base model."""
    params = [p for p in causal_lm(model).parameters() if p.requires_grad]
    if not params:
        raise RuntimeError("the model has no trainable (LoRA) parameters")
    return params
