"""Worker configuration, read from MTRL_* environment variables (docs/environments.md).

Each field `x` is read from `MTRL_X` (mtrl_api.settings); JSON-valued ones (`environment_args`,
`reward_weights`) are parsed. All problems are reported at once, so a misconfigured pod says
everything in one crash-loop message.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from mtrl_api.settings import InvalidSettings
from mtrl_rollout.offload import DEFAULT_THRESHOLD_BYTES
from mtrl_rollout.settings import DataPlaneSettings


class ConfigError(ValueError):
    pass


class WorkerConfig(DataPlaneSettings):
    run_id: str = Field(min_length=1, description="UID of the MultiTurnRLRun (tags, messages).")
    run_name: str = Field(default="", description="Name of the run (tags).")
    namespace: str = Field(default="", description="Namespace of the run (tags).")
    operator_id: str = Field(default="default", description="Operator that owns the run (tags).")
    cluster_id: str = Field(default="", description=(
        "Cluster of the operator that owns the run (tags; none: no sweeper takes the reply "
        "queue)."))
    offload_threshold_bytes: int = Field(
        default=DEFAULT_THRESHOLD_BYTES,
        gt=0,
        le=256 * 1024,
        description="Bodies above this many bytes go to S3 behind a pointer.",
    )
    environment: str = Field(description="Environment name (entry point in mtrl.environments).")
    environment_args: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict, description="JSON object of keyword arguments for the environment."
    )
    reward_weights: Annotated[dict[str, float], NoDecode] = Field(
        default_factory=dict, description="JSON object: reward component -> weight override."
    )
    concurrency: int = Field(default=64, gt=0, description="Episodes run at once.")
    episode_timeout_s: float = Field(default=600, gt=0, description="Per-episode time limit.")
    max_turns: int = Field(default=16, gt=0, description="Model turns per episode.")
    generate_timeout_s: float = Field(default=300, gt=0, description="Longest wait for one generation.")
    health_port: int = Field(default=8080, ge=0, le=65535, description="/healthz, /readyz; 0 off.")
    health_host: str = Field(
        default="0.0.0.0", description="Address the health server binds (the pod IP suffices)."
    )
    proxy_port: int = Field(
        default=0, ge=0, le=65535, description="OpenAI-compatible proxy on 127.0.0.1; 0: any."
    )
    queue_prefix: str = Field(default="", description="Prefix of this worker's reply queue.")
    worker_id: str = Field(
        default_factory=socket.gethostname, min_length=1, description="Defaults to the hostname."
    )
    lease_s: int | None = Field(
        default=None,
        gt=0,
        le=43200,
        description="Visibility lease renewed while an episode runs; default: the queue's.",
    )
    poll_wait_s: int = Field(default=5, ge=0, le=20, description="Long-poll wait per receive.")
    drain_timeout_s: float = Field(
        default=20, ge=0, description="On SIGTERM, time to finish in-flight episodes."
    )
    sqs_pool_size: int = Field(default=32, gt=0, description="Connections and threads for SQS.")

    @field_validator("environment_args", "reward_weights", mode="before")
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc})") from None

    @property
    def reply_queue_prefix(self) -> str:
        return self.queue_prefix or f"mtrl-{self.run_id[:8]}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerConfig:
        try:
            return super().from_env(environ)
        except InvalidSettings as exc:
            raise ConfigError(f"invalid worker configuration: {exc}") from None
