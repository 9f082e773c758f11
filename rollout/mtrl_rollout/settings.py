"""The variables the workers and the trainer share: one ConfigMap or env block serves both."""

from __future__ import annotations

from pydantic import Field

from mtrl_api.settings import MtrlSettings

PAYLOAD_ROOT = "mtrl-payloads"  # offloaded payloads' keys start here (mtrl_rollout.offload)


def run_payload_prefix(queue_prefix: str) -> str:
    """Where one run's offloaded payloads go: under its queue prefix (`mtrl-<namespace>-<name>-
    <hash>`), so its teardown finds them and IAM can scope them per run."""
    return f"{PAYLOAD_ROOT}/{queue_prefix}"


class DataPlaneSettings(MtrlSettings):
    rollout_queue_url: str = Field(description="Queue of RolloutRequests, trainer to workers.")
    result_queue_url: str = Field(description="Default queue for RolloutResults.")
    generate_queue_url: str = Field(description="The trainer's GenerateRequest queue.")
    dlq_url: str = Field(description="Dead-letter queue for malformed messages.")
    payload_bucket: str | None = Field(default=None, description="S3 bucket for large payloads.")
    payload_prefix: str = Field(default=PAYLOAD_ROOT, description=(
        "Key prefix of large payloads; the operator sets the run's own (deleted with the run)."))
