"""Failover: the chart installed with its default values (two replicas, leader election with
client-go's timings), the leader's container killed with SIGKILL, again and again.

For each kill: the takeover time (SIGKILL to the standby holding the Lease), the time until a
run created at the moment of the kill is Running, and how many trainer Jobs, ECS tasks, queues
and task-definition revisions each run has (exactly one Job, `maxReplicas` tasks, one set of
queues and one revision: nothing provisioned twice). The killed
container restarts and stands by, so the next kill hits the other replica.

    python bench/failover_bench.py --kills 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3

from mtrl_operator.naming import QUEUE_ROLES, RunNames
from mtrl_testbed import census, replicas
from mtrl_testbed.cluster import REPO_ROOT, LocalCluster
from mtrl_testbed.moto import EXECUTION_ROLE_ARN, MotoServer
from mtrl_testbed.ports import wait_until

CHART = REPO_ROOT / "charts" / "mtrl-operator"
RELEASE_NS, RUNS_NS = "mtrl-system", "failover"
LEASE = "mtrl-operator-default"  # the chart's default operator id
SELECTOR = "app.kubernetes.io/name=mtrl-operator"
HANG = ["python", "-c", "import time; time.sleep(3600)"]


def run_manifest(name: str, subnet: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun", "metadata": {"name": name},
        "spec": {
            "model": {"name": "random:tiny-qwen2"},
            "trainer": {"gpusPerNode": 0, "efaPerNode": 0, "command": HANG},
            "rollout": {"environment": "target"},
            "workers": {"backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1,
                        "maxReplicas": 2, "ecs": {"subnets": [subnet], "securityGroups": [group],
                                "executionRoleArn": EXECUTION_ROLE_ARN}},
            "dataset": {"inline": {"train": [{"target": "a"}]}},
            "output": {"s3Uri": "s3://bench-outputs/runs"},
        },
    }


def _run(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "mtrlrun", name, "-n", RUNS_NS, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _phase(cluster: LocalCluster, name: str) -> str | None:
    return ((_run(cluster, name) or {}).get("status") or {}).get("phase")


def _counts(cluster: LocalCluster, name: str) -> tuple[int, ...]:
    """(trainer Jobs, ECS tasks ever started, queues, task-definition revisions, attempts) of a
    run."""
    run = _run(cluster, name)
    assert run is not None
    uid = run["metadata"]["uid"]
    jobs = json.loads(cluster.kubectl("get", "jobs", "-n", RUNS_NS, "-l",
                                      f"mtrl.dev/run-uid={uid}", "-o", "json").stdout)["items"]
    names = RunNames(RUNS_NS, name, uid, "default")
    ecs = boto3.client("ecs")
    tasks = sum(len(ecs.list_tasks(cluster="default", startedBy=names.started_by,
                                   desiredStatus=s)["taskArns"]) for s in ("RUNNING", "STOPPED"))
    found = census.run_aws(names)
    return (len(jobs), tasks, len(found.get("queues", [])), len(found.get("task_definitions", [])),
            run["status"]["attempts"])


def _standbys_ready(cluster: LocalCluster) -> bool:
    pods = replicas.pods(cluster, RELEASE_NS, SELECTOR)
    return len(pods) == 2 and all(replicas.ready(p) for p in pods) and \
        replicas.holder_pod(cluster, RELEASE_NS, LEASE) in {p["metadata"]["name"] for p in pods}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mtrl-failover-"))
    cluster = LocalCluster(root).start()
    moto = MotoServer(log_path=root / "moto.log").start()
    rows = []
    try:
        os.environ.update(moto.env())
        (root / "pod-env.json").write_text(json.dumps(moto.env()))
        subnet, group = moto.prepare_fargate()
        moto.bucket("bench-outputs")  # the runs' output bucket, which preflight checks
        cluster.helm("install", "mtrl-operator", str(CHART), "-n", RELEASE_NS,
                     "--create-namespace", "--wait", "--timeout", "300s")
        cluster.kubectl("create", "namespace", RUNS_NS)
        wait_until(lambda: _standbys_ready(cluster), 120, "two Ready replicas and a leader")
        for i in range(args.kills):
            leader = replicas.holder_pod(cluster, RELEASE_NS, LEASE)
            before = f"before-{i}"
            cluster.kubectl("apply", "-n", RUNS_NS, "-f", "-",
                            input=json.dumps(run_manifest(before, subnet, group)))
            wait_until(lambda n=before: _phase(cluster, n) == "Running", 120, f"{before} Running")
            assert leader is not None
            killed_at = time.monotonic()
            replicas.kill(cluster, RELEASE_NS, leader)
            after = f"after-{i}"
            cluster.kubectl("apply", "-n", RUNS_NS, "-f", "-",
                            input=json.dumps(run_manifest(after, subnet, group)))
            wait_until(lambda old=leader: replicas.holder_pod(cluster, RELEASE_NS, LEASE)
                       not in (None, old), 120, "a new leader", interval=0.05)
            takeover = time.monotonic() - killed_at
            wait_until(lambda n=after: _phase(cluster, n) == "Running", 120, f"{after} Running",
                       interval=0.05)
            recovered = time.monotonic() - killed_at
            counts = [_counts(cluster, n) for n in (before, after)]
            rows.append((i + 1, takeover, recovered, counts))
            print(f"kill {i + 1}: takeover {takeover:.1f}s, new run Running after "
                  f"{recovered:.1f}s, (jobs, tasks, queues, revisions, attempts) {counts}", file=sys.stderr)
            wait_until(lambda: _standbys_ready(cluster), 120, "the killed replica standing by")
        cluster.kubectl("delete", "mtrlruns", "--all", "-n", RUNS_NS, "--timeout=180s")
        cluster.helm("uninstall", "mtrl-operator", "-n", RELEASE_NS, "--wait")
    finally:
        moto.stop()
        cluster.stop()
    once = all(c == (1, 2, len(QUEUE_ROLES), 1, 1) for *_, counts in rows for c in counts)
    takeovers = [r[1] for r in rows]
    print("| kill | takeover after SIGKILL (s) | run created at the kill Running after (s) | "
          "(Jobs, ECS tasks, queues, task-definition revisions, attempts) per run |")
    print("|---:|---:|---:|---|")
    for kill, takeover, recovered, counts in rows:
        print(f"| {kill} | {takeover:.1f} | {recovered:.1f} | "
              f"{', '.join(str(c) for c in counts)} |")
    print(f"| median | {statistics.median(takeovers):.1f} | "
          f"{statistics.median(r[2] for r in rows):.1f} | "
          f"{'each exactly once' if once else 'DUPLICATES'} |")
    return 0 if once else 1


if __name__ == "__main__":
    sys.exit(main())
