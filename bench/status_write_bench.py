"""What one MultiTurnRLRun status write costs the API server (issue 25).

A started run's status is written again and again, as the operator writes it (server-side
apply under its field manager, `force=True`) and as a JSON merge patch, with the CRD as
generated and with its CEL rules taken out: all of them, those under `spec`, or only the
eight at the root that keep the training spec immutable once the run has started. Each status
write makes the API server decode, default and validate the whole object (spec included: a
status write carries the stored spec, and `statusStrategy.ValidateUpdate` runs every CEL rule
again), run server-side apply's field manager, write it to etcd and send it to the watchers.
The figure is the CPU that kube-apiserver and etcd used (from /proc) over the writes, per
write. The variants run in turns, each `--rounds` times, so a machine that slows down part way
weighs on all of them.

    python bench/status_write_bench.py --writes 400 --rounds 2
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
import yaml
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.types import PatchType
from scale_bench import run_manifest  # the same run as the scale benchmark's

from mtrl_operator.adapters.kube import FIELD_MANAGER, MultiTurnRLRun
from mtrl_testbed.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "mtrl.dev_multiturnrlruns.yaml"
CLK_TCK = os.sysconf("SC_CLK_TCK")
NOW = "2026-12-05T11:29:05Z"
VARIANTS = ("as generated", "no root rules", "no spec rules", "no rules")
MODES = ("apply", "merge")


def running_status(step: int) -> dict[str, Any]:
    """A Running run's status as the operator writes it (fields of a traced run)."""
    def cond(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return {"type": type_, "status": status, "reason": reason, "message": message,
                "observedGeneration": 1, "lastTransitionTime": NOW}
    return {
        "phase": "Running", "message": f"training: step {step}/100", "attempts": 1,
        "failedAttempts": 0, "launchedAttempt": 1, "observedAttempt": 1,
        "observedGeneration": 1, "outputUri": "s3://bench-outputs/runs/x", "startTime": NOW,
        "conditions": [cond("Progressing", "True", "Training", f"step {step}/100"),
                       cond("Preflight", "True", "Passed", "checked S3 locations"),
                       cond("QueuesReady", "True", "QueuesCreated", ""),
                       cond("WorkersReady", "True", "WorkersReady", "1/1 workers ready"),
                       cond("TrainerReady", "True", "Running", "Running")],
        "cost": {"display": "0.0 GPU-h", "gpuHours": 0, "nodeSeconds": 0, "runningSince": NOW},
        "progress": {"collapseStreak": 0, "display": f"{step}/100", "step": step,
                     "totalSteps": 100},
        "resources": {
            "logGroup": "/mtrl/x", "trainerKind": "PyTorchJob", "trainerName": "r-t1",
            "taskArns": ["arn:aws:ecs:us-west-2:123456789012:task/default/0123456789abcdef"],
            "taskDefinitionArn": "arn:aws:ecs:us-west-2:123456789012:task-definition/x:1",
            "queues": [{"role": r, "url": f"https://sqs.us-west-2.amazonaws.com/1/x-{r}"}
                       for r in ("dlq", "generate", "result", "rollout")]},
        "workers": {"desired": 1, "display": "1/1", "ready": 1}}


def _strip_rules(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("x-kubernetes-validations", None)
        for value in node.values():
            _strip_rules(value)
    elif isinstance(node, list):
        for value in node:
            _strip_rules(value)


def crd_variant(crd: dict[str, Any], variant: str) -> dict[str, Any]:
    out = copy.deepcopy(crd)
    schema = out["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    if variant != "as generated":
        schema.pop("x-kubernetes-validations", None)  # the root's: immutability once started
    if variant == "no spec rules":
        _strip_rules(schema["properties"]["spec"])
    if variant == "no rules":
        _strip_rules(schema)  # spec's included
    return out


def _cpu(pids: dict[str, int]) -> float:
    total = 0.0
    for pid in pids.values():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def write_status(client: Client, name: str, mode: str, step: int) -> None:
    status = running_status(step)
    if mode == "apply":
        body = {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun",
                "metadata": {"name": name, "namespace": "default"}, "status": status}
        client.patch(MultiTurnRLRun.Status, name, body, namespace="default",
                     patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True)
    else:
        client.patch(MultiTurnRLRun.Status, name, {"status": status}, namespace="default",
                     patch_type=PatchType.MERGE)


def main(argv: list[str] | None = None) -> dict[tuple[str, str], list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=400, help="status writes per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="turns through every variant")
    args = parser.parse_args(argv)
    crd = yaml.safe_load(CRD.read_text())
    root = Path(tempfile.mkdtemp(prefix="mtrl-status-write-"))
    cluster = LocalCluster(root).start()
    results: dict[tuple[str, str], list[float]] = {}
    try:
        client = Client(KubeConfig.from_file(str(cluster.kubeconfig)),
                        timeout=httpx2.Timeout(60))
        pids = cluster.pids(("kube-apiserver", "etcd"))
        # A warm-up: the API server's first writes of a kind cost more than the rest.
        rounds = [("as generated", True)] + [(v, False) for _ in range(args.rounds)
                                             for v in VARIANTS]
        for i, (variant, warm_up) in enumerate(rounds):
            path = root / "crd.yaml"
            path.write_text(yaml.safe_dump(crd_variant(crd, variant)))
            cluster.install_crds(path)
            time.sleep(2)  # the API server takes up a changed schema a moment after it is stored
            name = f"run-{i}"
            client.create(MultiTurnRLRun.from_dict(run_manifest(name, "subnet-0123abcd", "sg-0123abcd")),
                          namespace="default")
            for mode in MODES:
                write_status(client, name, mode, 0)  # the variant's schema is in use
                before, start = _cpu(pids), time.monotonic()
                for step in range(1, args.writes + 1):
                    write_status(client, name, mode, step)
                per_write = 1000 * (_cpu(pids) - before) / args.writes
                wall = 1000 * (time.monotonic() - start) / args.writes
                print(f"{'warm-up ' if warm_up else ''}{variant:14s} {mode:5s} "
                      f"{per_write:6.2f} ms CPU/write, {wall:6.2f} ms wall/write", flush=True)
                if not warm_up:
                    results.setdefault((variant, mode), []).append(per_write)
    finally:
        cluster.stop()
    print("\n| CRD | write | kube-apiserver + etcd CPU per status write (ms), median "
          "of rounds | rounds |\n|---|---|---:|---|")
    for (variant, mode), values in results.items():
        print(f"| {variant} | {mode} | {statistics.median(values):.1f} | "
              f"{', '.join(f'{v:.1f}' for v in values)} |")
    return results


if __name__ == "__main__":
    main()
