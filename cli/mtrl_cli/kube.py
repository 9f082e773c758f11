"""The Kubernetes API as the commands use it: the kubeconfig kubectl would use, runs, their pods
and the pods' logs (the pods/log API, as `kubectl logs`). Objects come out as plain dicts;
every failure comes out as a CliError naming the API server and what was asked of it."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError, ConfigError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.types import OnErrorAction, OnErrorResult

from mtrl_api import GROUP, VERSION
from mtrl_cli.errors import CliError

MultiTurnRLRun = create_namespaced_resource(GROUP, VERSION, "MultiTurnRLRun", "multiturnrlruns")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
# The container `kubectl logs` picks in a pod of several (kubectl's own annotation).
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"


def add_arguments(parser: argparse.ArgumentParser, *, all_namespaces: bool = False) -> None:
    """kubectl's flags for where to look."""
    parser.add_argument("-n", "--namespace", help="the run's namespace (default: the "
                        "kubeconfig context's, else 'default')")
    if all_namespaces:
        parser.add_argument("-A", "--all-namespaces", action="store_true",
                            help="runs in every namespace")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: the first "
                        "file in $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: its current context)")


def _kubeconfig_file(flag: Path | None) -> Path | None:
    """kubectl's order: the flag, $KUBECONFIG (its first existing file; kubectl merges them
    all), ~/.kube/config. None when there is none (in a pod: its ServiceAccount)."""
    if flag is not None:
        if not flag.expanduser().is_file():
            raise CliError(f"kubeconfig {flag} does not exist")
        return flag.expanduser()
    listed = [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    for path in [*listed, DEFAULT_KUBECONFIG]:
        if path.expanduser().is_file():
            return path.expanduser()
    if IN_CLUSTER_TOKEN.is_file():
        return None
    where = f"$KUBECONFIG ({os.environ['KUBECONFIG']})" if listed else "$KUBECONFIG is unset and"
    raise CliError(f"no kubeconfig: {where} {DEFAULT_KUBECONFIG} does not exist; pass "
                   "--kubeconfig or set KUBECONFIG")


@dataclass
class Cluster:
    """A client and where it points: the defaults of `-n` and the words of every error."""

    client: Client
    namespace: str
    server: str
    context: str

    @property
    def where(self) -> str:
        return f"the Kubernetes API server at {self.server} (context {self.context})"

    @contextlib.contextmanager
    def calling(self, what: str, not_found: str | None = None) -> Iterator[None]:
        """Failures of `what` as CliErrors; a 404 as `not_found` when given."""
        try:
            yield
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach {self.where}: {exc or type(exc).__name__}") from None
        except ApiError as exc:
            if exc.status.code == 404 and not_found:
                raise CliError(f"{not_found} ({self.server})") from None
            raise CliError(f"{what}: {exc.status.message} ({self.server})") from None

    # ------------------------------------------------------------------ runs

    def run(self, name: str, namespace: str) -> dict[str, Any]:
        with self.calling(f"reading run {namespace}/{name}",
                          not_found=f'no run "{name}" in namespace "{namespace}"'):
            return _dict(self.client.get(MultiTurnRLRun, name, namespace=namespace))

    def runs(self, namespace: str | None) -> list[dict[str, Any]]:
        """The runs of one namespace, or of all when None."""
        with self.calling("listing runs", not_found=f"{self.server} does not serve "
                          f"multiturnrlruns.{GROUP} (are the CRDs installed?)"):
            found = self.client.list(MultiTurnRLRun, namespace=namespace or "*")
            return [_dict(r) for r in found]

    def watch_run(self, name: str, namespace: str) -> Iterator[dict[str, Any]]:
        """The run now, then again on every change; ends when it is deleted."""
        first = self.run(name, namespace)
        yield first
        version = first["metadata"]["resourceVersion"]
        with self.calling(f"watching run {namespace}/{name}"):
            for event, obj in self.client.watch(MultiTurnRLRun, namespace=namespace,
                                                fields={"metadata.name": name},
                                                resource_version=version,
                                                on_error=_resume_when_too_old):
                if event == "DELETED":
                    return
                yield _dict(obj)

    # ------------------------------------------------------------------ pods

    def pods(self, namespace: str, labels: dict[str, Any]) -> list[dict[str, Any]]:
        with self.calling(f"listing pods in {namespace}"):
            return [_dict(p) for p in self.client.list(Pod, namespace=namespace, labels=labels)]

    def config_maps(self, namespace: str, labels: dict[str, Any]) -> list[dict[str, Any]]:
        with self.calling(f"listing ConfigMaps in {namespace}"):
            return [_dict(c) for c in self.client.list(ConfigMap, namespace=namespace,
                                                       labels=labels)]

    def pod_log(self, pod: dict[str, Any], *, follow: bool = False,
                tail_lines: int | None = None) -> Iterator[str]:
        """Lines of the pod's default container (the first, unless kubectl's annotation names
        another), through the API server's pods/log, from the pod's node."""
        meta = pod["metadata"]
        container = (meta.get("annotations") or {}).get(DEFAULT_CONTAINER) or \
            pod["spec"]["containers"][0]["name"]
        with self.calling(f"reading the log of pod {meta['namespace']}/{meta['name']}",
                          not_found=f"pod {meta['namespace']}/{meta['name']} is gone"):
            yield from self.client.log(meta["name"], namespace=meta["namespace"],
                                       container=container, follow=follow,
                                       tail_lines=tail_lines)


def _resume_when_too_old(exc: Exception, count: int) -> OnErrorResult:
    """A watch longer than the API server keeps history (410 Gone) starts again from the
    object as it is now; any other failure ends it."""
    if isinstance(exc, ApiError) and exc.status.code == 410 and count <= 3:
        return OnErrorResult(OnErrorAction.RETRY)
    return OnErrorResult(OnErrorAction.RAISE)


def connect(args: argparse.Namespace) -> Cluster:
    """A client for the kubeconfig and context named by `add_arguments`' flags."""
    path = _kubeconfig_file(args.kubeconfig)
    try:
        config = KubeConfig.from_file(path) if path else KubeConfig.from_service_account()
        single = config.get(context_name=args.context)
        client = Client(single, field_manager="mtrl-cli")
    except ConfigError as exc:
        raise CliError(f"kubeconfig {path or 'of the ServiceAccount'}: {exc}") from None
    assert single is not None  # get() without a default raises rather than returning None
    namespace = getattr(args, "namespace", None) or single.namespace or "default"
    return Cluster(client, namespace, single.cluster.server, single.context_name)


def _dict(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
