"""The node agent's kubelet log endpoint: its options, and `kubectl logs` through the API
server (current and previous start, byte limit, what it refuses, who may ask)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.container_logs import LogOptions, tail
from tests.operator.runs import wait_for


def test_options_read_as_the_kubelet_reads_them() -> None:
    assert LogOptions.parse({}) == LogOptions()
    assert LogOptions.parse({"follow": "true", "previous": "1", "tailLines": "3",
                             "limitBytes": "10"}) == LogOptions(True, True, 3, 10)
    assert LogOptions.parse({"timestamps": "false"}) == LogOptions()
    for refused in ({"follow": "yes"}, {"tailLines": "-1"}, {"tailLines": "x"},
                    {"limitBytes": "0"}, {"timestamps": "true"}, {"sinceSeconds": "5"}):
        with pytest.raises(ValueError):
            LogOptions.parse(refused)


def test_tail_counts_an_unfinished_last_line() -> None:
    assert tail(b"a\nb\nc\n", 2) == b"b\nc\n"
    assert tail(b"a\nb\nc", 1) == b"c"
    assert tail(b"a\n", 5) == b"a\n"
    assert tail(b"a\n", 0) == b""


@pytest.mark.cluster
def test_kubectl_logs_reads_the_current_and_the_previous_start(cluster: LocalCluster,
                                                               tmp_path: Path) -> None:
    marker = tmp_path / "started-once"
    script = (f"import os, sys\nfirst = not os.path.exists({str(marker)!r})\n"
              f"open({str(marker)!r}, 'a').close()\n"
              "print('first start' if first else 'second start')\nsys.exit(1 if first else 0)")
    with cluster.namespace(f"logs-{uuid.uuid4().hex[:6]}") as namespace:
        wait_for(lambda: cluster.kubectl("get", "sa", "default", "-n", namespace,
                                         check=False).returncode == 0, 30, "a ServiceAccount")
        cluster.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "twice", "namespace": namespace},
            "spec": {"restartPolicy": "OnFailure", "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "local",
                                     "command": ["python", "-c", script]}]}}))
        wait_for(lambda: cluster.kubectl("get", "pod", "twice", "-n", namespace, "-o",
                                         "jsonpath={.status.phase}").stdout == "Succeeded",
                 60, "the pod's second start to succeed", interval=0.2)

        def logs(*flags: str) -> tuple[int, str, str]:
            done = cluster.kubectl("logs", "twice", "-n", namespace, *flags, check=False)
            return done.returncode, done.stdout, done.stderr

        assert logs() == (0, "second start\n", "")
        assert logs("--previous") == (0, "first start\n", "")
        assert logs("--limit-bytes", "6") == (0, "second", "")
        code, _, err = logs("--timestamps")
        assert code == 1 and "timestamps are not recorded by the mtrl node agent" in err


@pytest.mark.cluster
def test_only_clients_of_the_cluster_ca_may_read_logs(cluster: LocalCluster) -> None:
    url = f"https://127.0.0.1:{cluster.kubelet_port}/containerLogs/default/nothing/main"
    pki = cluster.root / "pki"
    anonymous = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url, context=anonymous, timeout=10).read()
    client = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    client.load_cert_chain(str(pki / "apiserver-kubelet-client.crt"),
                           str(pki / "apiserver-kubelet-client.key"))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, context=client, timeout=10)
    assert refused.value.code == 404
    assert refused.value.read().decode() == 'pod "nothing" does not exist'
