"""Operator overhead on the local control plane with moto (targets P1-P3 in bench/NOTES.md).

For each of N runs, one after another (ECS Fargate workers in moto are ready at once, so what
is measured is the operator, not worker start-up):

- apply -> trainer created: from `kubectl apply` returning to the trainer Job existing;
- trainer finished -> last resource deleted: from the Job's Complete condition to the moment
  no queue, task, task definition or trainer object of the run is left;
- GPU idle seconds caused by the operator: at the start, how long trainer pods ran before the
  workers were ready (the operator starts the trainer only after, so this should be 0); at the
  end, how long the finished trainer Job existed before the operator deleted it.

Timestamps are taken by this process, polling every 20 ms.

    python bench/operator_bench.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.batch_v1 import Job

from mtrl_operator.adapters.kube import MultiTurnRLRun
from mtrl_operator.naming import RunNames
from mtrl_testbed import census
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import EXECUTION_ROLE_ARN, MotoServer
from mtrl_testbed.operator import OperatorProcess

POLL = 0.02


def _run(name: str, subnet: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "model": {"name": "random:tiny-qwen2"},
            "trainer": {"gpusPerNode": 8, "efaPerNode": 0,
                        "command": ["python", "-c", "import time; time.sleep(2)"]},
            "rollout": {"environment": "target"},
            "workers": {"backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 2,
                        "maxReplicas": 2, "ecs": {"subnets": [subnet], "securityGroups": [group],
                                "executionRoleArn": EXECUTION_ROLE_ARN}},
            "dataset": {"inline": {"train": [{"target": "a"}]}},
            "output": {"s3Uri": "s3://bench-outputs/runs"},
        },
    }


def _until(check: Any, timeout: float = 120) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(POLL)
    raise TimeoutError(check)


def _complete(job: Job) -> bool:
    return any(c.type == "Complete" and c.status == "True"
               for c in (job.status.conditions or []))


def measure(client: Client, subnet: str, group: str, index: int) -> dict[str, float]:
    name = f"bench-{index}"
    t_apply = time.monotonic()
    run = client.create(MultiTurnRLRun.from_dict(_run(name, subnet, group)))
    names = RunNames("default", name, run.metadata.uid)
    job_name = names.trainer(1)

    def job() -> Job | None:
        try:
            return client.get(Job, job_name, namespace="default")
        except Exception:
            return None

    t_trainer = _until(lambda: job() is not None)
    _until(lambda: (j := job()) is not None and (j.status.ready or 0) > 0)
    wall_running = time.time()
    t_done = _until(lambda: (j := job()) is not None and _complete(j))
    t_job_gone = _until(lambda: job() is None)

    t_clean = _until(lambda: not census.run_aws(names))
    status = client.get(MultiTurnRLRun, name, namespace="default").status
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    ready_at = datetime.fromisoformat(conditions["WorkersReady"]["lastTransitionTime"])
    client.delete(MultiTurnRLRun, name, namespace="default")
    return {
        "apply_to_trainer_s": t_trainer - t_apply,
        "finished_to_clean_s": max(t_clean, t_job_gone) - t_done,
        # Trainer pods running before queues and workers were ready would hold idle GPUs.
        "gpu_idle_start_s": max(0.0, ready_at.timestamp() - wall_running),
        "gpu_idle_end_s": t_job_gone - t_done,
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mtrl-bench-"))
    cluster = LocalCluster(root).start()
    moto = MotoServer().start()
    operator = None
    try:
        os.environ.update(moto.env())
        cluster.install_crds(Path(__file__).resolve().parents[1] / "crds")
        subnet, group = moto.prepare_fargate()
        moto.bucket("bench-outputs")  # the runs' output bucket, which preflight checks
        operator = OperatorProcess(cluster, {**moto.env(), "MTRL_RESYNC_SECONDS": "30",
                                             "MTRL_SWEEP_INTERVAL_SECONDS": "0"},
                                   root / "operator.log").start()
        client = Client(KubeConfig.from_file(str(cluster.kubeconfig)))
        time.sleep(3)  # let the operator's watches start
        samples = [measure(client, subnet, group, i) for i in range(args.runs)]
    finally:
        if operator:
            operator.stop()
        moto.stop()
        cluster.stop()
    summary = {
        key: {"p50": statistics.median([s[key] for s in samples]),
              "p95": _pct([s[key] for s in samples], 0.95),
              "max": max(s[key] for s in samples)}
        for key in samples[0]
    }
    result = {"runs": args.runs, "summary": summary, "samples": samples}
    print(f"| figure (n={args.runs}) | p50 | p95 | max |\n|---|---:|---:|---:|")
    for key, row in summary.items():
        print(f"| {key} | {row['p50']:.2f} | {row['p95']:.2f} | {row['max']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
