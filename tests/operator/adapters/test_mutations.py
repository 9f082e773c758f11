"""The leader fence and the failpoint sit on every mutating call, and on no read: checked in
child processes, since both end the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

KUBE = """
import asyncio, logging
logging.basicConfig(level=logging.INFO)
from mtrl_operator.adapters import mutations
from mtrl_operator.adapters.kube import Kube

class Client:
    async def create(self, obj): print("created", obj.metadata.name, flush=True)

kube = Kube(client=Client())
{setup}
async def main():
    for name in ("a", "b", "c"):
        await kube.create({{"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {{"name": name, "namespace": "ns"}}}})
asyncio.run(main())
"""

AWS = """
import logging
logging.basicConfig(level=logging.INFO)
import boto3
from mtrl_operator.adapters import mutations
from mtrl_operator.adapters.aws import client

sqs = client(boto3.session.Session(region_name="us-west-2", aws_access_key_id="x",
                                   aws_secret_access_key="x"), "sqs")
sqs.meta.events.register("before-send", lambda **_: print("sent", flush=True))
mutations.fence(lambda: False)
try:
    sqs.list_queues(QueueNamePrefix="mtrl-")   # a read: never fenced
except Exception as exc:
    print("read went out:", type(exc).__name__, flush=True)
sqs.create_queue(QueueName="mtrl-x")
print("not fenced", flush=True)
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # nothing listens there
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)


def test_the_failpoint_counts_kubernetes_writes() -> None:
    out = _run(KUBE.format(setup="mutations.arm_failpoint('2')"))
    assert out.returncode == 137, out.stderr
    assert out.stdout.split("\n")[:2] == ["created a", "created b"]
    assert "failpoint: exiting after step 2 (create ConfigMap b)" in out.stderr


def test_the_failpoint_matches_a_description() -> None:
    out = _run(KUBE.format(setup="mutations.arm_failpoint('ConfigMap c')"))
    assert out.returncode == 137 and out.stdout.count("created") == 3, out.stderr


def test_a_replica_that_lost_the_lease_writes_nothing_to_kubernetes() -> None:
    out = _run(KUBE.format(setup="mutations.fence(lambda: False)"))
    assert out.returncode == 1 and "created" not in out.stdout
    assert "not the leader any more; exiting before create ConfigMap a" in out.stderr


def test_a_replica_that_lost_the_lease_sends_no_mutating_aws_call_but_may_read() -> None:
    out = _run(AWS)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "read went out" in out.stdout and out.stdout.count("sent") >= 1
    assert "not the leader any more; exiting before sqs CreateQueue" in out.stderr
    assert "not fenced" not in out.stdout
