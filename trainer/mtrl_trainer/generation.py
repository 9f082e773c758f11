"""The generation service: answers workers' GenerateRequests from the current policy.

`mtrl_rollout.generation.GenerationServer` (or, on other ranks, `sharding.serve_share`) calls
`sample` for each request as it arrives. Each becomes a decoder job, keyed by its sample id so the
next turn of the episode reuses its cached prefix, and one engine thread keeps the decoder busy:
jobs are admitted between decode steps (continuous batching) and each response goes back as soon
as its own completion ends. The run's temperature and top-p always apply (the loss recomputes
logprobs at that temperature); a request may only lower the token budget. Requests from another
trainer attempt (a killed predecessor's episodes) are refused so their episodes end quickly
instead of spending decode time on samples nobody will train on.

The engine holds the model lock from the moment it has work until the decoder is idle, so a
weight update never lands in the middle of a completion. While it holds the lock, fp32 weights
have the LoRA adapter merged into them (`models.adapter_merged`; bench/step_speed.py measured
it); in 16- or 8-bit weights the unmerge would not give the base weights back (each round trip
rounds them again), so those sample with the adapter as it is; `update_policy` (called with the lock
held, right after the optimizer step) drops the cached prefixes of the old weights and bumps the
policy version every response carries.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
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
from mtrl_trainer.decoder import cache_length
from mtrl_trainer.decoders import Decoder, make_decoder
from mtrl_trainer.models import Policy, adapter_merged
from mtrl_trainer.sampling import Job, Sampled, SamplingParams

log = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 2 << 30
GPU_KV_CACHE_FRACTION = 0.3  # of the memory free when the service starts


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float
    top_p: float
    max_new_tokens: int
    max_sequence_length: int
    max_batch: int = 256


def rows_that_fit(model: torch.nn.Module, max_length: int, most: int) -> int:
    """Decoder rows (sequences in flight) whose KV cache fits the memory set aside for it."""
    config = model.config
    layers = int(config.num_hidden_layers)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None)
                   or config.hidden_size // config.num_attention_heads)
    weight = next(model.parameters())
    per_row = 2 * layers * kv_heads * head_dim * cache_length(max_length) * weight.element_size()
    if weight.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(weight.device)
        budget = int(free * GPU_KV_CACHE_FRACTION)
    else:
        budget = CPU_KV_CACHE_BYTES
    return max(1, min(most, budget // per_row))


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
        base = policy.model.get_base_model()
        self.decoder: Decoder = make_decoder(
            policy.model, max_length=sampling.max_sequence_length,
            rows=rows_that_fit(base, sampling.max_sequence_length, sampling.max_batch))
        weight = next(base.parameters())
        device = weight.device
        self._merge = weight.dtype == torch.float32
        self.decoder.configure(
            SamplingParams(sampling.temperature, sampling.top_p, policy.tokenizer.stop_token_ids),
            torch.Generator(device).manual_seed(seed))
        self._inbox: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition()
        self._engine: threading.Thread | None = None
        self._closed = False
        self._pausing = False  # an update waits: finish what is decoding, admit nothing new
        self._open: set[Job] = set()  # submitted, not finished
        self._version_in_use = 0
        self.policy_version = 0
        self.tokens = 0  # completion tokens generated so far
        self.decode_seconds = 0.0
        self.sampled = 0  # requests answered with a completion or a sampling error
        self.sample_seconds = 0.0  # their time from arrival to answer: waiting, then decoding
        self.served: collections.Counter[str] = collections.Counter()  # turns per sample id

    # ------------------------------------------------------------------ asyncio side

    async def sample(self, request: GenerateRequest) -> GenerateResponse:
        """The response to `request`, as soon as its own completion ends."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[GenerateResponse] = loop.create_future()
        job = self._job(request, loop, future)
        if isinstance(job, str):  # refused
            return error_response(request, job)
        started = time.perf_counter()
        with self._wake:
            self._inbox.append(job)
            self._wake.notify()
        self._start_engine()
        response = await future
        self.sampled += 1
        self.sample_seconds += time.perf_counter() - started
        return response

    def _job(
        self, request: GenerateRequest, loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[GenerateResponse],
    ) -> Job | str:
        """The decoder job for `request`, or why it is refused."""
        if not request.sample_id.startswith(self._attempt_prefix):
            return "request from another trainer attempt"
        prompt = self._policy.tokenizer.encode_chat(request.messages)
        budget = self._budget(request, len(prompt))
        if budget <= 0:
            return "episode token budget exhausted"

        def done(out: Sampled) -> None:  # on the engine thread
            self._open.discard(job)
            self.tokens += len(out.token_ids)
            self.served[request.sample_id] += 1
            try:
                response = self._response(request, prompt, out, self._version_in_use)
            except Exception as exc:  # never leave the episode waiting
                response = error_response(request, f"building the response failed: {exc}")
            loop.call_soon_threadsafe(_settle, future, response)

        job = Job(prompt, budget, request.sample_id, done)
        self._open.add(job)
        return job

    def _budget(self, request: GenerateRequest, prompt_tokens: int) -> int:
        budget = min(self._sampling.max_new_tokens,
                     self._sampling.max_sequence_length - prompt_tokens)
        if request.sampling.max_tokens is not None:
            budget = min(budget, request.sampling.max_tokens)
        if request.max_length is not None:
            budget = min(budget, request.max_length - prompt_tokens)
        return budget

    # ------------------------------------------------------------------ engine thread

    def _start_engine(self) -> None:
        if self._engine is None:
            self._engine = threading.Thread(target=self._run, name="generation", daemon=True)
            self._engine.start()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._engine is not None:
            self._engine.join(timeout=60)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """For an update: the engine finishes the completions it is decoding (never one with
        two policy versions in it), admits nothing new and lets go of the model lock until the
        block ends; waiting requests are served after, by the new version. Without it, a
        sampler fed without pause (asynchronous GRPO) would hold the lock and starve updates."""
        with self._wake:
            self._pausing = True
        try:
            yield
        finally:
            with self._wake:
                self._pausing = False
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closed and (
                        self._pausing or not (self._inbox or self.decoder.busy)):
                    self._wake.wait()
                if self._closed:
                    return
            with self._lock:
                self._policy.model.eval()  # no LoRA dropout while sampling
                self._version_in_use = self.policy_version
                started = time.perf_counter()
                try:
                    with adapter_merged(self._policy.model) if self._merge \
                            else contextlib.nullcontext():
                        self._drain()
                except Exception as exc:
                    log.exception("decoding failed")
                    self.decoder.reset()
                    for job in list(self._open):
                        job.finish(Sampled([], [], False, error=f"sampling failed: {exc}"))
                self.decode_seconds += time.perf_counter() - started

    def _drain(self) -> None:
        """Decode until nothing is waiting or in flight, new jobs joining between steps; or,
        once an update waits, until what is decoding has finished."""
        while True:
            with self._wake:
                pausing = self._pausing
                jobs = [] if pausing else list(self._inbox)
                if not pausing:
                    self._inbox.clear()
            for job in jobs:
                try:
                    self.decoder.submit(job)
                except ValueError as exc:
                    job.finish(Sampled([], [], False, error=str(exc)))
            if not (self.decoder.decoding if pausing else self.decoder.busy):
                return
            self.decoder.pump(admit=not pausing)

    def update_policy(self, version: int) -> None:
        """The weights just changed (call with the model lock held)."""
        self.decoder.invalidate()
        self.policy_version = version

    def _response(
        self, request: GenerateRequest, prompt: list[int], out: Sampled, version: int
    ) -> GenerateResponse:
        if out.error is not None:
            return error_response(request, out.error)
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


def _settle(future: asyncio.Future[GenerateResponse], response: GenerateResponse) -> None:
    if not future.done():
        future.set_result(response)
