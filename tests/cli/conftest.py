"""Runs whose status a test writes (no operator watches their namespaces), pods that stand in
for a run's trainer and workers, and the commands run as a person runs them."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from mtrl_testbed.cluster import LocalCluster
from tests.operator.runs import apply, get, run_manifest, wait_for

BUCKET = "mtrl-cli-outputs"
VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli_namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace that no test's operator watches (they watch `t-*` or their own), so
    its runs keep the status the test writes; with its default ServiceAccount, so pods can be
    created at once."""
    name = "cli-" + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    with cluster.namespace(f"{name}-{uuid.uuid4().hex[:6]}") as created:
        wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", created,
                                         check=False).returncode == 0, 30,
                 f"the default ServiceAccount of {created}", interval=0.2)
        yield created


def make_run(cluster: LocalCluster, namespace: str, name: str,
             status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    apply(cluster, namespace, run_manifest(name, **spec))
    if status:
        set_status(cluster, namespace, name, status)
    run = get(cluster, namespace, name)
    assert run is not None
    return run


def set_status(cluster: LocalCluster, namespace: str, name: str, status: dict[str, Any]) -> None:
    """Through the status subresource, as the operator writes it."""
    cluster.kubectl("patch", "mtrlrun", name, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": status}))


def make_pod(cluster: LocalCluster, run: dict[str, Any], name: str, script: str,
             component: str = "trainer", attempt: int = 1) -> None:
    """A pod labelled as the run's trainer (or worker) pod; the node agent runs `script`."""
    meta = run["metadata"]
    labels = {"mtrl.dev/run-uid": meta["uid"], "mtrl.dev/run-name": meta["name"],
              "mtrl.dev/component": component, "mtrl.dev/attempt": str(attempt)}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": meta["namespace"], "labels": labels},
           "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                    "containers": [{"name": component, "image": "local",
                                    "command": ["python", "-c", script]}]}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))


def pod_phase(cluster: LocalCluster, namespace: str, name: str) -> str:
    return cluster.kubectl("get", "pod", name, "-n", namespace, "-o",
                           "jsonpath={.status.phase}", check=False).stdout


def put_metrics(prefix: str, rewards: list[float]) -> str:
    """metrics.jsonl as the trainer writes it, under s3://BUCKET/<prefix>; the output URI."""
    s3 = boto3.client("s3")
    buckets = {b["Name"] for b in s3.list_buckets()["Buckets"]}
    if BUCKET not in buckets:
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={
            "LocationConstraint": s3.meta.region_name})
    body = "".join(json.dumps({"step": i + 1, "totalSteps": 3, "rewardMean": r}) + "\n"
                   for i, r in enumerate(rewards))
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/metrics.jsonl", Body=body.encode())
    return f"s3://{BUCKET}/{prefix}"


@pytest.fixture
def mtrl(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """`mtrl <command> ...` in this process, against the test bed's kubeconfig."""

    def run(command: str, *argv: str) -> Result:
        main = importlib.import_module(f"mtrl_cli.{command}").main
        code = main([*argv, "--kubeconfig", str(cluster.kubeconfig)])
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def buffered_env(**extra: str) -> dict[str, str]:
    """This process's environment without PYTHONUNBUFFERED, plus `extra`: a command that
    streams must flush its own output, as it must when a person pipes it."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, **extra}


def mtrl_process(*argv: str, env: dict[str, str], inherit: bool = True,
                 timeout: float = 60) -> Result:
    """`mtrl ...` as a person runs it: the console script, in its own process, with this
    process's environment and `env` (only `env` when not `inherit`)."""
    done = subprocess.run([str(VENV_BIN / "mtrl"), *argv], capture_output=True, text=True,
                          env={**os.environ, **env} if inherit else env, timeout=timeout)
    return Result(done.returncode, done.stdout, done.stderr)
