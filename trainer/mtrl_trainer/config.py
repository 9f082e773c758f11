"""Trainer configuration: the run spec the operator mounts plus MTRL_* environment variables.

The spec (MultiTurnRLRun `.spec`, camelCase JSON) lives at $MTRL_CONFIG. Queue URLs and ids
use the same variable names as the rollout workers (mtrl_rollout.settings), so one ConfigMap or
env block can serve both.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import NoDecode

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_api.settings import InvalidSettings
from mtrl_rollout.settings import PAYLOAD_ROOT, DataPlaneSettings

DEFAULT_CONFIG_PATH = "/etc/mtrl/run.json"
DEFAULT_COLLECT_GRACE_S = 30.0


class ConfigError(ValueError):
    pass


class TrainerSettings(DataPlaneSettings):
    """What TrainerConfig.from_env reads: each field from `MTRL_` + its name, or its alias."""

    # The variable names the file the spec is read from, where the operator mounts it
    spec: Annotated[MultiTurnRLRunSpec, NoDecode] = Field(
        default=DEFAULT_CONFIG_PATH, validate_default=True, validation_alias="MTRL_CONFIG",
        description="Path of the run spec (MultiTurnRLRun .spec, camelCase JSON).")
    run_id: str = Field(default="local", description="Run UID, stamped on every message.")
    run_name: str = Field(default="local", description="Run name (names the output folder).")
    namespace: str | None = Field(
        default=None, validation_alias=AliasChoices("MTRL_POD_NAMESPACE", "MTRL_NAMESPACE"),
        description="Namespace of the run and of its progress ConfigMap.")
    progress_file: Path | None = Field(default=None, description="Where each step's progress goes.")
    progress_config_map: str | None = Field(
        default=None, validation_alias="MTRL_PROGRESS_CONFIGMAP",
        description="The run's progress ConfigMap, written after each step.")
    device: str | None = Field(default=None, description="cpu, cuda:0; default: this rank's GPU, else CPU.")
    collect_grace_s: float = Field(
        default=DEFAULT_COLLECT_GRACE_S,
        description="Added to episodeTimeoutSeconds for the idle timeout of a step's collection.")
    operator_attempt: int | None = Field(
        default=None, ge=0, validation_alias="MTRL_ATTEMPT",
        description="The operator's attempt number, reported with the progress.")
    operator_launch: int | None = Field(
        default=None, ge=0, validation_alias="MTRL_LAUNCH",
        description="The operator's launch number (this workload's), echoed in every progress "
                    "report: the operator's evidence that this workload wrote it.")

    @field_validator("spec", mode="before")
    @classmethod
    def _read_spec(cls, path: Any) -> Any:
        if isinstance(path, MultiTurnRLRunSpec):
            return path
        try:
            return MultiTurnRLRunSpec.model_validate_json(Path(path).read_text())
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValidationError as exc:
            raise ValueError("; ".join(f"{path}: {'.'.join(map(str, e['loc']))}: {e['msg']}"
                                       for e in exc.errors())) from None


@dataclass(frozen=True)
class TrainerConfig:
    spec: MultiTurnRLRunSpec
    run_id: str
    run_name: str
    rollout_queue_url: str
    result_queue_url: str
    generate_queue_url: str
    dlq_url: str
    payload_bucket: str | None
    progress_file: Path | None
    progress_config_map: str | None
    namespace: str | None
    device: str | None
    collect_grace_s: float
    attempt: str  # unique per process start; keeps sample ids of attempts apart
    operator_attempt: int | None = None  # the operator's attempt number (MTRL_ATTEMPT)
    operator_launch: int | None = None  # the operator's launch number (MTRL_LAUNCH)
    payload_prefix: str = PAYLOAD_ROOT  # MTRL_PAYLOAD_PREFIX: the run's own, from the operator

    @property
    def output_uri(self) -> str:
        """This run's own folder under spec.output.s3Uri (the operator reports the same one as
        status.outputUri)."""
        return self.spec.output.run_uri(self.namespace or "default", self.run_name, self.run_id)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TrainerConfig:
        try:
            settings = TrainerSettings.from_env(environ)
        except InvalidSettings as exc:
            # The spec's problems first: the termination message keeps only its first 4 KiB
            spec = TrainerSettings.variable("spec")
            problems = sorted(exc.problems, key=lambda problem: not problem.startswith(spec))
            raise ConfigError("invalid trainer configuration: " + "; ".join(problems)) from None
        return cls(**dict(settings), attempt=uuid.uuid4().hex[:8])
