"""Cluster DNS for pods run as processes: each container sees its own /etc/hosts and hostname.

In a cluster, a pod resolves Service and pod host names through the cluster's DNS (CoreDNS),
by the Kubernetes DNS specification (github.com/kubernetes/dns, docs/specification.md):

- `<service>.<ns>.svc.<zone>` answers the Service's ClusterIP, or for a headless Service
  (`clusterIP: None`) the addresses of its ready endpoints (all selected pods where the Service
  sets `publishNotReadyAddresses`);
- `<hostname>.<service>.<ns>.svc.<zone>` answers a pod whose `spec.hostname` and
  `spec.subdomain` name it and that a headless Service of that name selects (an Indexed Job's
  pods, `<job>-<index>.<service>`);
- the pod's resolv.conf searches `<ns>.svc.<zone>`, `svc.<zone>` and `<zone>`, so `<service>`
  and `<hostname>.<service>` resolve from the same namespace.

The kubelet gives each pod a hostname (`spec.hostname`, else the pod's name) and writes its
/etc/hosts: localhost, the pod's own address with its names, and `spec.hostAliases`
(pkg/kubelet/kubelet_pods.go, `managedHostsFileContent`).

The test bed has no DNS server, so the node agent writes each pod's hosts file as the kubelet
would and appends the DNS answers of its namespace, and runs each container in mount and UTS
namespaces of its own (`unshare --mount --uts`), with that file bind-mounted over /etc/hosts
and the pod's hostname set. glibc reads /etc/hosts on every lookup, so torch's c10d store and
its rendezvous (which looks for its own host name in the endpoint), gloo and Python all resolve
through it, and a file rewritten in place is seen at once. The differences from a cluster:

- A ClusterIP Service answers its endpoints' pod addresses, not its ClusterIP: nothing here
  routes ClusterIPs (no kube-proxy), and pods listen on their own loopback addresses. Ports
  are not remapped either: a Service whose `targetPort` differs from its `port` is not reachable.
- Names are written for the forms a pod of the same namespace uses (the short ones its search
  path completes, and the qualified ones); another namespace's Services are not listed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("mtrl.node-agent")

ZONE = "cluster.local"
# In new mount and UTS namespaces: the pod's hosts file over /etc/hosts, the pod's hostname, then
# the container's own command in the same process (exec), so its PID and signals are the
# container's.
_IN_POD = 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"'


@dataclass(frozen=True)
class ServiceRecord:
    name: str
    selector: Mapping[str, str]
    headless: bool
    publish_not_ready: bool


@dataclass(frozen=True)
class PodHost:
    """What the kubelet writes into a pod's own /etc/hosts."""

    ip: str
    hostname: str
    subdomain: str | None = None
    aliases: tuple[tuple[str, tuple[str, ...]], ...] = ()  # spec.hostAliases: (ip, hostnames)


@dataclass(frozen=True)
class PodRecord:
    name: str
    ip: str
    labels: Mapping[str, str]
    ready: bool
    hostname: str | None = None
    subdomain: str | None = None


def _selects(service: ServiceRecord, pod: PodRecord) -> bool:
    return bool(service.selector) and all(
        pod.labels.get(k) == v for k, v in service.selector.items())


def _names(short: str, namespace: str) -> list[str]:
    """The forms a pod of `namespace` can look `short` (a Service, or `<host>.<service>`) up by."""
    return [short, f"{short}.{namespace}", f"{short}.{namespace}.svc",
            f"{short}.{namespace}.svc.{ZONE}"]


def answers(namespace: str, services: Iterable[ServiceRecord],
            pods: Iterable[PodRecord]) -> list[tuple[str, list[str]]]:
    """(address, names) lines of one namespace's DNS, in a stable order."""
    pods = sorted(pods, key=lambda p: p.name)
    lines: list[tuple[str, list[str]]] = []
    for service in sorted(services, key=lambda s: s.name):
        selected = [p for p in pods if _selects(service, p)
                    and (p.ready or service.publish_not_ready)]
        lines += [(p.ip, _names(service.name, namespace)) for p in selected]
        if service.headless:
            lines += [(p.ip, _names(f"{p.hostname}.{service.name}", namespace))
                      for p in selected if p.hostname and p.subdomain == service.name]
    return lines


def pod_hostname(name: str, hostname: str | None) -> str:
    """The kubelet's choice (GeneratePodHostNameAndDomain): spec.hostname, else the pod's name
    cut to 63 characters without a trailing '-' or '.'."""
    return hostname or name[:63].rstrip("-.")


def kubelet_hosts(namespace: str, own: PodHost) -> str:
    """The kubelet's managed hosts file for one pod."""
    lines = ["# Kubernetes-managed hosts file.", "127.0.0.1\tlocalhost",
             "::1\tlocalhost ip6-localhost ip6-loopback", "fe00::0\tip6-localnet",
             "fe00::0\tip6-mcastprefix", "fe00::1\tip6-allnodes", "fe00::2\tip6-allrouters"]
    if own.subdomain:
        lines.append(f"{own.ip}\t{own.hostname}.{own.subdomain}.{namespace}.svc.{ZONE}\t"
                     f"{own.hostname}")
    else:
        lines.append(f"{own.ip}\t{own.hostname}")
    if own.aliases:
        lines.append("")
        lines.append("# Entries added by HostAliases.")
        lines += [f"{ip}\t{chr(9).join(names)}" for ip, names in own.aliases]
    return "\n".join(lines) + "\n"


def render(head: str, lines: list[tuple[str, list[str]]]) -> str:
    body = "".join(f"{ip}\t{' '.join(names)}\n" for ip, names in lines)
    return f"{head}# The cluster DNS's answers in this namespace (mtrl node agent)\n{body}"


class ClusterDNS:
    """The hosts files of one node agent's pods, from what it knows of Services and of the
    pods it runs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.services: dict[str, dict[str, ServiceRecord]] = {}  # namespace -> name -> record
        self.pods: dict[str, dict[str, PodRecord]] = {}  # namespace -> uid -> DNS record
        self.hosts: dict[str, dict[str, PodHost]] = {}  # namespace -> uid -> its own entries
        self._written: dict[Path, str] = {}
        self.enabled = _can_bind_hosts()

    def wrap(self, namespace: str, uid: str, own: PodHost, argv: list[str]) -> list[str]:
        """The command that runs `argv` as a container of that pod: with its hostname and its
        hosts file (written now, and rewritten as Services and pods change)."""
        if not self.enabled:
            return argv
        if self.hosts.setdefault(namespace, {}).get(uid) != own:
            self.hosts[namespace][uid] = own
            self._write(namespace)
        return ["unshare", "--mount", "--uts", "--propagation=private", "sh", "-c", _IN_POD,
                str(self.path(namespace, uid)), own.hostname, *argv]

    def path(self, namespace: str, uid: str) -> Path:
        return self.root / namespace / uid

    def forget(self, namespace: str, uid: str) -> None:
        """The pod is gone: its record and its file."""
        self.pods.get(namespace, {}).pop(uid, None)
        if self.hosts.get(namespace, {}).pop(uid, None) is not None:
            path = self.path(namespace, uid)
            self._written.pop(path, None)
            path.unlink(missing_ok=True)
        self._write(namespace)

    def set_service(self, namespace: str, name: str, record: ServiceRecord | None) -> None:
        services = self.services.setdefault(namespace, {})
        if record is None:
            services.pop(name, None)
        else:
            services[name] = record
        self._write(namespace)

    def set_pod(self, namespace: str, uid: str, record: PodRecord | None) -> None:
        pods = self.pods.setdefault(namespace, {})
        if record is None:
            pods.pop(uid, None)
        else:
            pods[uid] = record
        self._write(namespace)

    def _write(self, namespace: str) -> None:
        lines = answers(namespace, self.services.get(namespace, {}).values(),
                        self.pods.get(namespace, {}).values())
        for uid, own in self.hosts.get(namespace, {}).items():
            path = self.path(namespace, uid)
            text = render(kubelet_hosts(namespace, own), lines)
            if self._written.get(path) != text:
                _write_in_place(path, text)
                self._written[path] = text


def _write_in_place(path: Path, text: str) -> None:
    """Never by rename: each container's bind mount holds this file's inode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        data = text.encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _can_bind_hosts() -> bool:
    """Whether this process may make mount and UTS namespaces (root, or CAP_SYS_ADMIN)."""
    if shutil.which("unshare") is None:
        log.warning("no unshare(1): pods cannot resolve Service names")
        return False
    with contextlib.suppress(OSError):
        probe = subprocess.run(["unshare", "--mount", "--uts", "--propagation=private", "true"],
                               capture_output=True, text=True, timeout=10, check=False)
        if probe.returncode == 0:
            return True
        log.warning("pods cannot resolve Service names: unshare --mount: %s",
                    probe.stderr.strip())
    return False
