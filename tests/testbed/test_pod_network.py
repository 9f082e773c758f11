"""Two pods of one Deployment bind the same port, as in their own network namespaces."""

from __future__ import annotations

import os
import subprocess
import sys

from mtrl_testbed import node_agent
from mtrl_testbed.ports import free_port

SERVE = """
import socket, sys
s = socket.socket()
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print(s.getsockname()[0], flush=True)
sys.stdin.read()
"""


def test_wildcard_binds_land_on_the_pod_ip() -> None:
    port = free_port()
    pods = []
    try:
        for ip in ("127.251.0.2", "127.251.0.3"):
            env = {**os.environ, "MTRL_POD_IP": ip, "PYTHONPATH": str(node_agent.POD_NETWORK)}
            pod = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], env=env, text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
            pods.append(pod)
            assert pod.stdout is not None
            bound = pod.stdout.readline().strip()
            assert bound == ip, pod.stderr.read() if pod.stderr else bound
    finally:
        for pod in pods:
            pod.kill()
            pod.wait()
