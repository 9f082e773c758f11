"""What both decoders share: a generation job, its result, and the sampling rule.

No dependency beyond torch (the GPU check imports this with only torch and transformers there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Sampled:
    token_ids: list[int]
    logprobs: list[float]  # log p(token) under softmax(logits / temperature); temperature 1 if greedy
    stopped: bool  # ended with a stop token (kept in token_ids)
    reused_tokens: int = 0  # prompt tokens whose keys and values came from the prefix cache
    error: str | None = None  # set when the job could not be sampled


@dataclass(eq=False)  # identity: jobs are tracked in sets
class Job:
    """One completion to sample. `key` names the episode: a later turn with the same key may
    reuse the keys and values of this one (its prompt extends this prompt and completion)."""

    prompt: Sequence[int]
    budget: int  # most new tokens
    key: str | None = None
    on_done: Callable[[Sampled], None] | None = None
    result: Sampled | None = field(default=None, init=False)

    def finish(self, result: Sampled) -> None:
        self.result = result
        if self.on_done is not None:
            self.on_done(result)


@dataclass(frozen=True)
class SamplingParams:
    """`temperature` 0 means greedy: argmax, logprobs reported at temperature 1."""

    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: frozenset[int] = frozenset()


def sample_next(
    logits: torch.Tensor, noise: torch.Tensor | None, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and its logprob per row of `logits` [B, V]. `noise` is uniform in (0, 1), [B, V]
    (unused when greedy): Gumbel-max, argmax(log p + G), is a draw from p and needs no host sync."""
    logits = logits.float()
    if temperature <= 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = torch.argmax(logits, dim=-1)
        return token, logprobs.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    candidates = logprobs
    if top_p < 1.0:
        sorted_lp, order = torch.sort(logprobs, dim=-1, descending=True)
        before = torch.cumsum(sorted_lp.exp(), dim=-1) - sorted_lp.exp()
        drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before > top_p)
        candidates = logprobs.masked_fill(drop, float("-inf"))
    assert noise is not None
    token = torch.argmax(candidates - torch.log(-torch.log(noise)), dim=-1)
    return token, logprobs.gather(-1, token.unsqueeze(-1)).squeeze(-1)


def trim(tokens: list[int], logprobs: list[float], stops: frozenset[int], reused: int) -> Sampled:
    """Cut at the first stop token (kept)."""
    for i, token in enumerate(tokens):
        if token in stops:
            return Sampled(tokens[: i + 1], logprobs[: i + 1], True, reused)
    return Sampled(tokens, logprobs, False, reused)
