"""Trainer configuration: the run spec the operator mounts plus MTRL_* environment variables.

The spec (MultiTurnRLRun `.spec`, camelCase JSON) lives at $MTRL_CONFIG. Queue URLs and ids
use the same variable names as the rollout workers (mtrl_worker.config), so one ConfigMap or
env block can serve both.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from mtrl_api.run import MultiTurnRLRunSpec

DEFAULT_CONFIG_PATH = "/etc/mtrl/run.json"
DEFAULT_COLLECT_GRACE_S = 30.0


class ConfigError(ValueError):
    pass


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

    @property
    def output_uri(self) -> str:
        """This run's own folder under spec.output.s3Uri (the operator reports the same one as
        status.outputUri)."""
        return self.spec.output.run_uri(self.namespace or "default", self.run_name, self.run_id)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TrainerConfig:
        env = os.environ if environ is None else environ
        path = Path(env.get("MTRL_CONFIG") or DEFAULT_CONFIG_PATH)
        problems: list[str] = []
        spec: MultiTurnRLRunSpec | None = None
        try:
            spec = MultiTurnRLRunSpec.model_validate_json(path.read_text())
        except OSError as exc:
            problems.append(f"MTRL_CONFIG: cannot read {path}: {exc.strerror or exc}")
        except ValidationError as exc:
            problems += [f"{path}: {'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        urls = {}
        for name in ("ROLLOUT_QUEUE_URL", "RESULT_QUEUE_URL", "GENERATE_QUEUE_URL", "DLQ_URL"):
            urls[name] = env.get(f"MTRL_{name}", "")
            if not urls[name]:
                problems.append(f"MTRL_{name} is not set")
        try:
            grace = float(env.get("MTRL_COLLECT_GRACE_S") or DEFAULT_COLLECT_GRACE_S)
        except ValueError:
            problems.append("MTRL_COLLECT_GRACE_S: not a number")
            grace = DEFAULT_COLLECT_GRACE_S
        operator_attempt = env.get("MTRL_ATTEMPT") or None
        if operator_attempt is not None and not operator_attempt.isdigit():
            problems.append("MTRL_ATTEMPT: not a whole number")
        if problems or spec is None:
            raise ConfigError("invalid trainer configuration: " + "; ".join(problems))
        progress = env.get("MTRL_PROGRESS_FILE")
        return cls(
            spec=spec,
            run_id=env.get("MTRL_RUN_ID") or "local",
            run_name=env.get("MTRL_RUN_NAME") or "local",
            rollout_queue_url=urls["ROLLOUT_QUEUE_URL"],
            result_queue_url=urls["RESULT_QUEUE_URL"],
            generate_queue_url=urls["GENERATE_QUEUE_URL"],
            dlq_url=urls["DLQ_URL"],
            payload_bucket=env.get("MTRL_PAYLOAD_BUCKET") or None,
            progress_file=Path(progress) if progress else None,
            progress_config_map=env.get("MTRL_PROGRESS_CONFIGMAP") or None,
            namespace=env.get("MTRL_POD_NAMESPACE") or env.get("MTRL_NAMESPACE") or None,
            device=env.get("MTRL_DEVICE") or None,
            collect_grace_s=grace,
            attempt=uuid.uuid4().hex[:8],
            operator_attempt=int(operator_attempt) if operator_attempt else None,
        )
