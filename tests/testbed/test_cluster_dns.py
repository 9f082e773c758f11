"""The test bed's cluster DNS: what it answers (the Kubernetes DNS specification's records for
Services and pod host names), how a rewrite reaches running containers, and pods on the local
control plane resolving a Service and a pod host name through libc and the image's nslookup."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.cluster_dns import (
    ClusterDNS,
    PodHost,
    PodRecord,
    ServiceRecord,
    answers,
    kubelet_hosts,
    pod_hostname,
)
from tests.operator.runs import wait_for

MASTER = PodRecord("job-master-0", "127.9.0.2", {"job": "j", "index": "0"}, ready=True)
WORKER = PodRecord("job-worker-0", "127.9.0.3", {"job": "j", "index": "1"}, ready=False)


def _headless(name: str, selector: dict[str, str], publish_not_ready: bool = False) -> ServiceRecord:
    return ServiceRecord(name, selector, headless=True, publish_not_ready=publish_not_ready)


def test_a_service_answers_its_ready_selected_pods_by_every_name_its_namespace_uses() -> None:
    lines = answers("team", [_headless("job-master-0", {"job": "j", "index": "0"}),
                             _headless("job-worker-0", {"job": "j", "index": "1"})],
                    [MASTER, WORKER])
    assert lines == [("127.9.0.2", ["job-master-0", "job-master-0.team", "job-master-0.team.svc",
                                    "job-master-0.team.svc.cluster.local"])]


def test_publish_not_ready_addresses_answers_pods_before_they_are_ready() -> None:
    lines = answers("team", [_headless("all", {"job": "j"}, publish_not_ready=True)],
                    [WORKER, MASTER])
    assert [ip for ip, _ in lines] == ["127.9.0.2", "127.9.0.3"]


def test_an_indexed_jobs_pods_answer_as_hostname_dot_subdomain() -> None:
    pods = [PodRecord(f"job-{i}-abcde", f"127.9.0.{i + 2}", {"job-name": "job"}, ready=True,
                      hostname=f"job-{i}", subdomain="job") for i in range(2)]
    lines = [(names[0], ip) for ip, names in answers(
        "team", [_headless("job", {"job-name": "job"})], pods)]
    assert lines == [("job", "127.9.0.2"), ("job", "127.9.0.3"), ("job-0.job", "127.9.0.2"),
                     ("job-1.job", "127.9.0.3")]
    # Host names need a headless Service named as the subdomain; a ClusterIP one answers only
    # its own name (with its endpoints: nothing routes ClusterIPs here).
    clusterip = ServiceRecord("job", {"job-name": "job"}, headless=False, publish_not_ready=False)
    assert [names[0] for _, names in answers("team", [clusterip], pods)] == ["job", "job"]


def test_a_service_without_a_selector_answers_nothing() -> None:
    assert answers("team", [_headless("external", {})], [MASTER]) == []


def test_each_pod_starts_from_the_kubelets_own_hosts_file() -> None:
    assert pod_hostname("x" * 62 + "-abc", None) == "x" * 62
    assert pod_hostname("job-0-abcde", "job-0") == "job-0"
    plain = kubelet_hosts("team", PodHost("127.9.0.2", "web-1"))
    assert plain.startswith("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n")
    assert plain.endswith("\n127.9.0.2\tweb-1\n")
    indexed = kubelet_hosts("team", PodHost("127.9.0.3", "job-0", "job",
                                            aliases=(("10.0.0.1", ("db", "db.local")),)))
    assert "\n127.9.0.3\tjob-0.job.team.svc.cluster.local\tjob-0\n" in indexed
    assert indexed.endswith("# Entries added by HostAliases.\n10.0.0.1\tdb\tdb.local\n")


MASTER_HOST = PodHost("127.9.0.2", "job-master-0")
MASTER_SERVICE = _headless("job-master-0", {"job": "j", "index": "0"})


def test_a_rewrite_reaches_a_file_already_mounted(tmp_path: Path) -> None:
    dns = ClusterDNS(tmp_path)
    dns.wrap("team", "uid-1", MASTER_HOST, ["true"])
    dns.wrap("team", "uid-2", PodHost("127.9.0.3", "job-worker-0"), ["true"])
    path = dns.path("team", "uid-2")
    inode = path.stat().st_ino
    dns.set_service("team", "job-master-0", MASTER_SERVICE)
    dns.set_pod("team", "uid-1", MASTER)
    assert "127.9.0.2\tjob-master-0 job-master-0.team " in path.read_text()
    dns.set_pod("team", "uid-1", None)
    assert "127.9.0.2" not in path.read_text() and path.stat().st_ino == inode
    dns.forget("team", "uid-1")
    assert not dns.path("team", "uid-1").exists() and path.exists()


def test_a_wrapped_command_has_the_pods_hostname_and_names_through_libc(tmp_path: Path) -> None:
    dns = ClusterDNS(tmp_path)
    if not dns.enabled:
        pytest.fail("unshare --mount --uts is refused here: the test bed needs root or "
                    "CAP_SYS_ADMIN")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(dns.wrap("team", "uid-2", PodHost("127.9.0.3", "job-worker-0"),
                                       list(argv)), capture_output=True, text=True, check=False)

    assert run("getent", "hosts", "job-master-0.team.svc.cluster.local").returncode == 2
    dns.set_service("team", "job-master-0", MASTER_SERVICE)
    dns.set_pod("team", "uid-1", MASTER)
    assert run("getent", "hosts", "job-master-0.team.svc.cluster.local").stdout.split()[0] == \
        "127.9.0.2"
    assert run("hostname").stdout.strip() == "job-worker-0"
    assert run("getent", "hosts", "job-worker-0").stdout.split()[0] == "127.9.0.3"
    # The machine's own name and /etc/hosts are untouched.
    assert "job-master-0" not in Path("/etc/hosts").read_text()
    assert subprocess.run(["hostname"], capture_output=True, text=True,
                          check=True).stdout.strip() != "job-worker-0"


@pytest.mark.cluster
def test_pods_resolve_a_service_and_a_pod_host_name(cluster: LocalCluster) -> None:
    """A server pod behind a headless Service (with hostname and subdomain, as an Indexed Job's
    pods have); a client whose init container waits with `nslookup` as Kubeflow's does, then
    connects by the Service's name and by the pod's host name."""
    server = ("import socket\ns = socket.create_server(('0.0.0.0', 9000))\n"
              "while True:\n    c, _ = s.accept(); c.sendall(b'hello'); c.close()")
    client = ("import socket, sys\nfor name in sys.argv[1:]:\n"
              "    print(name, socket.create_connection((name, 9000), timeout=10).recv(5))")
    with cluster.namespace(f"dns-{uuid.uuid4().hex[:6]}") as ns:
        pod = {"restartPolicy": "Never", "automountServiceAccountToken": False}
        objects = [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "echo", "namespace": ns},
             "spec": {"clusterIP": "None", "selector": {"app": "echo"},
                      "ports": [{"name": "echo", "port": 9000}]}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "server", "namespace": ns,
                                                             "labels": {"app": "echo"}},
             "spec": {**pod, "hostname": "echo-0", "subdomain": "echo", "containers": [
                 {"name": "main", "image": "local", "command": ["python", "-c", server]}]}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": ns},
             "spec": {**pod, "initContainers": [
                 {"name": "wait", "image": "alpine:3.10", "command": [
                     "sh", "-c", "err=1; for i in $(seq 100); do if nslookup echo; then "
                     "err=0 && break; fi; echo waiting; sleep 0.2; done; exit $err"]}],
                 "containers": [{"name": "main", "image": "local", "command": [
                     "python", "-c", client, "echo", f"echo.{ns}.svc.cluster.local",
                     "echo-0.echo", f"echo-0.echo.{ns}.svc"]}]}},
        ]
        for obj in objects:
            cluster.kubectl("create", "-f", "-", input=json.dumps(obj))

        def phase() -> str:
            return cluster.kubectl("get", "pod", "client", "-n", ns, "-o",
                                   "jsonpath={.status.phase}").stdout
        wait_for(lambda: phase() in ("Succeeded", "Failed"), 90, "the client pod to end")
        logs = cluster.kubectl("logs", "client", "-n", ns, check=False).stdout
        assert phase() == "Succeeded", logs
        assert logs.count("b'hello'") == 4, logs
        server_ip = cluster.kubectl("get", "pod", "server", "-n", ns, "-o",
                                    "jsonpath={.status.podIP}").stdout
        wait_log = cluster.kubectl("logs", "client", "-c", "wait", "-n", ns).stdout
        assert f"Address: {server_ip}" in wait_log, wait_log
