"""Soak: cycle create -> run -> succeed -> delete on many runs for a fixed time, then check
that the operator's memory stayed flat and nothing leaked (issue 7; `make soak`).

The stack is the scale benchmark's: the local control plane, moto, one operator, PyTorchJob
trainers played by this script (Running at once, Succeeded 2-10 s later) and one ECS Fargate
worker per run in moto. `--concurrency` runs are alive at any time; a run is deleted once
it has Succeeded and been torn down, and a new one takes its place.

Memory is the operator's resident set (VmRSS), sampled every 15 s. "Start" is the first
sample after the warm-up (the first 10% of the soak: imports, caches and connection pools
fill up there); "end" is the last sample. After the last run is deleted, these must hold no
resource of any run: SQS queues, live ECS tasks, active task definitions, tagged live
resources, and the runs' Kubernetes children.

    python bench/soak.py --minutes 30 --concurrency 20
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx2
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Namespace
from scale_bench import PYTORCHJOB_CRD, REPO, TrainingOperator, memory_mib, run_manifest

from mtrl_operator.adapters.kube import MultiTurnRLRun
from mtrl_testbed import census
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import MotoServer
from mtrl_testbed.operator import OperatorProcess
from mtrl_testbed.ports import wait_until

NAMESPACE = "soak"
OPERATOR_ID = "soak"
SAMPLE_EVERY = 15.0


def leaks(cluster: LocalCluster) -> dict[str, list[str]]:
    """Everything of any run still in moto or the cluster (`mtrl_testbed.census`, whose
    every part is shown to find a planted leak in tests/testbed/test_census.py)."""
    return {**census.all_aws(OPERATOR_ID),
            **census.all_k8s(cluster, NAMESPACE, (*census.KINDS, "pytorchjobs.kubeflow.org"))}


def cycle(client: Client, subnet: str, group: str, seconds: float, concurrency: int,
          pid: int) -> tuple[int, list[tuple[float, float]]]:
    """Keep `concurrency` runs alive for `seconds`; returns (runs deleted, RSS samples)."""
    started, cycled, index = time.monotonic(), 0, 0
    samples: list[tuple[float, float]] = []
    next_sample = started
    while True:
        now = time.monotonic()
        if now >= next_sample:
            samples.append((now - started, memory_mib(pid, "VmRSS")))
            next_sample += SAMPLE_EVERY
        try:
            runs = list(client.list(MultiTurnRLRun, namespace=NAMESPACE))
        except ApiError as exc:  # e.g. 429 while the API server's watch cache refills
            print(f"listing runs failed, trying again: {exc}", file=sys.stderr, flush=True)
            time.sleep(1.0)
            continue
        live = 0
        for run in runs:
            status = run.status or {}
            resources = status.get("resources") or {}
            torn_down = not any(resources.get(k) for k in ("queues", "taskArns",
                                                           "trainerName"))
            if status.get("phase") in ("Succeeded", "Failed") and torn_down:
                if run.metadata.deletionTimestamp is None:
                    client.delete(MultiTurnRLRun, run.metadata.name, namespace=NAMESPACE)
                    cycled += 1
            elif run.metadata.deletionTimestamp is None:
                live += 1
        if now - started >= seconds:
            return cycled, samples
        for _ in range(concurrency - live):
            client.create(MultiTurnRLRun.from_dict(run_manifest(f"soak-{index}", subnet, group)),
                          namespace=NAMESPACE)
            index += 1
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "SOAK.md",
                        help="markdown result, included in BENCHMARKS.md by `make bench`")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mtrl-soak-"))
    cluster = LocalCluster(root).start()
    moto = MotoServer(log_path=root / "moto.log").start()
    operator = None
    try:
        os.environ.update(moto.env())
        cluster.install_crds(REPO / "crds")
        cluster.install_crds(PYTORCHJOB_CRD)
        subnet, group = moto.prepare_fargate()
        moto.bucket("bench-outputs")  # the runs' output bucket, which preflight checks
        client = Client(KubeConfig.from_file(str(cluster.kubeconfig)),
                        timeout=httpx2.Timeout(120))
        client.create(Namespace.from_dict({"metadata": {"name": NAMESPACE}}))
        operator = OperatorProcess(cluster, {**moto.env(), "MTRL_OPERATOR_ID": OPERATOR_ID,
                                             "MTRL_RESYNC_SECONDS": "30",
                                             "MTRL_SWEEP_INTERVAL_SECONDS": "60"},
                                   root / "operator.log").start()
        wait_until(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{operator.health_port}/healthz", timeout=2).status == 200,
            60, "operator liveness")
        assert operator.proc is not None
        rng = random.Random(7)
        TrainingOperator(client, NAMESPACE, succeed_after=lambda: rng.uniform(2, 10)).start()
        cycled, samples = cycle(client, subnet, group, args.minutes * 60, args.concurrency,
                                operator.proc.pid)
        # Drain: the last runs finish, are torn down and deleted.
        wait_until(lambda: not [r for r in client.list(MultiTurnRLRun, namespace=NAMESPACE)
                                if not r.metadata.deletionTimestamp
                                and (r.status or {}).get("phase") not in ("Succeeded", "Failed")],
                   300, "the last runs to finish")
        cycled += len(list(client.list(MultiTurnRLRun, namespace=NAMESPACE)))
        client.deletecollection(MultiTurnRLRun, namespace=NAMESPACE)
        wait_until(lambda: not list(client.list(MultiTurnRLRun, namespace=NAMESPACE)), 300,
                   "every run deleted")
        # Owned children go with their run through the garbage collector, a moment later.
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: not leaks(cluster), 60, "owned children to be collected")
        left = leaks(cluster)
        alive = operator.alive
    finally:
        if operator:
            operator.stop()
        moto.stop()
        cluster.stop()
    warm = [s for s in samples if s[0] >= 0.1 * args.minutes * 60] or samples
    start_mib, end_mib = warm[0][1], samples[-1][1]
    peak_mib = max(m for _, m in samples)
    grew = end_mib - start_mib
    flat = grew <= max(10.0, 0.1 * start_mib)
    result: dict[str, Any] = {
        "minutes": args.minutes, "concurrency": args.concurrency, "runs_cycled": cycled,
        "rss_start_mib": start_mib, "rss_end_mib": end_mib, "rss_peak_mib": peak_mib,
        "leaks": left, "operator_alive": alive, "flat": flat}
    print(json.dumps(result))
    table = (f"| minutes | concurrent runs | runs cycled | RSS after warm-up (MiB) | RSS at end "
             f"(MiB) | RSS peak (MiB) | leaked resources | operator alive |\n"
             f"|---:|---:|---:|---:|---:|---:|---:|---|\n"
             f"| {args.minutes:g} | {args.concurrency} | {cycled} | {start_mib:.1f} | "
             f"{end_mib:.1f} | {peak_mib:.1f} | {sum(len(v) for v in left.values())} | "
             f"{'yes' if alive else 'no'} |")
    print(table)
    args.out.write_text(
        f"## Soak (issue 7)\n\n`.venv/bin/python bench/soak.py --minutes {args.minutes:g} "
        f"--concurrency {args.concurrency}` on {dt.date.today()} (`make soak`)\n\n{table}\n\n"
        f"RSS samples every {SAMPLE_EVERY:.0f} s (seconds, MiB): "
        + ", ".join(f"{t:.0f}:{m:.1f}" for t, m in samples[::max(1, len(samples) // 12)])
        + (f"\n\nLeaks: {json.dumps(left)}\n" if left else "\n"))
    return 0 if flat and not left and alive else 1


if __name__ == "__main__":
    sys.exit(main())
