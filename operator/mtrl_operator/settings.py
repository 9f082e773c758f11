"""Operator configuration: environment variables, each overridable by a command-line flag.

Every setting is one field below: its variable is `MTRL_` + the field name in capitals
(`AWS_REGION` for the region), its flag `--` + the field name with dashes, and its help text
is what `mtrl operator --help` prints.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"expected true or false, not {value!r}")
    return lowered in ("true", "1", "yes")


@functools.cache
def _prices(raw: str) -> dict[str, float]:
    """`<instance type>=<USD per node-hour>,...` as a table."""
    out = {}
    for item in _csv(raw):
        kind, sep, usd = item.partition("=")
        try:
            price = float(usd)
        except ValueError:
            price = -1.0
        if not sep or not kind.strip() or price < 0:
            raise ValueError(f"MTRL_INSTANCE_PRICES: {item!r} is not <instance type>=<USD per "
                             "node-hour>")
        out[kind.strip()] = price
    return out


def _doc(help: str, env: str | None = None, hidden: bool = False) -> dict[str, Any]:
    return {"help": help, "env": env, "hidden": hidden}


@dataclass(frozen=True)
class Settings:
    operator_id: str = field(default="default", metadata=_doc(
        "written into every AWS tag; the sweeper only touches resources tagged with its own id"))
    namespaces: list[str] = field(default_factory=list, metadata=_doc(
        "comma-separated namespaces to watch, globs allowed (team-*); empty: the whole cluster"))
    region: str = field(default="us-west-2", metadata=_doc(
        "region of queues and ECS tasks", env="AWS_REGION"))
    ecs_cluster: str = field(default="default", metadata=_doc(
        "ECS cluster of runs that name none"))
    ecs_subnets: list[str] = field(default_factory=list, metadata=_doc(
        "comma-separated default subnets of Fargate tasks"))
    ecs_security_groups: list[str] = field(default_factory=list, metadata=_doc(
        "comma-separated default security groups of Fargate tasks"))
    ecs_execution_role_arn: str = field(default="", metadata=_doc(
        "default ECS task execution role"))
    preflight_nodes: bool = field(default=True, metadata=_doc(
        "before a run starts, check that nodes of its instance type exist with the GPUs and "
        "EFA devices it asks for; false on clusters that add nodes on demand (Karpenter)"))
    instance_prices: str = field(default="", metadata=_doc(
        "comma-separated <instance type>=<USD per node-hour> (chart value pricing), for "
        "status.cost and spec.lifecycle.maxCostUSD"))
    sweep_interval_seconds: float = field(default=300.0, metadata=_doc(
        "orphan sweeper period; 0 turns it off"))
    resync_seconds: float = field(default=30.0, metadata=_doc(
        "how often a live run is looked at without any event (ECS has no watch)"))
    cost_refresh_seconds: float = field(default=60.0, metadata=_doc(
        "how often status.cost is brought up to date while the trainer runs and nothing else "
        "in the status changes"))
    workers: int = field(default=8, metadata=_doc("runs reconciled at once"))
    metrics_port: int = field(default=8080, metadata=_doc(
        "Prometheus /metrics port; 0 turns it off"))
    health_port: int = field(default=8081, metadata=_doc(
        "/healthz port (liveness and readiness); 0 turns it off"))
    log_format: str = field(default="json", metadata=_doc("json or plain"))
    leader_elect: bool = field(default=True, metadata=_doc(
        "active/standby: act only while holding the Lease; false for a single replica that "
        "never competes"))
    lease_name: str = field(default="", metadata=_doc(
        "the Lease's name; default mtrl-operator-<operator id>, so operators with different "
        "ids do not compete"))
    lease_namespace: str = field(default="", metadata=_doc(
        "the Lease's namespace; default the pod's own namespace, else 'default'"))
    lease_duration_seconds: float = field(default=15.0, metadata=_doc(
        "how long a standby waits after the leader's last renewal before taking over"))
    renew_deadline_seconds: float = field(default=10.0, metadata=_doc(
        "a leader that could not renew for this long stops acting (below the duration)"))
    retry_period_seconds: float = field(default=2.0, metadata=_doc(
        "how often the leader renews and a standby tries to take over"))
    pod_name: str = field(default="", metadata=_doc(
        "this replica's name in the Lease (default the host name); a random suffix keeps it "
        "unique"))
    crash_after_step: str = field(default="", metadata=_doc(
        "test failpoint: exit abruptly after the k-th mutating call, or after the first whose "
        "description contains the text", hidden=True))

    @property
    def list_scopes(self) -> list[str]:
        """Namespaces to list and watch in: the listed ones, or "*" (all) when none are listed
        or any is a glob (a pattern cannot be listed; kopf filters runs by it)."""
        if not self.namespaces or any(c in ns for ns in self.namespaces for c in "*?["):
            return ["*"]
        return list(self.namespaces)

    @property
    def lease(self) -> tuple[str, str]:
        """(namespace, name) of the leader-election Lease."""
        namespace = self.lease_namespace or (
            SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
            if SERVICE_ACCOUNT_NAMESPACE.exists() else "default")
        return namespace, self.lease_name or f"mtrl-operator-{self.operator_id}"

    def new_identity(self) -> str:
        """A Lease holder name unique per process, as client-go's `<hostname>_<uuid>`: two
        processes on one host (or a restarted pod of the same name) must never both believe
        they hold the Lease."""
        return f"{self.pod_name or socket.gethostname()}_{uuid.uuid4().hex[:8]}"

    def __post_init__(self) -> None:
        _ = self.prices  # a malformed price list stops the operator at start, not mid-run

    def price(self, instance_type: str) -> float | None:
        """USD per node-hour of `instance_type`, if the operator was given one."""
        return self.prices.get(instance_type)

    @property
    def prices(self) -> dict[str, float]:
        return _prices(self.instance_prices)

    @staticmethod
    def variable(name: str) -> str:
        env = Settings.__dataclass_fields__[name].metadata["env"]
        return env or f"MTRL_{name.upper()}"

    @classmethod
    def _convert(cls, name: str, raw: str) -> Any:
        kind = type(getattr(cls(), name))
        if kind is list:
            return _csv(raw)
        if kind is bool:
            return _bool(raw)
        return kind(raw)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(cls.variable(f.name))
            if f.name == "region" and not raw:
                raw = env.get("AWS_DEFAULT_REGION")
            if raw is not None and raw != "":
                values[f.name] = cls._convert(f.name, raw)
        return cls(**values)

    @classmethod
    def parse(cls, argv: list[str] | None) -> Settings:
        """Environment first, then flags (`--ecs-subnets a,b`) on top."""
        base = cls.from_env()
        parser = argparse.ArgumentParser(
            prog="mtrl operator", description="Run the operator. Each flag overrides the "
            "environment variable named after it.")
        for f in fields(cls):
            meta = f.metadata
            parser.add_argument(
                f"--{f.name.replace('_', '-')}", dest=f.name, default=None,
                metavar=cls.variable(f.name),
                help=argparse.SUPPRESS if meta["hidden"] else
                f"{meta['help']} (default: {getattr(base, f.name)!r})")
        args = parser.parse_args(argv or [])
        overrides = {f.name: cls._convert(f.name, raw) for f in fields(cls)
                     if (raw := getattr(args, f.name)) is not None}
        return cls(**{**base.__dict__, **overrides})
