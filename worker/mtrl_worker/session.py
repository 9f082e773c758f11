"""The policy as one episode sees it: ids, limits, and a record of every sampled turn.

Environments call `chat`; agents reach the same session through the OpenAI-compatible proxy
with `api_key` as their key. Turn numbers are taken when a call starts, so an agent that
samples concurrently still gets distinct turns.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import NoReturn, Protocol

from mtrl_rollout.protocol import (
    ChatMessage,
    GenerateRequest,
    GenerateResponse,
    RolloutRequest,
    SamplingParams,
    StopReason,
    TurnRecord,
)
from mtrl_worker.environments.base import Completion, EpisodeLimitReached


class Generator(Protocol):
    async def generate(self, request: GenerateRequest, timeout_s: float) -> GenerateResponse:
        """Raises TimeoutError when no response came within `timeout_s`."""
        ...


class GenerationTimeout(Exception):
    """One turn's generation outlasted MTRL_GENERATE_TIMEOUT_S while the episode still had time.

    Not a TimeoutError: that one means the episode's own limit, and the two point at different
    causes (a slow or stopped trainer, against an episode too long for its limit)."""


class EpisodeSession:
    def __init__(
        self,
        request: RolloutRequest,
        generator: Generator,
        *,
        reply_queue_url: str,
        max_turns: int,
        generate_timeout_s: float,
        deadline: float,
        openai_base_url: str | None = None,
    ) -> None:
        self.request = request
        self._generator = generator
        self._reply_queue_url = reply_queue_url
        self.max_turns = max_turns
        self._generate_timeout_s = generate_timeout_s
        self._deadline = deadline  # time.time() after which nobody waits for this episode
        self.openai_base_url = openai_base_url
        self.api_key = f"mtrl-{uuid.uuid4().hex}"
        self.turns: list[TurnRecord] = []
        self.stop_reason: StopReason | None = None
        self._next_turn = 0
        self._tokens_used = 0
        self.generate_seconds = 0.0  # waiting for replies, all turns together

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: list[str] | None = None,
    ) -> Completion:
        if self._next_turn >= self.max_turns:
            self._stop(StopReason.MAX_TURNS)
        if self._tokens_used >= self.request.max_length:
            self._stop(StopReason.MAX_LENGTH)
        turn, self._next_turn = self._next_turn, self._next_turn + 1
        r = self.request
        timeout_s = max(0.0, min(self._generate_timeout_s, self._deadline - time.time()))
        request = GenerateRequest(
            run_id=r.run_id,
            step=r.step,
            group_id=r.group_id,
            sample_id=r.sample_id,
            policy_version=r.policy_version,
            request_id=uuid.uuid4().hex,
            turn=turn,
            messages=list(messages),
            sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature, stop=stop),
            max_length=r.max_length,
            reply_queue_url=self._reply_queue_url,
            deadline=time.time() + timeout_s,
        )
        started = time.monotonic()
        try:
            response = await self._generator.generate(request, timeout_s)
        except TimeoutError:
            if timeout_s < self._generate_timeout_s:
                raise  # the episode's deadline was the nearer limit: the episode timed out
            raise GenerationTimeout(
                f"turn {turn}: no completion within {self._generate_timeout_s:g}s "
                "(MTRL_GENERATE_TIMEOUT_S); the trainer's sampler is slow or stopped"
            ) from None
        finally:
            self.generate_seconds += time.monotonic() - started
        choice = response.choices[0]
        logprobs = [t.logprob for t in choice.logprobs.content]
        self.turns.append(
            TurnRecord(
                turn=turn,
                policy_version=response.policy_version,
                prompt_token_ids=response.prompt_token_ids,
                completion_token_ids=choice.token_ids,
                completion_logprobs=logprobs,
                finish_reason=choice.finish_reason,
            )
        )
        used = len(response.prompt_token_ids) + len(choice.token_ids)
        self._tokens_used = max(self._tokens_used, used)
        return Completion(choice.message.content, choice.finish_reason, choice.token_ids, logprobs)

    def _stop(self, reason: StopReason) -> NoReturn:
        self.stop_reason = reason
        raise EpisodeLimitReached(reason)

    @property
    def completion_tokens(self) -> int:
        return sum(len(t.completion_token_ids) for t in self.turns)
