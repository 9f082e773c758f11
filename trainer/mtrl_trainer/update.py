"""One GRPO optimizer step over this rank's share of the step's rows.

Logprobs are recomputed with the current policy on exactly the sampled token ids, and only where
a token is trained (`logprobs.SequenceLogprobs`); the ratio is against the behaviour logprobs the
generation service reported. The reference for the KL term is the same model with the LoRA
adapter disabled (no second copy of the weights in memory).

`model` here is a `SequenceLogprobs` around the peft model, or DistributedDataParallel around
one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from mtrl_trainer.batch import Row, pad, shard
from mtrl_trainer.decoder import causal_lm
from mtrl_trainer.grpo import per_token_loss

MAX_GRAD_NORM = 1.0  # TRL's default


@dataclass(frozen=True)
class UpdateConfig:
    epsilon: float
    epsilon_high: float
    beta: float
    temperature: float
    micro_batches: int


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
) -> tuple[float, float, float, float]:
    """Forward (and backward) every micro-batch of this rank. Returns the local sums of loss,
    clipped tokens, trained tokens, |logprob - behaviour logprob| and KL."""
    loss_sum = clipped_sum = tokens = gap_sum = kl_sum = 0.0
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
            loss, clipped = per_token_loss(
                logprobs * m, part.old_logprobs * m, part.advantages,
                epsilon=config.epsilon, epsilon_high=config.epsilon_high, beta=config.beta,
                ref_logprobs=ref * m if ref is not None else None,
            )
            weighted = (loss * part.weights).sum()
            if backward:
                # DDP averages gradients over ranks; the weights already normalise globally.
                (weighted * world_size).backward()
        loss_sum += float(weighted.detach())
        clipped_sum += float((clipped.float() * m).sum())
        tokens += float(m.sum())
        gap_sum += float(((logprobs.detach() - part.old_logprobs).abs() * m).sum())
        if ref is not None:
            delta = (ref - logprobs.detach()) * m
            kl_sum += float(((torch.exp(delta) - delta - 1) * m).sum())
    return loss_sum, clipped_sum, tokens, gap_sum, kl_sum


def peft_model(model: nn.Module) -> nn.Module:
    """The peft model inside the DDP and SequenceLogprobs wrappers (for `disable_adapter`)."""
    return getattr(model, "module", model).policy


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
) -> UpdateStats:
    model.train()
    optimizer.zero_grad(set_to_none=True)
    local = step_loss(model, rows, config, pad_token_id=pad_token_id, device=device,
                      rank=rank, world_size=world_size)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM))
    optimizer.step()
    totals = torch.tensor(local, dtype=torch.float64)
    if world_size > 1:
        dist.all_reduce(totals)
    loss, clipped, tokens, gap, kl = totals.tolist()
    per_token = max(tokens, 1.0)
    return UpdateStats(loss, int(tokens), clipped / per_token, kl / per_token, grad_norm,
                       gap / per_token)


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The only trainable parameters: peft freezes the base model."""
    params = [p for p in causal_lm(model).parameters() if p.requires_grad]
    if not params:
        raise RuntimeError("the model has no trainable (LoRA) parameters")
    return params
