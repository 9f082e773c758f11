"""`make dev-up` (`python -m mtrl_testbed up --operator`): the demo's setup left running for
work by hand, with exports that reach it; `down` stops all of it, moto included."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import boto3
import pytest

pytestmark = [pytest.mark.slow]


def _testbed(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mtrl_testbed", "--dir", str(root), *args],
                          capture_output=True, text=True, timeout=900)


def test_dev_up_leaves_the_operator_running_and_down_stops_everything(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    up = _testbed(root, "up", "--nodes", "1", "--operator")
    exports: dict[str, str] = dict(re.findall(r"^  export (\w+)=(.*)$", up.stdout, re.M))
    try:
        assert up.returncode == 0, (up.stdout + up.stderr)[-4000:]
        assert {"KUBECONFIG", "PATH", "AWS_ENDPOINT_URL", "AWS_REGION"} <= set(exports)
        env = {**os.environ, **exports,
               "PATH": exports["PATH"].replace("$PATH", os.environ["PATH"])}
        # What a person gets by pasting the exports: the chart's operator, Ready ...
        pods = json.loads(subprocess.run(
            ["kubectl", "get", "pods", "-n", "mtrl-system", "-o", "json"], env=env,
            capture_output=True, text=True, check=True).stdout)["items"]
        assert any(c["type"] == "Ready" and c["status"] == "True"
                   for p in pods for c in p["status"].get("conditions", [])), pods
        # ... and the example's output bucket on the moto server.
        s3 = boto3.client("s3", endpoint_url=exports["AWS_ENDPOINT_URL"],
                          region_name=exports["AWS_REGION"],
                          aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"])
        assert "mtrl-demo" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
        assert f"logs: control plane {root / 'logs'}" in up.stdout
    finally:
        down = _testbed(root, "down")
    assert down.stdout.strip() == "stopped", down.stdout + down.stderr
    with pytest.raises(OSError):  # moto went down with the cluster
        urllib.request.urlopen(f"{exports['AWS_ENDPOINT_URL']}/moto-api/", timeout=5)
