"""Environment variables the data plane reads (docs/environments.md and docs/trainer.md list
them all)."""

from __future__ import annotations

import json
from urllib.parse import urlparse

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_operator.naming import RunNames
from mtrl_rollout.settings import run_payload_prefix

CONFIG_DIR = "/etc/mtrl"
CONFIG_FILE = "run.json"
HEALTH_PORT = 8080


def payload_bucket(spec: MultiTurnRLRunSpec) -> str:
    """Where the run's workers and trainer offload large messages: its output bucket."""
    return urlparse(spec.output.s3_uri).netloc


def data_plane_env(names: RunNames, spec: MultiTurnRLRunSpec, queue_urls: dict[str, str],
                   region: str) -> dict[str, str]:
    """Shared by workers and trainer: who the run is and where its queues are."""
    return {
        "MTRL_RUN_ID": names.uid,
        "MTRL_RUN_NAME": names.name,
        "MTRL_NAMESPACE": names.namespace,
        "MTRL_ROLLOUT_QUEUE_URL": queue_urls["rollout"],
        "MTRL_RESULT_QUEUE_URL": queue_urls["result"],
        "MTRL_GENERATE_QUEUE_URL": queue_urls["generate"],
        "MTRL_DLQ_URL": queue_urls["dlq"],
        "MTRL_PAYLOAD_BUCKET": payload_bucket(spec),
        "MTRL_QUEUE_PREFIX": names.aws_prefix,
        "MTRL_OPERATOR_ID": names.operator_id,
        "MTRL_CLUSTER_ID": names.cluster_id,
        "MTRL_PAYLOAD_PREFIX": run_payload_prefix(names.aws_prefix),
        "AWS_REGION": region,
    }


def worker_env(names: RunNames, spec: MultiTurnRLRunSpec, queue_urls: dict[str, str],
               region: str) -> dict[str, str]:
    weights = {c.name: c.weight for c in spec.reward.components}
    return {
        **{e.name: e.value for e in spec.workers.env},  # first: the operator's names win
        **data_plane_env(names, spec, queue_urls, region),
        "MTRL_ENVIRONMENT": spec.rollout.environment,
        "MTRL_ENVIRONMENT_ARGS": json.dumps(spec.rollout.environment_args, sort_keys=True),
        "MTRL_REWARD_WEIGHTS": json.dumps(weights, sort_keys=True),
        "MTRL_CONCURRENCY": str(spec.rollout.concurrency_per_worker),
        "MTRL_EPISODE_TIMEOUT_S": str(spec.rollout.episode_timeout_seconds),
        "MTRL_MAX_TURNS": str(spec.rollout.max_turns),
        "MTRL_HEALTH_PORT": str(HEALTH_PORT),
    }


def trainer_env(names: RunNames, spec: MultiTurnRLRunSpec, queue_urls: dict[str, str],
                region: str, attempt: int, launch: int = 0) -> dict[str, str]:
    """MTRL_LAUNCH names the workload: the trainer echoes it in every progress report, so the
    operator takes a report as this workload's only when it carries the number."""
    return {
        **{e.name: e.value for e in spec.trainer.env},  # first: the operator's names win
        **data_plane_env(names, spec, queue_urls, region),
        "MTRL_CONFIG": f"{CONFIG_DIR}/{CONFIG_FILE}",
        "MTRL_PROGRESS_CONFIGMAP": names.progress_config_map,
        "MTRL_ATTEMPT": str(attempt),
        "MTRL_LAUNCH": str(launch),
    }


def as_k8s(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in env.items()]
