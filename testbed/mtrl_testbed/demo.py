"""`make demo`: the whole product on a laptop, without Docker or AWS.

Starts the local control plane and moto, `helm install`s the chart (CRDs, RBAC, and the
operator, which the node agent runs as a process holding the chart ServiceAccount's token),
applies manifests/examples/tiny-cpu.yaml, shows the run's progress until it finishes, plots the
reward curve (in the terminal and as out/demo/reward.png), proves that every ephemeral resource
(queues, workers, trainer) is gone, and uninstalls the chart.
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

from mtrl_cli import chart, plot
from mtrl_operator.naming import LABEL_RUN_UID, RunNames
from mtrl_testbed import local
from mtrl_testbed.cluster import REPO_ROOT, LocalCluster
from mtrl_testbed.moto import MotoServer

EXAMPLE = local.EXAMPLE
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
    installed = False
    t0 = time.monotonic()
    try:
        os.environ.update(moto.env())
        run = yaml.safe_load(EXAMPLE.read_text())
        bucket = local.install(cluster, moto, root)
        installed = True
        print(f"== kubectl apply -f {EXAMPLE.relative_to(REPO_ROOT)}")
        cluster.kubectl("apply", "-f", str(EXAMPLE))
        name = run["metadata"]["name"]
        started, last = time.monotonic(), ""
        status: dict = {}
        rewards: dict[int, float] = {}
        while time.monotonic() - started < TIMEOUT_S:
            body = json.loads(cluster.kubectl("get", "mtrlrun", name, "-o", "json").stdout)
            status = body.get("status") or {}
            progress = status.get("progress") or {}
            if progress.get("step") and progress.get("rewardMean") is not None:
                rewards[progress["step"]] = progress["rewardMean"]
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
        if rewards:
            print("== reward curve (mean reward per step)")
            points = sorted(rewards.items())
            print("\n".join(chart.chart(points, width=60, height=8)))
            plot.line_chart(points, out / "reward.png", title="tiny-target: GRPO on CPU",
                            ylabel="mean reward")
            print(f"   also written to {out / 'reward.png'}")
        names = RunNames("default", name, body["metadata"]["uid"])
        time.sleep(5)
        queues = boto3.client("sqs").list_queues(QueueNamePrefix=names.aws_prefix)
        pods = cluster.kubectl("get", "pods,jobs,deployments", "-l",
                               f"{LABEL_RUN_UID}={names.uid}", "-o", "name").stdout.split()
        print("== what is left of the run's ephemeral resources")
        print(f"   SQS queues:               {len(queues.get('QueueUrls', []))}")
        print(f"   pods, Jobs, Deployments:  {len(pods)} {pods}")
        outputs = boto3.client("s3").list_objects_v2(Bucket=bucket).get("KeyCount", 0)
        print(f"   kept outputs in s3://{bucket}: {outputs} objects")
        print("== helm uninstall mtrl-operator (its pre-delete hook deletes the runs first)")
        cluster.helm("uninstall", "mtrl-operator", "-n", "mtrl-system", "--wait",
                     "--timeout", "300s")
        installed = False
        left = cluster.kubectl("get", "mtrlruns", "-A", "-o", "name").stdout.split()
        print(f"   runs left: {len(left)}")
        print(f"== done in {time.monotonic() - t0:.0f}s; operator and pod logs: {root}/pods")
        return 0 if status.get("phase") == "Succeeded" and not pods and not left else 1
    finally:
        if installed:
            cluster.helm("uninstall", "mtrl-operator", "-n", "mtrl-system", check=False)
        moto.stop()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
