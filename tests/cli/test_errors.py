"""What a person sees when something is missing: one line naming what and where, exit 1, no
traceback; and the commands as a kubectl plug-in."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.ports import free_port
from tests.cli.conftest import VENV_BIN, Result, make_run, mtrl_process

pytestmark = pytest.mark.cluster


def _one_line(result: Result, prog: str) -> str:
    assert result.code == 1 and result.out == "", result
    assert result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    assert result.err.startswith(f"{prog}: ")
    return result.err.removeprefix(f"{prog}: ").rstrip("\n")


def test_an_unknown_run(cluster: LocalCluster, cli_namespace: str) -> None:
    env = {"KUBECONFIG": str(cluster.kubeconfig)}
    said = _one_line(mtrl_process("watch", "nope", "-n", cli_namespace, env=env), "mtrl watch")
    assert said == f'no run "nope" in namespace "{cli_namespace}" ({cluster.server})'


def test_no_kubeconfig(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "KUBECONFIG": ""}
    said = _one_line(mtrl_process("runs", env=env), "mtrl runs")
    assert said == "no kubeconfig: $KUBECONFIG is unset and ~/.kube/config does not exist; " \
                   "pass --kubeconfig or set KUBECONFIG"
    missing = tmp_path / "nowhere.yaml"
    said = _one_line(mtrl_process("logs", "x", "--kubeconfig", str(missing), env=env), "mtrl logs")
    assert said == f"kubeconfig {missing} does not exist"


def test_an_unreachable_api_server(cluster: LocalCluster, tmp_path: Path) -> None:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    server = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    config["clusters"][0]["cluster"]["server"] = server
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    said = _one_line(mtrl_process("runs", "-A", env={"KUBECONFIG": str(kubeconfig)}), "mtrl runs")
    assert said.startswith(f"cannot reach the Kubernetes API server at {server} "
                           "(context mtrl-local): ")


def test_no_aws_credentials(cluster: LocalCluster, cli_namespace: str, tmp_path: Path) -> None:
    make_run(cluster, cli_namespace, "private", status={
        "phase": "Running", "outputUri": "s3://mtrl-private/runs/private"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"KUBECONFIG": str(cluster.kubeconfig), "HOME": str(tmp_path),
            "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_REGION": "us-west-2"}
    said = _one_line(mtrl_process("curve", "private", "-n", cli_namespace, env=env,
                                  inherit=False), "mtrl curve")
    assert said == "no AWS credentials for reading s3://mtrl-private/runs/private/metrics.jsonl: " \
                   "set AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"


def test_kubectl_runs_the_commands_as_a_plug_in(cluster: LocalCluster, cli_namespace: str) -> None:
    """`kubectl mtrl ...` finds `kubectl-mtrl` on PATH (kubectl takes no flags before a plug-in's
    name: the plug-in reads KUBECONFIG as kubectl would)."""
    make_run(cluster, cli_namespace, "plugged")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{cluster.env()['PATH']}",
           "KUBECONFIG": str(cluster.kubeconfig)}

    def kubectl(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(cluster.bin_dir / "kubectl"), *argv], capture_output=True,
                              text=True, env=env, timeout=60)

    listed = kubectl("mtrl", "runs", "-n", cli_namespace)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:2] for line in listed.stdout.splitlines()] == [["NAME", "PHASE"],
                                                                         ["plugged", "Pending"]]
    unknown = kubectl("mtrl", "watch", "nope", "-n", cli_namespace)
    assert unknown.returncode == 1
    assert unknown.stderr.startswith('kubectl mtrl watch: no run "nope"')
