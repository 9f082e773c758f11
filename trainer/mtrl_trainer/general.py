"""The general decoder: any transformers causal LM, through the model's own forward and cache.

For architectures the fast decoder does not implement (its layer structure, attention or logit
processing differ), correctness comes from transformers itself: prompts are left-padded into one
batch, `model(...)` runs with a `DynamicCache` built from the model's config (so sliding-window
and other per-layer caches are the model's own) and the attention implementation it was loaded
with. Per token this costs a Python-level forward, so it is slower than the fast path, and a
batch runs until its longest member finishes (no continuous batching, no prefix reuse).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import torch
from torch import nn
from transformers import DynamicCache

from mtrl_trainer.decoder import causal_lm
from mtrl_trainer.sampling import Job, Sampled, SamplingParams, sample_next, trim


class GeneralDecoder:
    def __init__(self, model: nn.Module, *, rows: int = 64, max_length: int = 2048) -> None:
        self.lm = causal_lm(model)
        self.rows = rows
        self.max_length = max_length
        head = self.lm.get_output_embeddings()
        self.device = head.weight.device
        self.params = SamplingParams()
        self.generator: torch.Generator | None = None
        self._pending: deque[Job] = deque()
        self.steps = 0
        self.prefilled_tokens = 0
        self.prefill_seconds = 0.0
        self.reused_tokens = 0
        self.row_steps = 0
        self.active_row_steps = 0

    def configure(self, params: SamplingParams, generator: torch.Generator | None = None) -> None:
        self.params, self.generator = params, generator

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    @property
    def decoding(self) -> bool:
        """A batch is decoded whole within one pump: nothing is half-done between pumps."""
        return False

    def submit(self, job: Job) -> None:
        if not job.prompt or job.budget < 1 or len(job.prompt) + job.budget > self.max_length:
            raise ValueError(f"prompt {len(job.prompt)} + budget {job.budget} tokens does not fit "
                             f"1..{self.max_length}")
        self._pending.append(job)

    def invalidate(self) -> None:
        """Nothing is cached between batches."""

    def reset(self) -> None:
        self._pending.clear()

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.params
        noise = None
        if p.temperature > 0:
            noise = torch.empty(logits.shape, device=logits.device).uniform_(
                1e-10, 1 - 1e-7, generator=self.generator)
        return sample_next(logits, noise, p.temperature, p.top_p)

    @torch.inference_mode()
    def pump(self, admit: bool = True) -> None:
        if not admit:
            return
        jobs = [self._pending.popleft() for _ in range(min(self.rows, len(self._pending)))]
        if not jobs:
            return
        dev = self.device
        width = max(len(j.prompt) for j in jobs)
        ids = torch.tensor([[0] * (width - len(j.prompt)) + list(j.prompt) for j in jobs], device=dev)
        mask = torch.tensor([[0] * (width - len(j.prompt)) + [1] * len(j.prompt) for j in jobs],
                            device=dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        budgets = torch.tensor([j.budget for j in jobs], device=dev)
        stops = torch.tensor(sorted(self.params.stop_token_ids) or [-1], device=dev)
        cache = DynamicCache(config=self.lm.config)
        started = time.perf_counter()
        out = self.lm(input_ids=ids, attention_mask=mask, position_ids=positions,
                      past_key_values=cache, use_cache=True, logits_to_keep=1)
        self.prefilled_tokens += sum(len(j.prompt) for j in jobs)
        token, logprob = self._sample(out.logits[:, -1])
        self.prefill_seconds += time.perf_counter() - started
        tokens, logprobs = [token], [logprob]
        done = torch.isin(token, stops) | (budgets <= 1)
        position = positions[:, -1]
        for count in range(2, int(budgets.max()) + 1):
            finished = int(done.sum())
            if finished == len(jobs):
                break
            self.row_steps += len(jobs)  # finished rows are computed until the batch ends
            self.active_row_steps += len(jobs) - finished
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            position = position + 1
            out = self.lm(input_ids=token[:, None], attention_mask=mask,
                          position_ids=position[:, None], past_key_values=cache, use_cache=True)
            token, logprob = self._sample(out.logits[:, -1])
            tokens.append(token)
            logprobs.append(logprob)
            done = done | torch.isin(token, stops) | (budgets <= count)
            self.steps += 1
        all_tokens = torch.stack(tokens, 1).tolist()
        all_logprobs = torch.stack(logprobs, 1).tolist()
        for job, toks, lps in zip(jobs, all_tokens, all_logprobs, strict=True):
            job.finish(trim(toks[: job.budget], lps[: job.budget], self.params.stop_token_ids, 0))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: Sequence[int],
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
        keys: Sequence[str | None] | None = None,
    ) -> list[Sampled]:
        self.configure(params, generator)
        jobs = [Job(p, b) for p, b in zip(prompts, max_new_tokens, strict=True)]
        for job in jobs:
            self.submit(job)
        while self.busy:
            self.pump()
        return [job.result for job in jobs if job.result is not None]
