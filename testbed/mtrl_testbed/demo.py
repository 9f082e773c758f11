"""`make demo`: the whole product on a laptop, without Docker or AWS.

Starts the local control plane and moto, installs the CRDs, runs the operator, applies
manifests/examples/tiny-cpu.yaml, shows the run's progress until it finishes, and proves that
every ephemeral resource (queues, workers, trainer) is gone afterwards.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import boto3
import yaml

from mtrl_operator.naming import RunNames
from mtrl_testbed.cluster import REPO_ROOT, LocalCluster
from mtrl_testbed.moto import MotoServer
from mtrl_testbed.operator import OperatorProcess

EXAMPLE = REPO_ROOT / "manifests" / "examples" / "tiny-cpu.yaml"
TIMEOUT_S = 900


def _bar(step: int, total: int, width: int = 30) -> str:
    filled = int(width * step / total) if total else 0
    return "[" + "#" * filled + "." * (width - filled) + "]"


def main() -> int:
    out = REPO_ROOT / "out" / "demo"
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="mtrl-demo-"))
    print(f"== starting the local control plane in {root}")
    cluster = LocalCluster(root).start()
    moto = MotoServer(log_path=out / "moto.log").start()
    operator = None
    try:
        env = moto.env()
        (root / "pod-env.json").write_text(json.dumps(env))
        os.environ.update(env)
        cluster.install_crds(REPO_ROOT / "crds")
        run = yaml.safe_load(EXAMPLE.read_text())
        bucket = run["spec"]["output"]["s3Uri"].split("/")[2]
        boto3.client("s3").create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": env["AWS_REGION"]})
        print("== starting the operator")
        operator = OperatorProcess(cluster, {**env, "MTRL_LOG_FORMAT": "json"},
                                   out / "operator.log").start()
        print(f"== kubectl apply -f {EXAMPLE.relative_to(REPO_ROOT)}")
        cluster.kubectl("apply", "-f", str(EXAMPLE))
        name = run["metadata"]["name"]
        started, last = time.monotonic(), ""
        status: dict = {}
        while time.monotonic() - started < TIMEOUT_S:
            body = json.loads(cluster.kubectl("get", "mtrlrun", name, "-o", "json").stdout)
            status = body.get("status") or {}
            progress = status.get("progress") or {}
            line = (f"{status.get('phase', 'Pending'):<13} "
                    f"{_bar(progress.get('step', 0), progress.get('totalSteps', 0))} "
                    f"step {progress.get('display', '-'):>7}  reward "
                    f"{progress.get('rewardMean', float('nan')):.3f}  workers "
                    f"{(status.get('workers') or {}).get('display', '-')}")
            if line != last:
                print(line, flush=True)
                last = line
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            time.sleep(1)
        print(cluster.kubectl("get", "mtrlruns").stdout)
        names = RunNames("default", name, body["metadata"]["uid"])
        time.sleep(5)
        queues = boto3.client("sqs").list_queues(QueueNamePrefix=names.aws_prefix)
        pods = cluster.kubectl("get", "pods,jobs,deployments", "-l",
                               f"mtrl.dev/run-uid={names.uid}", "-o", "name").stdout.split()
        print("== what is left of the run's ephemeral resources")
        print(f"   SQS queues:               {len(queues.get('QueueUrls', []))}")
        print(f"   pods, Jobs, Deployments:  {len(pods)} {pods}")
        outputs = boto3.client("s3").list_objects_v2(Bucket=bucket).get("KeyCount", 0)
        print(f"   kept outputs in s3://{bucket}: {outputs} objects")
        print(f"== logs: {out}")
        return 0 if status.get("phase") == "Succeeded" and not pods else 1
    finally:
        if operator:
            operator.stop()
        moto.stop()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
