"""moto in server mode on loopback: the AWS endpoint for tests and the demo.

boto3 reaches it through ``AWS_ENDPOINT_URL`` with dummy credentials, so the code under test
makes the same HTTP calls it would make to AWS.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mtrl_testbed.ports import ServerExited, free_port, wait_until

REGION = "us-west-2"


# The Fargate task execution role the test bed's workers name (moto does not check roles): the
# awslogs driver sends the workers' logs with it, so ECS refuses a Fargate task definition
# with awslogs and without one.
EXECUTION_ROLE_ARN = "arn:aws:iam::123456789012:role/mtrl-worker-execution"


@dataclass
class MotoServer:
    """moto's server as a child process bound to 127.0.0.1, started through `moto_main`
    (moto's answers, with three of its own costs taken out)."""

    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    """The address it listens on: the machine's own where pods of a real node (bridged, not
    on loopback) must reach it."""
    log_path: Path | None = None
    detached: bool = False  # a session of its own: it outlives its launcher (`up --operator`)
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self._proc is not None, "not started"
        return self._proc.pid

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3 (and child processes) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
        }

    def start(self, timeout: float = 60) -> MotoServer:
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "mtrl_testbed.moto_main", "-H", self.host, "-p", str(self.port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"},
            start_new_session=self.detached,
        )
        wait_until(self._ready, timeout, f"moto server on {self.endpoint}")
        return self

    def _ready(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise ServerExited(f"moto server exited with {self._proc.returncode}")
        with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2) as resp:
            return resp.status == 200

    def reset(self) -> None:
        """Forget every resource (moto's own reset API)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def keep_ecs_tasks_running(self) -> None:
        """moto advances an ECS task one status per DescribeTasks (RUNNING, DEACTIVATING, ...
        STOPPED), as if every worker crashed at once. Hold them at RUNNING, like healthy
        Fargate workers, until they are stopped."""
        body = json.dumps({"model_name": "ecs::task",
                           "transition": {"progression": "manual", "times": 10**9}}).encode()
        req = urllib.request.Request(f"{self.endpoint}/moto-api/state-manager/set-transition",
                                     data=body, method="POST")
        urllib.request.urlopen(req, timeout=10).close()

    def bucket(self, name: str) -> str:
        """An S3 bucket in the server's region, created unless it exists. Needs this server's
        env applied. Returns its name."""
        import boto3

        s3 = boto3.client("s3")
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=name,
                             CreateBucketConfiguration={"LocationConstraint": s3.meta.region_name})
        return name

    def prepare_fargate(self, cluster: str = "default") -> tuple[str, str]:
        """An ECS cluster, a subnet and a security group for Fargate tasks, with tasks held at
        RUNNING. Returns (subnet id, security group id). Needs this server's env applied."""
        import boto3

        self.keep_ecs_tasks_running()
        boto3.client("ecs").create_cluster(clusterName=cluster)
        ec2 = boto3.client("ec2")
        vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
        # moto's RunTask (awsvpc) crashes on a subnet whose VPC lacks DNS hostnames.
        ec2.modify_vpc_attribute(VpcId=vpc, EnableDnsHostnames={"Value": True})
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24")["Subnet"]["SubnetId"]
        group = ec2.create_security_group(GroupName=f"mtrl-workers-{cluster}",
                                          Description="reward workers", VpcId=vpc)["GroupId"]
        return subnet, group

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None


@contextlib.contextmanager
def aws_endpoint() -> Iterator[None]:
    """The AWS endpoint a benchmark talks to: $AWS_ENDPOINT_URL when set, else a moto server of
    its own (with its environment in os.environ) for the duration."""
    if "AWS_ENDPOINT_URL" in os.environ:
        yield
        return
    server = MotoServer().start()
    os.environ.update(server.env())
    try:
        yield
    finally:
        server.stop()
