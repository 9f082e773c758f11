"""Operator configuration: environment variables, each overridable by a command-line flag.

| variable | default | meaning |
|---|---|---|
| MTRL_OPERATOR_ID | default | written into every AWS tag; the sweeper only touches its own |
| MTRL_NAMESPACES | (all) | comma-separated namespaces to watch, globs allowed (`team-*`) |
| AWS_REGION | us-west-2 | region of queues and ECS tasks |
| MTRL_ECS_CLUSTER | default | ECS cluster when a run names none |
| MTRL_ECS_SUBNETS | | comma-separated default subnets for Fargate tasks |
| MTRL_ECS_SECURITY_GROUPS | | comma-separated default security groups |
| MTRL_ECS_EXECUTION_ROLE_ARN | | default task execution role |
| MTRL_SWEEP_INTERVAL_SECONDS | 300 | orphan sweeper period; 0 turns it off |
| MTRL_RESYNC_SECONDS | 30 | how often a live run is looked at without any event (ECS has no watch) |
| MTRL_WORKERS | 8 | runs reconciled at once |
| MTRL_METRICS_PORT | 8080 | Prometheus /metrics; 0 turns it off |
| MTRL_HEALTH_PORT | 8081 | liveness probe /healthz; 0 turns it off |
| MTRL_PEERING | | kopf peering name for active/standby replicas; empty runs standalone |
| MTRL_LOG_FORMAT | json | json or plain |
| MTRL_CRASH_AFTER_STEP | | test hook: exit abruptly after this many cloud/API mutations |
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


@dataclass(frozen=True)
class Settings:
    operator_id: str = "default"
    namespaces: list[str] = field(default_factory=list)
    region: str = "us-west-2"
    ecs_cluster: str = "default"
    ecs_subnets: list[str] = field(default_factory=list)
    ecs_security_groups: list[str] = field(default_factory=list)
    ecs_execution_role_arn: str = ""
    sweep_interval_seconds: float = 300.0
    resync_seconds: float = 30.0
    workers: int = 8
    metrics_port: int = 8080
    health_port: int = 8081
    peering: str = ""
    log_format: str = "json"
    crash_after_step: int | None = None

    @property
    def list_scopes(self) -> list[str]:
        """Namespaces to list and watch in: the listed ones, or "*" (all) when none are listed
        or any is a glob (a pattern cannot be listed; kopf filters runs by it)."""
        if not self.namespaces or any(c in ns for ns in self.namespaces for c in "*?["):
            return ["*"]
        return list(self.namespaces)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if environ is None else environ)
        get = env.get
        crash = get("MTRL_CRASH_AFTER_STEP")
        return cls(
            operator_id=get("MTRL_OPERATOR_ID", "default"),
            namespaces=_csv(get("MTRL_NAMESPACES", "")),
            region=get("AWS_REGION") or get("AWS_DEFAULT_REGION") or "us-west-2",
            ecs_cluster=get("MTRL_ECS_CLUSTER", "default"),
            ecs_subnets=_csv(get("MTRL_ECS_SUBNETS", "")),
            ecs_security_groups=_csv(get("MTRL_ECS_SECURITY_GROUPS", "")),
            ecs_execution_role_arn=get("MTRL_ECS_EXECUTION_ROLE_ARN", ""),
            sweep_interval_seconds=float(get("MTRL_SWEEP_INTERVAL_SECONDS", "300")),
            resync_seconds=float(get("MTRL_RESYNC_SECONDS", "30")),
            workers=int(get("MTRL_WORKERS", "8")),
            metrics_port=int(get("MTRL_METRICS_PORT", "8080")),
            health_port=int(get("MTRL_HEALTH_PORT", "8081")),
            peering=get("MTRL_PEERING", ""),
            log_format=get("MTRL_LOG_FORMAT", "json"),
            crash_after_step=int(crash) if crash else None,
        )

    @classmethod
    def parse(cls, argv: list[str] | None) -> Settings:
        """Environment first, then flags (`--ecs-subnets a,b`) on top."""
        base = cls.from_env()
        parser = argparse.ArgumentParser(prog="mtrl operator", description="Run the operator.")
        for f in fields(cls):
            parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=None)
        args = parser.parse_args(argv or [])
        overrides = {}
        for f in fields(cls):
            raw = getattr(args, f.name)
            if raw is None:
                continue
            current = getattr(base, f.name)
            overrides[f.name] = (_csv(raw) if isinstance(current, list) else
                                 type(current)(raw) if current is not None else int(raw))
        return cls(**{**base.__dict__, **overrides})
