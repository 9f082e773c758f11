"""The variables the workers and the trainer share: one ConfigMap or env block serves both."""

from __future__ import annotations

from pydantic import Field

from mtrl_api.settings import MtrlSettings


class DataPlaneSettings(MtrlSettings):
    rollout_queue_url: str = Field(description="Queue of RolloutRequests, trainer to workers.")
    result_queue_url: str = Field(description="Default queue for RolloutResults.")
    generate_queue_url: str = Field(description="The trainer's GenerateRequest queue.")
    dlq_url: str = Field(description="Dead-letter queue for malformed messages.")
    payload_bucket: str | None = Field(default=None, description="S3 bucket for large payloads.")
