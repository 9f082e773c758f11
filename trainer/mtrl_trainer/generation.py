"""The generation service: answers workers' GenerateRequests in batches from the current policy.

`mtrl_rollout.generation.GenerationServer` receives requests and calls `sample` with each batch
it gathered; batches that arrive while the model is busy are merged into the next decode, so the
model always decodes as many sequences as are waiting. The run's temperature and top-p always
apply (the loss recomputes logprobs at that temperature); a request may only lower the token
budget. Requests from another trainer attempt (a killed predecessor's episodes) are refused so
their episodes end quickly instead of spending decode time on samples nobody will train on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mtrl_rollout.generation import error_response
from mtrl_rollout.protocol import (
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    GenerateRequest,
    GenerateResponse,
    TokenLogprob,
)
from mtrl_trainer.decoder import Sampled, StaticCacheDecoder
from mtrl_trainer.models import Policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float
    top_p: float
    max_new_tokens: int
    max_sequence_length: int
    max_batch: int = 256


class GenerationService:
    def __init__(
        self,
        policy: Policy,
        sampling: SamplingConfig,
        *,
        model_lock: threading.Lock,
        attempt: str,
        seed: int,
    ) -> None:
        self._policy = policy
        self._sampling = sampling
        self._lock = model_lock
        self._attempt_prefix = f"{attempt}-"
        self._decoder = StaticCacheDecoder(policy.model)
        self._generator = torch.Generator(self._decoder.device).manual_seed(seed)
        self._pending: list[tuple[GenerateRequest, asyncio.Future[GenerateResponse]]] = []
        self._runner: asyncio.Task[None] | None = None
        self.policy_version = 0
        self.tokens = 0  # completion tokens generated so far
        self.decode_seconds = 0.0

    async def sample(self, requests: list[GenerateRequest]) -> list[GenerateResponse]:
        loop = asyncio.get_running_loop()
        futures = []
        for request in requests:
            future: asyncio.Future[GenerateResponse] = loop.create_future()
            self._pending.append((request, future))
            futures.append(future)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain())
        return list(await asyncio.gather(*futures))

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[: self._sampling.max_batch]
            del self._pending[: len(batch)]
            try:
                responses = await asyncio.to_thread(self._answer, [r for r, _ in batch])
            except Exception as exc:
                log.exception("decoding a batch of %d failed", len(batch))
                responses = [error_response(r, f"sampling failed: {exc}") for r, _ in batch]
            for (_, future), response in zip(batch, responses, strict=True):
                if not future.done():
                    future.set_result(response)

    def _answer(self, requests: Sequence[GenerateRequest]) -> list[GenerateResponse]:
        responses: list[GenerateResponse | None] = [None] * len(requests)
        work: list[tuple[int, list[int], int]] = []
        for i, request in enumerate(requests):
            if not request.sample_id.startswith(self._attempt_prefix):
                responses[i] = error_response(request, "request from another trainer attempt")
                continue
            prompt = self._policy.tokenizer.encode_chat(request.messages)
            budget = self._budget(request, len(prompt))
            if budget <= 0:
                responses[i] = error_response(request, "episode token budget exhausted")
                continue
            work.append((i, prompt, budget))
        if work:
            started = time.perf_counter()
            with self._lock:
                self._policy.model.eval()  # no LoRA dropout while sampling
                version = self.policy_version
                sampled = self._decoder.generate(
                    [p for _, p, _ in work], [b for _, _, b in work],
                    stop_token_ids=self._policy.tokenizer.stop_token_ids,
                    temperature=self._sampling.temperature, top_p=self._sampling.top_p,
                    generator=self._generator,
                )
            self.decode_seconds += time.perf_counter() - started
            for (i, prompt, _), out in zip(work, sampled, strict=True):
                self.tokens += len(out.token_ids)
                responses[i] = self._response(requests[i], prompt, out, version)
        return [r for r in responses if r is not None]

    def _budget(self, request: GenerateRequest, prompt_tokens: int) -> int:
        budget = min(self._sampling.max_new_tokens,
                     self._sampling.max_sequence_length - prompt_tokens)
        if request.sampling.max_tokens is not None:
            budget = min(budget, request.sampling.max_tokens)
        if request.max_length is not None:
            budget = min(budget, request.max_length - prompt_tokens)
        return budget

    def _response(
        self, request: GenerateRequest, prompt: list[int], out: Sampled, version: int
    ) -> GenerateResponse:
        text = self._policy.tokenizer.decode(out.token_ids)
        return GenerateResponse.replying_to(
            request,
            policy_version=version,
            prompt_token_ids=prompt,
            choices=[Choice(
                message=ChatMessage(role="assistant", content=text),
                finish_reason="stop" if out.stopped else "length",
                # log_softmax is <= 0; min() absorbs float noise at probability ~1.
                logprobs=ChoiceLogprobs(
                    content=[TokenLogprob(logprob=min(lp, 0.0)) for lp in out.logprobs]
                ),
                token_ids=out.token_ids,
            )],
        )
