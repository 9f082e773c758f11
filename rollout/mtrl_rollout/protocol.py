"""Versioned messages between the trainer and rollout workers (docs/protocol.md).

Field names follow Nova Forge BYOO where the two overlap (`sample_id`, `max_length`,
`rewards.range`, `data`, `messages`, `choices[].message/finish_reason/logprobs`, `id`,
`aggregate_reward_score`, `metrics_list`). Every message also carries the run, step, group and
sample ids and the policy version, so any message can be routed, deduplicated and attributed
to the policy that produced it.

Ownership of tokens: the trainer owns the tokenizer. The worker sends chat messages; the trainer
answers with the prompt token ids it rendered, the completion token ids and their logprobs. The
worker never tokenizes, so the logprobs in a result are exactly those of the sampled tokens.
"""

from __future__ import annotations

import enum
import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    computed_field,
    model_validator,
)

PROTOCOL_VERSION = "mtrl.rollout/v1"

Id = Annotated[str, Field(min_length=1, max_length=256)]
Count = Annotated[int, Field(ge=0)]
TokenIds = list[Annotated[int, Field(ge=0)]]


class ProtocolError(ValueError):
    """A message that is not JSON, not of this protocol version, or not a valid message."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Envelope(_Strict):
    protocol_version: Literal["mtrl.rollout/v1"] = PROTOCOL_VERSION
    run_id: Id = Field(description="UID of the MultiTurnRLRun.")
    step: Count = Field(description="Training step that requested the rollout.")
    group_id: Id = Field(description="GRPO group: samples of one prompt compared to each other.")
    sample_id: Id = Field(description="Unique per rollout; the idempotency key end to end.")
    policy_version: Count = Field(description="Policy (weights) version in force.")


class RewardSpec(_Strict):
    range: tuple[float, float] = Field(
        default=(0.0, 1.0), description="[min, max] the aggregate reward is mapped into."
    )

    @model_validator(mode="after")
    def _ordered(self) -> RewardSpec:
        if not self.range[0] < self.range[1]:
            raise ValueError(f"rewards.range must be [min, max] with min < max, got {self.range}")
        return self


class RolloutRequest(_Envelope):
    """Trainer -> rollout queue: play one episode of the task row `data`."""

    kind: Literal["rollout_request"] = "rollout_request"
    data: dict[str, Any] = Field(description="The task row, passed to the environment as is.")
    max_length: int = Field(gt=0, description="Token budget of the whole episode.")
    max_turns: int | None = Field(default=None, gt=0, description="Overrides MTRL_MAX_TURNS.")
    episode_timeout_s: float | None = Field(
        default=None, gt=0, description="Overrides MTRL_EPISODE_TIMEOUT_S."
    )
    rewards: RewardSpec = Field(default_factory=RewardSpec)
    environment: str | None = Field(
        default=None, description="If set, must name the worker's environment (catches misrouting)."
    )
    result_queue_url: str | None = Field(
        default=None, description="Where the result goes; defaults to MTRL_RESULT_QUEUE_URL."
    )


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None


class SamplingParams(_Strict):
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: list[str] | None = None


class GenerateRequest(_Envelope):
    """Worker -> generate queue: sample the next assistant message for one episode turn."""

    kind: Literal["generate_request"] = "generate_request"
    request_id: Id = Field(description="Unique per call; the response echoes it.")
    turn: Count = Field(
        validation_alias=AliasChoices("turn", "step_id"),
        description="Model turn within the episode (BYOO calls it step_id).",
    )
    messages: list[ChatMessage] = Field(min_length=1)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    max_length: int | None = Field(
        default=None, gt=0, description="Tokens left in the episode budget (prompt + completion)."
    )
    reply_queue_url: str = Field(description="The requesting worker's own reply queue.")
    deadline: float | None = Field(
        default=None, description="Unix time after which nobody waits; the trainer may drop it."
    )


class TokenLogprob(_Strict):
    token: str = ""
    logprob: float = Field(le=0)


class ChoiceLogprobs(_Strict):
    content: list[TokenLogprob]


class Choice(_Strict):
    index: int = 0
    message: ChatMessage
    finish_reason: Literal["stop", "length"]
    logprobs: ChoiceLogprobs
    token_ids: TokenIds = Field(description="Completion token ids, aligned with logprobs.content.")

    @model_validator(mode="after")
    def _aligned(self) -> Choice:
        if len(self.token_ids) != len(self.logprobs.content):
            raise ValueError(
                f"token_ids ({len(self.token_ids)}) and logprobs.content "
                f"({len(self.logprobs.content)}) must have the same length"
            )
        return self


class GenerateResponse(_Envelope):
    """Trainer -> the worker's reply queue: the sampled message with its tokens."""

    kind: Literal["generate_response"] = "generate_response"
    request_id: Id
    turn: Count = Field(validation_alias=AliasChoices("turn", "step_id"))
    prompt_token_ids: TokenIds = Field(default_factory=list)
    choices: list[Choice] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Set when the trainer could not sample.")

    @classmethod
    def replying_to(cls, request: GenerateRequest, **fields: Any) -> GenerateResponse:
        """The response to `request`: its run, step, group, sample, request and turn ids (and
        its policy version unless `fields` names the one that actually sampled)."""
        ids = {name: getattr(request, name) for name in (
            "run_id", "step", "group_id", "sample_id", "policy_version", "request_id", "turn")}
        return cls(**{**ids, **fields})

    @model_validator(mode="after")
    def _choices_or_error(self) -> GenerateResponse:
        if bool(self.choices) == bool(self.error):
            raise ValueError("a generate response carries either choices or an error, not both")
        return self


class StopReason(enum.StrEnum):
    DONE = "done"  # the environment reached a terminal state
    MAX_TURNS = "max_turns"
    MAX_LENGTH = "max_length"
    POLICY_STOPPED = "policy_stopped"  # the policy side ended it (dry-run script ran out)
    TIMEOUT = "timeout"
    ERROR = "error"


class MetricEntry(_Strict):
    name: Id
    value: float
    type: Literal["Reward", "Metric"]


class TurnRecord(_Strict):
    """One model turn exactly as the trainer sampled it. Prompt tokens (system, user and
    environment text) are never trained on; completion tokens are."""

    turn: Count
    policy_version: Count
    prompt_token_ids: TokenIds
    completion_token_ids: TokenIds
    completion_logprobs: list[Annotated[float, Field(le=0)]]
    finish_reason: Literal["stop", "length"]
    reward: float | None = Field(
        default=None, description="The environment's reward for this turn, when it gives one "
        "per turn (grpo.advantageLevel: turn trains on them); the episode's reward stays "
        "aggregate_reward_score.")

    @model_validator(mode="after")
    def _aligned(self) -> TurnRecord:
        if len(self.completion_token_ids) != len(self.completion_logprobs):
            raise ValueError("completion_token_ids and completion_logprobs must align")
        return self


class RolloutResult(_Envelope):
    """Worker -> result queue: the scored episode. Always sent, also for failed episodes."""

    kind: Literal["rollout_result"] = "rollout_result"
    aggregate_reward_score: float
    metrics_list: list[MetricEntry]
    stop_reason: StopReason
    trajectory: list[TurnRecord] = Field(default_factory=list)
    worker_id: str = ""
    error: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _accept_byoo_id(cls, data: Any) -> Any:
        # BYOO names the sample `id`; accept it, but never let it disagree with sample_id.
        if isinstance(data, dict) and "id" in data:
            data = dict(data)
            sample = data.pop("id")
            if data.setdefault("sample_id", sample) != sample:
                raise ValueError(f"id {sample!r} != sample_id {data['sample_id']!r}")
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def id(self) -> str:
        return self.sample_id

    def metric(self, name: str) -> float | None:
        return next((m.value for m in self.metrics_list if m.name == name), None)


class PayloadPointer(_Strict):
    """Sent in place of a message too large for SQS; the body lives in S3."""

    protocol_version: Literal["mtrl.rollout/v1"] = PROTOCOL_VERSION
    kind: Literal["payload_pointer"] = "payload_pointer"
    # What S3's client would refuse before asking is malformed here, not a failed read.
    bucket: Annotated[str, Field(pattern=r"^[a-zA-Z0-9.\-_]{1,255}$")]  # botocore's check
    key: Annotated[str, Field(min_length=1, max_length=1024)]  # S3's longest key
    size_bytes: Count
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


Message = RolloutRequest | GenerateRequest | GenerateResponse | RolloutResult | PayloadPointer
M = TypeVar("M", bound=BaseModel)
_MESSAGE = TypeAdapter(Annotated[Message, Field(discriminator="kind")])


def encode(message: Message) -> str:
    return message.model_dump_json(exclude_none=True)


def parse_message(raw: str | bytes) -> Message:
    """Parse any protocol message; raise ProtocolError saying what is wrong."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"expected a JSON object, got {type(obj).__name__}")
    version = obj.get("protocol_version")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol_version {version!r}, expected {PROTOCOL_VERSION}")
    try:
        return _MESSAGE.validate_python(obj)
    except ValidationError as exc:
        raise ProtocolError(_summarise(exc)) from None


def parse_as(raw: str | bytes, model: type[M]) -> M:
    return expect(parse_message(raw), model)


def expect(message: Message, model: type[M]) -> M:
    """`message` if it is a `model`; a ProtocolError naming both otherwise."""
    if not isinstance(message, model):
        raise ProtocolError(f"expected {model.__name__}, got {type(message).__name__}")
    return message


def _summarise(exc: ValidationError, limit: int = 3) -> str:
    errors = exc.errors()
    parts = [f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in errors[:limit]]
    more = f" (+{len(errors) - limit} more)" if len(errors) > limit else ""
    return "; ".join(parts) + more
