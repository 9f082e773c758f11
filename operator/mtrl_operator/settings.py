"""Operator configuration: environment variables, each overridable by a command-line flag.

Every setting is one field below: its variable is `MTRL_` + the field name in capitals
(`AWS_REGION`, else `AWS_DEFAULT_REGION`, for the region), its flag `--` + the field name with
dashes, and its description is what `mtrl operator --help` prints.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import os
import socket
import uuid
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import AliasChoices, BeforeValidator, Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from mtrl_api.settings import InvalidSettings, MtrlSettings
from mtrl_operator.reconcile.sweep import Owner

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _csv(value: Any) -> Any:
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value


def _bool(value: Any) -> Any:
    """Only true/false, 1/0, yes/no: pydantic would also take on/off and y/n."""
    if not isinstance(value, str):
        return value
    lowered = value.strip().lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"expected true or false, not {value!r}")
    return lowered in ("true", "1", "yes")


CommaSeparated = Annotated[list[str], NoDecode, BeforeValidator(_csv)]
Boolean = Annotated[bool, BeforeValidator(_bool)]


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
            raise ValueError(f"{item!r} is not <instance type>=<USD per node-hour>")
        out[kind.strip()] = price
    return out


class Settings(MtrlSettings):
    model_config = SettingsConfigDict(populate_by_name=True)  # Settings(region=...) too
    unadvertised: ClassVar[frozenset[str]] = frozenset({"crash_after_step"})  # not in --help

    operator_id: str = Field(default="default", description=(
        "written into every AWS tag; the sweeper only touches resources tagged with its own id"))
    cluster_id: str = Field(default="", description=(
        "this Kubernetes cluster's identity, written into every AWS tag beside the operator id; "
        "the sweeper only touches resources tagged with both, so two clusters in one AWS "
        "account never sweep each other's (default: the UID of the kube-system namespace, "
        "read at start)"))
    namespaces: CommaSeparated = Field(default_factory=list, description=(
        "comma-separated namespaces to watch, globs allowed (team-*); empty: the whole cluster"))
    region: str = Field(default="us-west-2", description="region of queues and ECS tasks",
                        validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"))
    ecs_cluster: str = Field(default="default", description="ECS cluster of runs that name none")
    ecs_subnets: CommaSeparated = Field(default_factory=list, description=(
        "comma-separated default subnets of Fargate tasks"))
    ecs_security_groups: CommaSeparated = Field(default_factory=list, description=(
        "comma-separated default security groups of Fargate tasks"))
    ecs_execution_role_arn: str = Field(default="", description="default ECS task execution role")
    preflight_nodes: Boolean = Field(default=True, description=(
        "before a run starts, check that nodes of its instance type exist with the GPUs and "
        "EFA devices it asks for; false on clusters that add nodes on demand (Karpenter)"))
    instance_prices: str = Field(default="", description=(
        "comma-separated <instance type>=<USD per node-hour> (chart value pricing), for "
        "status.cost and spec.lifecycle.maxCostUSD"))
    sweep_interval_seconds: float = Field(default=300.0, description=(
        "orphan sweeper period; 0 turns it off"))
    sweep_min_age_seconds: float = Field(default=600.0, ge=0, description=(
        "the sweeper deletes an orphan only once it has seen it for this long (AWS's tagging "
        "API tells no creation time), so nothing younger is ever swept"))
    resync_seconds: float = Field(default=30.0, description=(
        "how often a live run is looked at without any event (ECS has no watch)"))
    cost_refresh_seconds: float = Field(default=60.0, description=(
        "how often status.cost is brought up to date while the trainer runs and nothing else "
        "in the status changes"))
    retry_backoff_seconds: float = Field(default=10.0, description=(
        "the wait before a failed trainer's next attempt, doubled for each failed attempt up "
        "to 10 minutes, as the Job controller waits between pod retries"))
    workers: int = Field(default=8, description="runs reconciled at once")
    metrics_port: int = Field(default=8080, description="Prometheus /metrics port; 0 turns it off")
    health_port: int = Field(default=8081, description=(
        "/healthz port (liveness and readiness); 0 turns it off"))
    log_format: str = Field(default="json", description="json or plain")
    leader_elect: Boolean = Field(default=True, description=(
        "active/standby: act only while holding the Lease; false for a single replica that "
        "never competes"))
    lease_name: str = Field(default="", description=(
        "the Lease's name; default mtrl-operator-<operator id>, so operators with different "
        "ids do not compete"))
    lease_namespace: str = Field(default="", description=(
        "the Lease's namespace; default the pod's own namespace, else 'default'"))
    lease_duration_seconds: float = Field(default=15.0, description=(
        "how long a standby waits after the leader's last renewal before taking over"))
    renew_deadline_seconds: float = Field(default=10.0, description=(
        "a leader that could not renew for this long stops acting (below the duration)"))
    retry_period_seconds: float = Field(default=2.0, description=(
        "how often the leader renews and a standby tries to take over"))
    pod_name: str = Field(default="", description=(
        "this replica's name in the Lease (default the host name); a random suffix keeps it "
        "unique"))
    crash_after_step: str = Field(default="", description=(
        "test failpoint: exit abruptly after the k-th mutating call, or after the first whose "
        "description contains the text"))

    @field_validator("instance_prices")
    @classmethod
    def _prices_parse(cls, value: str) -> str:
        _prices(value)  # a malformed price list stops the operator at start, not mid-run
        return value

    @property
    def list_scopes(self) -> list[str]:
        """Namespaces to list and watch in: the listed ones, or "*" (all) when none are listed
        or any is a glob (a pattern cannot be listed; kopf filters runs by it)."""
        if not self.namespaces or any(c in ns for ns in self.namespaces for c in "*?["):
            return ["*"]
        return list(self.namespaces)

    @property
    def kopf_scope(self) -> tuple[bool, list[str]]:
        """(clusterwide, namespaces) for kopf. A glob is matched by the operator (`watches`),
        with kopf watching the whole cluster: kopf 1.45 follows a pattern through its namespace
        observer, whose watch drops the namespaces it lists when it (re)starts
        (kopf/_core/reactor/observation.py, `process_discovered_namespace_event` returns on
        the listing's events), so a namespace created while the operator starts was never
        watched, and its runs never reconciled, until the next restart."""
        if self.list_scopes == ["*"]:
            return True, []
        return False, list(self.namespaces)

    @property
    def owner(self) -> Owner:
        """Who this operator's AWS resources belong to: what the sweeper matches."""
        return Owner(self.operator_id, self.cluster_id)

    def watches(self, namespace: str) -> bool:
        """Whether runs and triggers in `namespace` are this operator's."""
        return not self.namespaces or any(fnmatch.fnmatchcase(namespace, pattern)
                                          for pattern in self.namespaces)

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

    def price(self, instance_type: str) -> float | None:
        """USD per node-hour of `instance_type`, if the operator was given one."""
        return self.prices.get(instance_type)

    @property
    def prices(self) -> dict[str, float]:
        return _prices(self.instance_prices)

    @classmethod
    def parse(cls, argv: list[str] | None) -> Settings:
        """Environment first, then flags (`--ecs-subnets a,b`) on top: a flag stands for the
        variable named after it, so both are read and checked alike. A bad value of either
        stops the operator with a usage error naming the variable."""
        parser = argparse.ArgumentParser(
            prog="mtrl operator", description="Run the operator. Each flag overrides the "
            "environment variable named after it.")
        try:
            base = cls.from_env()
            for name, field in cls.model_fields.items():
                parser.add_argument(
                    f"--{name.replace('_', '-')}", dest=name, default=None,
                    metavar=cls.variable(name),
                    help=argparse.SUPPRESS if name in cls.unadvertised else
                    f"{field.description} (default: {getattr(base, name)!r})")
            flags = {cls.variable(name): raw for name, raw in vars(parser.parse_args(argv or [])).items()
                     if raw is not None}
            return cls.from_env({**os.environ, **flags})
        except InvalidSettings as exc:
            parser.error(str(exc))
